"""The puller alone (gpu_worker/pull.py) against a real Valkey, with a runner that only holds what it is handed:
it reads only what the window has room for, reclaims one suspect at a time, takes nothing while its worker is
surplus, gives back what it read as its worker stopped, and in burst mode returns once the queue is drained."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from gpu_worker.attempt import Attempt
from gpu_worker.fleet import Fleet
from gpu_worker.held import HeldJobs
from gpu_worker.outcomes import succeeded
from gpu_worker.pull import Puller
from gpu_worker.window import StaticWindow
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Delivery, Queue
from tests.support.queued import read_all
from tests.support.waiting import eventually_async

from .support import chat, counting_faults, settler_for, submit


class Harness:
    """A puller as a worker makes it, whose ``start`` only holds the delivery (``finish`` ends one)."""

    def __init__(self, settings: Settings, queue: Queue, *, window: int = 3, burst: bool = False,
                 block_ms: int = 100, finish_at_once: bool = False) -> None:
        self.queue = queue
        self.held = HeldJobs(StaticWindow(window))
        self.settler = settler_for(settings, queue)
        self.fleet = Fleet(settings, queue, "puller", self.settler.metrics, held=lambda: len(self.held))
        self.stopping = asyncio.Event()
        self.started: list[Attempt] = []
        self.finish_at_once = finish_at_once
        self.puller = Puller(
            settings, "puller", queue=queue, reader=queue, held=self.held, start=self.start, settler=self.settler,
            fleet=self.fleet, metrics=self.settler.metrics, stopping=self.stopping, faults=counting_faults(queue, []),
            block_ms=block_ms, burst=burst,
        )

    def start(self, delivery: Delivery) -> Attempt:
        attempt = Attempt(delivery)
        self.held.add(attempt)
        self.started.append(attempt)
        if self.finish_at_once:
            attempt.task = asyncio.create_task(self.finish(attempt))
        return attempt

    async def finish(self, attempt: Attempt) -> None:
        await self.settler.settle(attempt.delivery, succeeded({"status_code": 200, "body": {}}))
        self.held.remove(attempt)

    async def count(self, n: int) -> bool:
        return len(self.started) == n

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[asyncio.Task[None]]:
        task = asyncio.create_task(self.puller.run())
        try:
            yield task
        finally:
            self.stopping.set()
            await asyncio.wait_for(task, 5)


async def test_the_puller_reads_only_what_the_window_has_room_for(settings: Settings, queue: Queue) -> None:
    for i in range(10):
        await submit(queue, chat(f"q{i}"))
    harness = Harness(settings, queue, window=3)
    async with harness.running():
        await eventually_async(lambda: harness.count(3), what="three jobs started")
        assert (await queue.observe()).lag == 7  # one read of three: the rest was never read
        await harness.finish(harness.started[0])
        await eventually_async(lambda: harness.count(4), what="a fourth job once a slot was freed")
        observation = await queue.observe()
        assert observation.lag == 6 and observation.pending == 3


async def test_reclaim_takes_over_one_suspect_at_a_time(settings: Settings, queue: Queue) -> None:
    assert settings.claim_idle_ms == 1000
    jobs = [await submit(queue, chat(f"orphan {i}")) for i in range(2)]
    await read_all(queue, "dead-worker", 2)  # a worker that took both and died
    harness = Harness(settings, queue, window=4)
    async with harness.running():
        await eventually_async(lambda: harness.count(1), what="the first entry reclaimed")
        [suspect] = harness.started
        assert suspect.suspect and suspect.delivery.reclaimed and suspect.delivery.job.id in {j.id for j in jobs}
        await asyncio.sleep(1.2)  # proves a negative: two reclaim periods pass, and no second suspect is taken
        assert len(harness.started) == 1
        await harness.finish(suspect)
        await eventually_async(lambda: harness.count(2), what="the next suspect once the first ended")
        assert harness.started[1].suspect
    assert harness.settler.metrics.reclaimed._value.get() == 2


async def test_a_surplus_worker_takes_nothing_until_the_target_takes_it_back(settings: Settings,
                                                                             queue: Queue) -> None:
    harness = Harness(settings, queue)
    await queue.redis.hset(queue.keys.scale, mapping={"target": 0, "at": time.time()})
    await harness.fleet.check()
    assert harness.fleet.surplus
    async with harness.running():
        await submit(queue, chat("x"))
        await asyncio.sleep(0.5)  # proves a negative: several read periods pass and nothing is read
        assert harness.started == [] and (await queue.observe()).lag == 1
        await queue.redis.hset(queue.keys.scale, mapping={"target": 1, "at": time.time()})
        await harness.fleet.check()
        await eventually_async(lambda: harness.count(1), what="the job taken once the worker was taken back")


async def test_what_is_read_as_the_worker_stops_is_given_back_at_once(settings: Settings, queue: Queue) -> None:
    before = int((await queue.redis.info("clients"))["blocked_clients"])
    harness = Harness(settings, queue, block_ms=5000)
    async with harness.running():

        async def blocked() -> bool:
            return int((await queue.redis.info("clients"))["blocked_clients"]) > before

        await eventually_async(blocked, what="the puller's blocking read")
        harness.stopping.set()
        job = await submit(queue, chat("late"))  # the blocked read returns it to a stopping puller
    record = await queue.get(job.id)
    assert harness.started == [] and record is not None and record.status is JobStatus.QUEUED
    assert record.deliveries == 0 and (await queue.observe()).lag == 1


async def test_in_burst_mode_the_puller_returns_once_the_queue_is_drained(settings: Settings, queue: Queue) -> None:
    jobs = [await submit(queue, chat(f"q{i}")) for i in range(7)]
    harness = Harness(settings, queue, window=2, burst=True, finish_at_once=True)
    await asyncio.wait_for(harness.puller.run(), 10)
    assert len(harness.started) == 7 and len(harness.held) == 0
    for job in jobs:
        record = await queue.get(job.id)
        assert record is not None and record.status is JobStatus.SUCCEEDED
    await asyncio.wait_for(harness.puller.run(), 5)  # an empty queue: at once
