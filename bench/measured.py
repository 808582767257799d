"""Measuring a load run against a stack: this process's CPU, each role's CPU and system calls and Valkey's command
statistics over the run (:func:`measured`), and each Lua script's share of Valkey's time over a sample batch
(:func:`script_sample`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from . import load, valkeystats
from .summary import cpu_delta


@contextlib.contextmanager
def measured(
    redis_url: str, cpu_by_role: Callable[[], dict[str, float]], io_calls_by_role: Callable[[], dict[str, float]],
) -> Iterator[Callable[[load.LoadResult], None]]:
    """Around one load run: ``finish(result)``, called when it ends, gives the result this process's CPU, the CPU
    of each role of the system under test (and their read and write system calls), and Valkey's command stats,
    all over the run."""
    sampler = valkeystats.Sampler(redis_url)
    try:
        stats0, roles0, io0, cpu0 = sampler.snapshot(), cpu_by_role(), io_calls_by_role(), time.process_time()

        def finish(result: load.LoadResult) -> None:
            result.client_cpu_s = time.process_time() - cpu0
            result.cpu_by_role = cpu_delta(roles0, cpu_by_role(), result.client_cpu_s)
            io = io_calls_by_role()
            result.io_calls_by_role = {role: io[role] - io0.get(role, 0.0) for role in io}
            result.commandstats = valkeystats.delta(stats0, sampler.snapshot())

        yield finish
    finally:
        sampler.close()


async def script_sample(redis_url: str, run: Callable[[], Awaitable[load.LoadResult]]) -> dict[str, Any]:
    """A short unmeasured batch (``run``) watched two ways: the slow log recording every command gives each
    script's share of the EVALSHA time (INFO commandstats has no per-script figures), and MONITOR tells the commands
    that clients send themselves from those that scripts call (both are counted under one name by INFO
    commandstats)."""
    import redis.asyncio as aioredis

    sampler = valkeystats.Sampler(redis_url)
    monitored: list[dict[str, Any]] = []
    watcher = aioredis.Redis.from_url(redis_url)

    async def watch() -> None:
        async with watcher.monitor() as monitor:
            async for line in monitor.listen():
                monitored.append(line)

    try:
        saved = sampler.slowlog_on()
        watching = asyncio.create_task(watch())
        await asyncio.sleep(0.2)  # MONITOR is on before the first job
        try:
            sample = await run()
        finally:
            watching.cancel()
            with contextlib.suppress(BaseException):
                await watching
            entries = sampler.slowlog_off(saved)
    finally:
        sampler.close()
        with contextlib.suppress(Exception):
            await watcher.aclose()
    names = valkeystats.names_by_sha()
    jobs = max(sample.done, 1)
    return {"jobs": sample.done,
            "usec_share": {k: round(v, 4) for k, v in valkeystats.script_shares(entries, names).items()},
            "calls_per_job": {k: round(v / jobs, 3) for k, v in valkeystats.script_calls(entries, names).items()},
            "direct_share": {k: round(v, 4) for k, v in valkeystats.direct_shares(monitored).items()},
            "basis": "SLOWLOG (slowlog-log-slower-than 0) and MONITOR over an unmeasured batch after the runs"}
