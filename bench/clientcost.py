"""The client's side of a round trip: CPU of this process per Redis command, inferq's client against the floor.

The gateway and the workers spend most of their CPU per job in Python, and a good part of it around their Redis
round trips (connection pool, retries, timeouts, parsing). This puts a number on it: the CPU time (``process_time``,
this process only: the server's is K's other figures) of one round trip of the gateway's job read (``HMGET`` of the
record's fields but the body), made one after another on an event loop like the services' (uvloop when installed):

- ``inferq``: through :func:`inferq.redis.connection.connect` (redis-py with hiredis, the pool, inferq's timeouts and
  retry), as the gateway and workers make it;
- ``floor``: asyncio streams and a hiredis reader on one connection, under an ``asyncio.timeout`` as a service
  needs one: what any Python client must spend at least.

Median of ``repeats`` runs of ``n`` round trips each, after a warm-up.

CPU time on a shared machine moves by up to 2x between hours, so the same round trips are also counted in client
instructions under ``valgrind --tool=callgrind`` (:func:`instructions`; repeatable run after run): a process makes
``small`` and then ``large`` round trips, and the difference of the two totals over ``large - small`` is one round
trip's, without the interpreter's start. Counted for inferq's standalone client, its cluster-mode client (the mode
ElastiCache Serverless always runs in) and the floor, and for the round trip a worker starts a job with (a script
call and the record's read, pipelined) through inferq's client and written bare. The kernel's socket work is not
counted.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import hiredis

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.jobs import RECORD_FIELDS_BUT_BODY
from inferq.redis.connection import connect, pipelined

KEY = "bench:clientcost:job"
RECORD = {"id": "job_bench", "status": "succeeded", "tenant": "bench", "attempts": "1", "created_at": "1",
          "result": '{"status_code":200,"body":{"ok":true}}'}


async def _cpu_per_call(call: Callable[[], Awaitable[Any]], n: int, repeats: int) -> list[float]:
    for _ in range(min(n, 200)):
        await call()
    runs = []
    for _ in range(repeats):
        started = time.process_time()
        for _ in range(n):
            await call()
        runs.append((time.process_time() - started) / n * 1e6)
    return runs


async def _measure(url: str, host: str, port: int, n: int, repeats: int) -> dict[str, list[float]]:
    client = connect(Settings(redis_url=url))
    try:
        await client.hset(KEY, mapping=RECORD)
        fields = list(RECORD_FIELDS_BUT_BODY)
        inferq = await _cpu_per_call(lambda: client.hmget(KEY, fields), n, repeats)
        expected = await client.hmget(KEY, fields)
    finally:
        await client.aclose()
    reader, writer = await asyncio.open_connection(host, port)
    parser = hiredis.Reader(encoding="utf-8")
    packed = hiredis.pack_command(("HMGET", KEY, *fields))  # type: ignore[arg-type]  # str args are fine

    async def floor() -> Any:
        async with asyncio.timeout(5):
            writer.write(packed)
            while (reply := parser.gets()) is False:
                parser.feed(await reader.read(65536))
            return reply

    try:
        if await floor() != expected:
            raise RuntimeError("the floor's read does not answer what inferq's client does")
        return {"inferq": inferq, "floor": await _cpu_per_call(floor, n, repeats)}
    finally:
        writer.close()


def measure(url: str, host: str, port: int, n: int = 3000, repeats: int = 5) -> dict[str, Any]:
    """The figures, from a fresh event loop (uvloop when installed, as the services run)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency of the services
        runs = asyncio.run(_measure(url, host, port, n, repeats))
        loop = "asyncio"
    else:
        runs = uvloop.run(_measure(url, host, port, n, repeats))
        loop = "uvloop"
    figures: dict[str, Any] = {"method": f"{n} HMGET round trips of the job read, one after another, {loop}, "
                                         f"process CPU, median of {repeats}"}
    for name, values in runs.items():
        figures[f"{name}_us"] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    figures["ratio"] = figures["inferq_us"]["median"] / figures["floor_us"]["median"]
    return figures


def render(figures: dict[str, Any]) -> str:
    inferq, floor = figures["inferq_us"], figures["floor_us"]
    line = (f"client CPU per Redis round trip (the gateway's job read): inferq's client {inferq['median']:.0f} µs "
            f"({inferq['min']:.0f}-{inferq['max']:.0f}), asyncio streams + hiredis {floor['median']:.0f} µs "
            f"({floor['min']:.0f}-{floor['max']:.0f}): {figures['ratio']:.1f}x")
    counted = figures.get("instructions")
    if not counted:
        return line
    if "skipped" in counted:
        return f"{line}; client instructions: not measured ({counted['skipped']})"
    k = counted["kinstructions_per_round_trip"]
    return (f"{line}; in client instructions (callgrind, repeatable): inferq {k['inferq']:.0f} k, cluster mode "
            f"{k['inferq_cluster']:.0f} k, asyncio streams + hiredis {k['floor']:.0f} k: "
            f"{counted['ratio_to_floor']:.1f}x; a script call and a record read in one round trip (the worker's "
            f"start): inferq {k['inferq_pipeline']:.0f} k, bare {k['floor_pipeline']:.0f} k: "
            f"{counted['pipeline_ratio_to_floor']:.1f}x")


