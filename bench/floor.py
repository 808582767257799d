"""The floor (scenario F): a bare Redis Streams queue with S3's shape, to measure inferq against in the same run.

The client (this process) runs ``loops`` closed loops: ``XADD`` a job to a stream, ``BLPOP`` the job's own result
list, next. One worker process (``python -m bench.floor worker``) with a window: ``XREADGROUP`` as many entries
as it has free slots, per entry sleep the mock latency, then ``XACK`` and ``RPUSH`` the result in one round trip.
No job records, no HTTP, no leases, retries or guarantees: what the same Valkey build (same AOF setting as
``inferq up``: appendfsync everysec), the same client library (redis-py with hiredis) and the same event loop
cost at the least. Absolute figures are not comparable between runs on a shared machine; the ratio of inferq's S3
to the floor of the same invocation is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from . import clients, load
from .stack import ROOT, _cpu_s, _stop, _term_with_parent

STREAM = "floor:jobs"
GROUP = "floor"


def result_key(job_id: str) -> str:
    return f"floor:result:{job_id}"


async def worker(url: str, window: int, latency_ms: float) -> None:
    """Reads with a window of ``window`` in-flight jobs until SIGTERM."""
    import redis.asyncio as redis

    reader = redis.Redis.from_url(url)
    writer = redis.Redis.from_url(url, max_connections=window + 4)
    with contextlib.suppress(redis.ResponseError):  # BUSYGROUP: it exists
        await reader.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    inflight: set[asyncio.Task[None]] = set()
    free = asyncio.Semaphore(window)

    async def handle(entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        try:
            await asyncio.sleep(latency_ms / 1000)
            pipe = writer.pipeline(transaction=False)
            pipe.xack(STREAM, GROUP, entry_id)
            pipe.rpush(result_key(fields[b"id"].decode()), b"ok")
            await pipe.execute()
        finally:
            free.release()

    print("floor worker ready", flush=True)
    while True:
        await free.acquire()  # at least one free slot, then take as many as are free
        slots = 1
        while slots < window and not free.locked():
            await free.acquire()
            slots += 1
        response: Any = await reader.xreadgroup(GROUP, "w0", {STREAM: ">"}, count=slots, block=1000)
        got = [(entry_id, fields) for _, entries in response or [] for entry_id, fields in entries]
        for _ in range(slots - len(got)):
            free.release()
        for entry_id, fields in got:
            task = asyncio.create_task(handle(entry_id, fields))
            inflight.add(task)
            task.add_done_callback(inflight.discard)


async def closed_loop(url: str, n_jobs: int, loops: int, *, name: str = "F", deadline_s: float = 120.0,
                      wait_s: float = 20.0, progress: load.Progress | None = None) -> load.LoadResult:
    """``loops`` clients: XADD a job, BLPOP its result, next. Accounting as :func:`bench.load.closed_loop`."""
    import redis.asyncio as redis

    client = redis.Redis.from_url(url, max_connections=loops + 4)
    result = load._new_result(name, n_jobs)
    deadline = result.perf0 + deadline_s
    counter = iter(range(n_jobs))

    async def one_loop() -> None:
        for i in counter:
            if time.perf_counter() > deadline:
                return
            record = result.records[i]
            job_id = uuid.uuid4().hex
            record.t_submit = time.perf_counter()
            try:
                await client.xadd(STREAM, {"id": job_id, "body": '{"mock":{"latency_ms":5}}'})
                record.t_accepted = time.perf_counter()
                record.job_id = job_id
                popped = await client.blpop([result_key(job_id)], timeout=wait_s)
            except (redis.RedisError, OSError) as exc:
                result.fail(record, f"job #{i}: {type(exc).__name__}: {exc}")
                continue
            record.t_done = time.perf_counter()
            if popped is None:
                result.fail(record, f"job #{i}: no result within {wait_s:g}s")
            else:
                record.status = "succeeded"
            if progress is not None:
                progress(1)

    try:
        await load._bounded(result, [asyncio.create_task(one_loop()) for _ in range(loops)], deadline)
    finally:
        await client.aclose()
    return load._finalise(result)


class Floor:
    """Its own Valkey (the binary and AOF setting ``inferq up`` uses) and one floor worker process."""

    def __init__(self, window: int, latency_ms: float, log_dir: Path) -> None:
        from emulator.valkey import ValkeyProcess, free_port

        self.window = window
        self.latency_ms = latency_ms
        self.log_dir = log_dir
        self.data_dir = Path(tempfile.mkdtemp(prefix="inferq-floor-"))
        self.valkey = ValkeyProcess(self.data_dir / "valkey", port=free_port(), appendfsync="everysec",
                                    log_file=log_dir / "floor-valkey.log")
        self.url = self.valkey.url
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = log_dir / "floor-worker.log"

    def __enter__(self) -> Floor:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.valkey.start()
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.floor", "worker", "--url", self.url, "--window", str(self.window),
                 "--latency-ms", str(self.latency_ms)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_term_with_parent)
        deadline = time.monotonic() + 30
        while "floor worker ready" not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"the floor worker did not start: {self.log_path.read_text()[-800:]}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        _stop(self.process, timeout=10)
        self.valkey.stop()
        import shutil

        shutil.rmtree(self.data_dir, ignore_errors=True)

    def cpu_by_role(self) -> dict[str, float]:
        out = {"workers": _cpu_s(self.process.pid) if self.process else 0.0}
        pid = self.valkey.pid
        out["valkey"] = _cpu_s(pid) if pid else 0.0
        return out

    def describe(self) -> dict[str, Any]:
        return {"mode": "floor (bare Redis Streams, bench/floor.py)", "workers": 1, "window": self.window,
                "valkey": "emulator.valkey.ValkeyProcess, appendfsync everysec"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description="the floor's worker process")
    parser.add_argument("role", choices=("worker",))
    parser.add_argument("--url", required=True)
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--latency-ms", type=float, default=5.0)
    args = parser.parse_args(argv)
    clients.check_loopback(args.url.replace("redis://", "http://"))
    try:
        import uvloop

        uvloop.run(worker(args.url, args.window, args.latency_ms))
    except ImportError:
        asyncio.run(worker(args.url, args.window, args.latency_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
