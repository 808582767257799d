"""The floor (scenario F): a bare Redis Streams queue with S3's shape, to measure inferq against in the same run.

The client (this process) runs ``loops`` closed loops: ``XADD`` a job to a stream, ``BLPOP`` the job's own result
list, next. One worker process (``python -m bench.floor worker``) with a window: ``XREADGROUP`` as many entries
as it has free slots, per entry sleep the mock latency, then ``XACK`` and ``RPUSH`` the result in one round trip.
No job records, no HTTP, no leases, retries or guarantees: what the same Valkey build (same AOF setting as
``inferq up``: appendfsync everysec), the same client library (redis-py with hiredis) and the same event loop
cost at the least. Absolute figures are not comparable between runs on a shared machine; the ratio of inferq's S3
to the floor of the same invocation is.

The HTTP floor (``FH``, run with F): the same queue and worker behind the least an HTTP gateway can be here: a bare
ASGI callable (:func:`http_app`: no framework, no auth, no validation but parsing the body as JSON, no records)
under the gateway's own uvicorn settings and HTTP protocol, driven by S3's load generator (submit, then
``GET /v1/jobs/{id}?wait=`` blocking in ``BLPOP`` on the job's result list). What it costs beyond F is what two
HTTP requests per job cost on this machine with this server and client; what S3 costs beyond it is inferq's
gateway, protocol and guarantees.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from . import clients, load
from .stack import ROOT, _cpu_s, _stop, _term_with_parent, io_calls

HTTP_APP = "bench.floor:http_app"

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


_http_redis: Any = None


def _redis_of_app() -> Any:
    global _http_redis
    if _http_redis is None:
        import redis.asyncio as redis

        _http_redis = redis.Redis.from_url(os.environ["BENCH_FLOOR_REDIS_URL"], max_connections=1024)
    return _http_redis


async def _send(send: Any, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The HTTP floor's gateway (plain ASGI): ``POST /v1/jobs`` adds the job to the floor's stream (202, its id),
    ``GET /v1/jobs/{id}?wait=S`` blocks up to S seconds on its result list (200, ``succeeded`` once there),
    ``GET /healthz``. Enough of the API for S3's load generator to judge each job, nothing more."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path, method = scope["path"], scope["method"]
    if method == "POST" and path == "/v1/jobs":
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        json.loads(body)  # a gateway parses what it accepts
        job_id = uuid.uuid4().hex
        await _redis_of_app().xadd(STREAM, {"id": job_id, "body": body})
        await _send(send, 202, {"id": job_id, "object": "job", "status": "queued"})
    elif method == "GET" and path.startswith("/v1/jobs/"):
        job_id = path.removeprefix("/v1/jobs/")
        query = dict(pair.split("=", 1) for pair in scope["query_string"].decode().split("&") if "=" in pair)
        popped = await _redis_of_app().blpop([result_key(job_id)], timeout=float(query.get("wait", "0")) or 0.01)
        await _send(send, 200, {"id": job_id, "object": "job", "status": "succeeded" if popped else "queued",
                                "result": {"status_code": 200, "body": {}} if popped else None})
    elif path == "/healthz":
        await _send(send, 200, {"status": "ok"})
    else:
        await _send(send, 404, {"error": {"type": "not_found", "message": "not here"}})


def _spawn(module_args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``python -m <module_args>`` from the repository, its output in ``log_path``, ended with this process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", *module_args], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_term_with_parent)


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
        self.process = _spawn(["bench.floor", "worker", "--url", self.url, "--window", str(self.window),
                               "--latency-ms", str(self.latency_ms)], self.log_path)
        self._started(lambda: "floor worker ready" in self.log_path.read_text(errors="replace"), self.process,
                      "the floor worker", self.log_path)
        return self

    def _started(self, ready: Any, process: subprocess.Popen[bytes], what: str, log_path: Path) -> None:
        """Wait up to 30 s until ``ready()``; a process that exits or a timeout stops everything and raises."""
        deadline = time.monotonic() + 30
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"{what} did not start: {log_path.read_text()[-800:]}")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        _stop(self.process, timeout=10)
        self.valkey.stop()
        import shutil

        shutil.rmtree(self.data_dir, ignore_errors=True)

    def cpu_by_role(self) -> dict[str, float]:
        return {role: _cpu_s(pid) if pid else 0.0 for role, pid in self._pids().items()}

    def io_calls_by_role(self) -> dict[str, float]:
        return {role: io_calls(pid) if pid else 0.0 for role, pid in self._pids().items()}

    def _pids(self) -> dict[str, int | None]:
        return {"workers": self.process.pid if self.process else None, "valkey": self.valkey.pid}

    def describe(self) -> dict[str, Any]:
        return {"mode": "floor (bare Redis Streams, bench/floor.py)", "workers": 1, "window": self.window,
                "valkey": "emulator.valkey.ValkeyProcess, appendfsync everysec"}


class HttpFloor(Floor):
    """The floor, plus :func:`http_app` under uvicorn as ``inferq up`` runs the gateway (its HTTP protocol,
    no access log, uvloop): the HTTP floor's load generator is S3's, on ``url_http``."""

    def __init__(self, window: int, latency_ms: float, log_dir: Path) -> None:
        super().__init__(window, latency_ms, log_dir)
        from emulator.valkey import free_port

        self.port = free_port()
        self.url_http = f"http://127.0.0.1:{self.port}"
        self.gateway: subprocess.Popen[bytes] | None = None
        self.gateway_log = log_dir / "floor-http-gateway.log"

    def __enter__(self) -> HttpFloor:
        super().__enter__()
        self.gateway = _spawn(["uvicorn", HTTP_APP, "--host", "127.0.0.1", "--port", str(self.port),
                               "--no-server-header", "--no-access-log",
                               "--log-level", "warning"], self.gateway_log, {"BENCH_FLOOR_REDIS_URL": self.url})
        self._started(self._healthy, self.gateway, "the HTTP floor's gateway", self.gateway_log)
        return self

    def _healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.url_http}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def __exit__(self, *exc: object) -> None:
        _stop(self.gateway, timeout=10)
        super().__exit__()

    def _pids(self) -> dict[str, int | None]:
        return {**super()._pids(), "gateway": self.gateway.pid if self.gateway else None}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "mode": "HTTP floor (bare ASGI under uvicorn + the floor, bench/floor.py)",
                "gateway": f"uvicorn {HTTP_APP}, the gateway's HTTP protocol"}


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
