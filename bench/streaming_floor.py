"""ST's floor (:mod:`bench.streaming`): a write of output as Valkey's own commands, no protocol at all, measured in
the same run as inferq's write so the two can be compared."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from redis.asyncio import RedisCluster

from inferq.queue.output import PAGE_ENTRIES
from inferq.queue.protocol import Queue

Phase = Callable[[Queue, Callable[[], Awaitable[Any]], frozenset[str]], Awaitable[float]]

FLOOR_ROUNDS = 8
"""Writes per stream in each floor run."""


async def floor_once(q: Queue, phase: Phase, streams: int, text_bytes: int) -> dict[str, float]:
    """The floor of a write of output, per stream: Valkey's own commands, no protocol. ``streams`` streams
    written once per round, each write a plain ``XADD`` (all of a round in one pipeline, as a worker's tick sends
    its jobs' writes together): with no reader (``write``), with one reader per stream blocked in ``XREAD`` and
    woken by it, then blocking again (``write_woken``: how readers follow their jobs today), and with one reader
    blocked on all the streams at once (``write_shared``: a reader shared by a gateway process's streams). Each
    reader reads from the last entry it saw, so a write that comes before its read is read at once, never missed
    (that read costs less than a wake: the floor errs low), and each write a plain ``XADD`` and a ``SPUBLISH`` of the
    same entry to one connection subscribed to all the streams' channels (``write_published``: how the front door's
    followers take it since the output feed). The 50 ms pause before each round's writes is counted
    too: the idle server's own ticks, about 0.2 k per write (errs high, by less than 1% of a woken write)."""
    keys = [f"{q.keys.out('floor')}-{i}" for i in range(streams)]
    piece = "x" * (text_bytes // 32)

    async def rounds(readers: str) -> None:
        await q.redis.delete(*keys)
        last = {k: "0-0" for k in keys}
        for r in range(FLOOR_ROUNDS):
            if readers == "each":
                reads = [asyncio.ensure_future(q.redis.xread({k: last[k]}, count=PAGE_ENTRIES, block=60_000))
                         for k in keys]
            elif readers == "shared":
                reads = [asyncio.ensure_future(q.redis.xread(dict(last), count=PAGE_ENTRIES, block=60_000))]
            else:
                reads = []
            await asyncio.sleep(0.05)  # the readers block first (mostly: see above)
            async with q.redis.pipeline(transaction=False) as pipe:
                for k in keys:
                    pipe.xadd(k, {"p": r * len(piece), "t": piece, "k": r + 1}, id=f"{r + 1}-1")
                    if readers == "published":
                        pipe.execute_command("SPUBLISH", k, f"{r + 1}-1\n{r * len(piece)}\n{r + 1}\n{piece}")
                await pipe.execute()
            await asyncio.gather(*reads)
            if readers == "published":
                got, deadline = 0, time.monotonic() + 30.0
                while got < len(keys):  # None: nothing yet, or a subscription's confirmation (ignored)
                    if time.monotonic() > deadline:
                        raise RuntimeError("a published write never reached its subscriber")
                    message = await (pubsub.get_sharded_message(timeout=1.0) if cluster
                                     else pubsub.get_message(timeout=1.0))
                    got += message is not None and message["type"] == "smessage"
            last = {k: f"{r + 1}-1" for k in keys}

    cluster = isinstance(q.redis, RedisCluster)
    pubsub = q.redis.pubsub(ignore_subscribe_messages=True)
    await pubsub.ssubscribe(*keys)
    writes = streams * FLOOR_ROUNDS
    try:
        out = {name: await phase(q, partial(rounds, readers), frozenset()) / writes
               for name, readers in (("write", "none"), ("write_woken", "each"), ("write_shared", "shared"),
                                     ("write_published", "published"))}
    finally:
        await pubsub.aclose()
    await q.redis.delete(*keys)
    return out