# --- the same round trips in client instructions (callgrind) ---

KINDS = ("inferq", "inferq_cluster", "floor", "inferq_pipeline", "floor_pipeline")
_COLLECTED = re.compile(r"Collected : (\d+)")


_SCRIPT = "return 0"
_SCRIPT_SHA = hashlib.sha1(_SCRIPT.encode()).hexdigest()  # Redis names scripts by SHA-1
_SCRIPT_ARGS = ("1-1", "worker-1", 1764547200000, 3, 86400, 10000, "0", "lease-token-0123456789")
"""A script call shaped like the worker's ``start`` (a key and eight arguments); the script itself does nothing:
the client's work is in the packing and the replies, not in what the server runs."""


def _commands(kind: str, key: str) -> list[tuple[Any, ...]]:
    if kind.endswith("_pipeline"):  # the worker's start round trip: a script call and the record's read
        return [("EVALSHA", _SCRIPT_SHA, 1, key, *_SCRIPT_ARGS), ("HGETALL", key)]
    return [("HMGET", key, *RECORD_FIELDS_BUT_BODY)]  # the gateway's job read


SLOW_TIMEOUT_S = 60.0
"""The timeouts of the round trips run under callgrind (some 50x slower, more on a loaded machine: the default
2 s once timed out connecting). Their length costs no instructions; only that there is one is measured."""


async def _round_trips(kind: str, url: str, calls: int) -> None:
    """``calls`` round trips of one client, untimed: what :func:`instructions` runs under callgrind. ``kind``:
    ``inferq``, ``inferq_cluster`` or ``floor`` (the job read), ``inferq_pipeline`` or ``floor_pipeline`` (a script
    call and a record read in one round trip, as the worker starts a job)."""
    key = "{bench}:clientcost:job" if kind == "inferq_cluster" else KEY
    commands = _commands(kind, key)
    if kind.startswith("floor"):
        host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        parser = hiredis.Reader(encoding="utf-8")
        packed = b"".join(hiredis.pack_command(command) for command in commands)  # type: ignore[arg-type]
        for _ in range(calls):
            async with asyncio.timeout(SLOW_TIMEOUT_S):
                writer.write(packed)
                for _ in commands:
                    while parser.gets() is False:
                        parser.feed(await reader.read(65536))
        writer.close()
        return
    client = connect(Settings(redis_url=url, redis_timeout_s=SLOW_TIMEOUT_S))
    await client.hset(key, mapping=RECORD)
    if kind == "inferq_pipeline":
        await client.script_load(_SCRIPT)
        for _ in range(calls):
            await pipelined(client, commands)  # what Scripts.many_then sends
    else:
        fields = list(RECORD_FIELDS_BUT_BODY)
        for _ in range(calls):
            await client.hmget(key, fields)
    await client.aclose()


def _collected(kind: str, url: str, calls: int) -> int:
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-m",
               "bench.clientcost", "--kind", kind, "--url", url, "--calls", str(calls)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parent.parent, env={**os.environ, "PYTHONHASHSEED": "0"})
    match = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"callgrind run of {kind} failed ({done.returncode}): {done.stderr[-500:]}")
    return int(match.group(1))


def instructions(small: int = 200, large: int = 1200) -> dict[str, Any]:
    """Client instructions per round trip (thousands) of inferq's standalone and cluster-mode clients and the floor
    (the job read), and of inferq's pipeline and the floor's for a script call with a record read; each from two
    callgrind runs; or why not measured."""
    if shutil.which("valgrind") is None:
        return {"skipped": "valgrind not installed (Debian: apt install valgrind)"}
    per_trip: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, ValkeyProcess(Path(tmp) / "s", appendfsync=None) as server, \
            ValkeyProcess(Path(tmp) / "c", cluster=True, appendfsync=None) as cluster:
        asyncio.run(_round_trips("inferq_pipeline", server.url, 1))  # the record and the script the floor uses
        for kind, url in (("inferq", server.url), ("inferq_cluster", cluster.url), ("floor", server.url),
                          ("inferq_pipeline", server.url), ("floor_pipeline", server.url)):
            counts = [_collected(kind, url, calls) for calls in (small, large)]
            per_trip[kind] = round((counts[1] - counts[0]) / (large - small) / 1000, 1)
    return {
        "method": f"{small} and {large} HMGET round trips of the job read, each in its own process under valgrind "
                  "--tool=callgrind; the difference over the extra round trips; thousands of instructions",
        "kinstructions_per_round_trip": per_trip,
        "ratio_to_floor": round(per_trip["inferq"] / per_trip["floor"], 2),
        "pipeline_ratio_to_floor": round(per_trip["inferq_pipeline"] / per_trip["floor_pipeline"], 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="round trips of the job read, for a callgrind count")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--calls", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency of the services
        asyncio.run(_round_trips(args.kind, args.url, args.calls))
    else:
        uvloop.run(_round_trips(args.kind, args.url, args.calls))


if __name__ == "__main__":
    main()
