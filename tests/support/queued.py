"""Test helpers for fair share (G10): where a queue holds its queued jobs (a lane's stream, or its jobs waiting for
admission), and a read that takes everything it is asked for when the jobs are there (a worker's read takes what
the stream holds; admission refills it for the next read)."""

from __future__ import annotations

from inferq.queue.jobs import Priority
from inferq.queue.protocol import Delivery, Queue, Skipped


async def queued(q: Queue, lane: Priority = Priority.NORMAL) -> list[str]:
    """The job ids of a lane in the order its workers will take them: its stream's entries (pending or not), then
    its jobs waiting for admission, next admitted first."""
    entries = [f["job"] for _, f in await q.redis.xrange(q.keys.stream_of(lane))]
    waiting = [m.split("|", 2)[2] for m in await q.redis.zrevrange(q.keys.fair_jobs(lane), 0, -1)]
    return entries + waiting


async def read_all(q: Queue, consumer: str, count: int) -> tuple[list[Delivery], list[Skipped]]:
    """Reads until ``count`` entries are taken or a read takes nothing."""
    deliveries: list[Delivery] = []
    skipped: list[Skipped] = []
    while len(deliveries) + len(skipped) < count:
        got, passed = await q.read(consumer, count - len(deliveries) - len(skipped))
        if not got and not passed:
            break
        deliveries += got
        skipped += passed
    return deliveries, skipped
