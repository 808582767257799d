"""The queue's upkeep that every worker shares in, in one background task per worker.

Each :data:`MAINTENANCE_S`: the heartbeat (every :data:`HEARTBEAT_S`, with the count of jobs held) and the fleet
record with it (:class:`~gpu_worker.fleet.Fleet`), the promotion of retries whose backoff is over (each into its
own lane), the expiry of jobs past their ``ttl_s`` that no attempt started (a full window would otherwise keep them
queued), and every :data:`PRUNE_EVERY_S` the removal of what dead workers left behind.

A Redis fault is waited out (counted, retried at the next turn); anything else ends :meth:`Maintenance.run` with
the exception, and the worker, which supervises it, stops.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from redis.exceptions import ResponseError

from inferq.queue.keys import GROUP, WEBHOOK_GROUP
from inferq.queue.protocol import Queue
from inferq.redis.faults import FaultRun

from .fleet import Fleet

MAINTENANCE_S = 0.5
HEARTBEAT_S = 1.0
PRUNE_EVERY_S = 300.0
GONE_AFTER_S = 3600.0


class Maintenance:
    """``held()`` is how many jobs the worker holds (its heartbeat says so); ``faults(what)`` the fault bookkeeping
    of the task."""

    def __init__(self, queue: Queue, worker_id: str, fleet: Fleet, held: Callable[[], int],
                 faults: Callable[[str], FaultRun]) -> None:
        self.queue = queue
        self.id = worker_id
        self.fleet = fleet
        self._held = held
        self._faults = faults

    async def run(self, stop: asyncio.Event) -> None:
        last_beat = 0.0
        last_prune = time.monotonic()
        faults = self._faults("maintenance failed")
        while not stop.is_set():
            delay = MAINTENANCE_S
            try:
                if time.monotonic() - last_beat >= HEARTBEAT_S:
                    await self.beat()
                    last_beat = time.monotonic()
                await self.promote_and_expire()
                if time.monotonic() - last_prune >= PRUNE_EVERY_S:
                    last_prune = time.monotonic()
                    await self.prune()
                faults.succeeded()
            except Exception as exc:  # absorb() re-raises what is not a Redis fault: the task dies
                delay = max(delay, await faults.absorb(exc))
            await asyncio.sleep(delay)

    async def beat(self) -> None:
        """The heartbeat, with the jobs held, and the fleet record."""
        await self.queue.heartbeat(self.id, self._held())
        await self.fleet.check()

    async def promote_and_expire(self, *, limit: int = 100) -> None:
        """Due retries back into their lanes (up to ten batches a turn), then the jobs past their ``ttl_s``."""
        for _ in range(10):
            if await self.queue.promote(limit=limit) < limit:
                break
        await self.queue.expire_due(limit=limit)

    async def prune(self, *, gone_after_s: float = GONE_AFTER_S) -> None:
        """Forget workers killed without a goodbye: heartbeats older than ``gone_after_s``, and group consumers
        idle that long holding nothing (a consumer with pending entries is never removed: that would strand
        them; a live worker that is removed is simply recreated by its next read)."""
        redis = self.queue.redis
        keys = self.queue.keys
        now_ms = time.time() * 1000
        beats = await redis.hgetall(keys.workers)
        stale = [w for w, beat in beats.items() if now_ms - int(beat.split(" ", 1)[0]) > gone_after_s * 1000]
        if stale:
            await redis.hdel(keys.workers, *stale)
        records = await redis.hkeys(keys.fleet)
        gone = [w for w in records if w != self.id and (w in stale or w not in beats)]
        if gone:
            await redis.hdel(keys.fleet, *gone)
        for stream, group in (*((s, GROUP) for s in keys.lane_streams), (keys.events, WEBHOOK_GROUP)):
            try:
                consumers = await redis.xinfo_consumers(stream, group)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
                    raise  # a fault (READONLY, BUSY, ...) for the caller's fault handling
                continue
            for consumer in consumers:
                name = consumer["name"]
                if name != self.id and not consumer["pending"] and consumer["idle"] > gone_after_s * 1000:
                    await redis.xgroup_delconsumer(stream, group, name)
