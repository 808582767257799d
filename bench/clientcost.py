"""The client's side of a round trip: CPU of this process per Redis command, inferq's client against the floor.

The gateway and the workers spend most of their CPU per job in Python, and a good part of it around their Redis
round trips (connection pool, retries, timeouts, parsing). This puts a number on it: the CPU time (``process_time``,
this process only: the server's is K's other figures) of one round trip of the gateway's job read (``HMGET`` of the
record's fields but the body), made one after another on an event loop like the services' (uvloop when installed):

- ``inferq``: through :func:`inferq.connection.connect` (redis-py with hiredis, the pool, inferq's timeouts and
  retry), as the gateway and workers make it;
- ``floor``: asyncio streams and a hiredis reader on one connection, under an ``asyncio.timeout`` as a service
  needs one: what any Python client must spend at least.

Median of ``repeats`` runs of ``n`` round trips each, after a warm-up.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import hiredis

from inferq.connection import connect
from inferq.jobs import RECORD_FIELDS_BUT_BODY
from inferq.settings import Settings

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
    return (f"client CPU per Redis round trip (the gateway's job read): inferq's client {inferq['median']:.0f} µs "
            f"({inferq['min']:.0f}-{inferq['max']:.0f}), asyncio streams + hiredis {floor['median']:.0f} µs "
            f"({floor['min']:.0f}-{floor['max']:.0f}): {figures['ratio']:.1f}x")
