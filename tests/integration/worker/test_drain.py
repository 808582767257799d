"""Drain when surplus (gpu_worker/fleet.py): a worker beyond the scaler's drain target takes no new job, finishes
what it holds and drops its scale-in protection while work keeps coming; taken back, it pulls again."""

from __future__ import annotations

import asyncio
import time

from gpu_worker.protection import TaskProtection
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from tests.support.waiting import eventually_async

from .support import Receiver, chat, running_worker, submit, terminal


def _runs(worker: Worker) -> int:
    return worker.fleet.run_totals()[0]


async def _set_target(queue: Queue, target: int) -> None:
    await queue.redis.hset(queue.keys.scale, mapping={"target": target, "at": time.time()})


async def test_a_surplus_worker_drains_under_load_and_pulls_again_when_taken_back(
    settings: Settings, queue: Queue
) -> None:
    settings = settings.replace(window=4)
    agent = Receiver()
    protection = TaskProtection(agent.url + "/v1/newest", expires_minutes=5, idle_grace_s=0.2)
    try:
        async with running_worker(settings, queue, worker_id="oldest") as oldest:
            await eventually_async(lambda: queue.redis.hexists(queue.keys.fleet, "oldest"), what="oldest in the fleet")
            async with running_worker(settings, queue, worker_id="newest", protection=protection) as newest:
                await eventually_async(lambda: queue.redis.hexists(queue.keys.fleet, "newest"),
                                       what="newest in the fleet")
                first = [await submit(queue, chat(f"a{i}", latency_ms=400)) for i in range(8)]

                async def both_busy() -> bool:
                    return bool(newest.in_flight) and bool(oldest.in_flight)

                await eventually_async(both_busy, what="both workers running jobs")
                await _set_target(queue, 1)
                await eventually_async(lambda: _true(newest.fleet.surplus), what="newest to see itself surplus")
                held_then = _runs(newest) + newest.in_flight

                # work keeps coming; the surplus worker takes none of it, empties, and drops protection
                stream = []
                for i in range(12):
                    stream.append(await submit(queue, chat(f"b{i}", latency_ms=200)))
                    await asyncio.sleep(0.1)
                for job in first + stream:
                    assert (await terminal(queue, job.id)).status is JobStatus.SUCCEEDED
                assert _runs(newest) <= held_then  # it ran only what it held when it turned surplus
                assert not newest.in_flight
                assert _runs(oldest) >= 12  # the new work packed onto the worker within the target

                async def unprotected() -> bool:
                    bodies = [body for _, _, _, body in agent.requests]
                    return bool(bodies) and b'"ProtectionEnabled": false' in bodies[-1].replace(b'":false', b'": false')

                await eventually_async(unprotected, what="protection dropped", timeout=5)

                # taken back: it pulls again, no restart needed
                await _set_target(queue, 2)
                await eventually_async(lambda: _true(not newest.fleet.surplus), what="newest back within the target")
                before = _runs(newest)
                more = [await submit(queue, chat(f"c{i}", latency_ms=300)) for i in range(12)]
                for job in more:
                    assert (await terminal(queue, job.id)).status is JobStatus.SUCCEEDED
                assert _runs(newest) > before
    finally:
        agent.close()


async def test_a_stale_target_is_ignored(settings: Settings, queue: Queue) -> None:
    """A target the scaler wrote long ago (no scaler runs now) must not keep a worker idle."""
    await queue.redis.hset(queue.keys.scale, mapping={"target": 0, "at": time.time() - 3600})
    async with running_worker(settings, queue, worker_id="alone") as worker:
        job = await submit(queue, chat("x"))
        assert (await terminal(queue, job.id)).status is JobStatus.SUCCEEDED
        assert not worker.fleet.surplus
    assert not await queue.redis.hexists(queue.keys.fleet, "alone")  # a stopped worker leaves the fleet hash


async def _true(value: bool) -> bool:
    return value


async def test_a_worker_publishes_its_output_tokens_and_the_backlog_tokens_fall_as_its_jobs_end(
    settings: Settings, queue: Queue
) -> None:
    """The throughput the scaler sizes by (output tokens per backend second, inferq:{Q}:fleet) comes from the
    answers' usage; the queue's expected work (backlog_tokens, kept while sizing by work is on) drops to zero as the
    jobs end."""
    queue.settings = queue.settings.replace(scale_tokens_per_s=200.0)
    jobs = [await submit(queue, {**chat("one two three four five six"), "max_tokens": 64}) for _ in range(4)]
    assert int(await queue.redis.hget(queue.keys.stats, "backlog_tokens") or 0) == 4 * 64
    async with running_worker(settings, queue, worker_id="counting") as worker:
        for job in jobs:
            assert (await terminal(queue, job.id)).status is JobStatus.SUCCEEDED
        runs, _, tokens = worker.fleet.run_totals()
        assert runs == 4 and tokens > 0  # the mock echoes the prompt: its words are its completion tokens

        async def published() -> bool:
            record = await queue.redis.hget(queue.keys.fleet, "counting")
            return record is not None and record.split(" ")[1:2] == ["4"] and int(record.split(" ")[3]) == tokens

        await eventually_async(published, what="the fleet record with the worker's tokens")
    assert int(await queue.redis.hget(queue.keys.stats, "backlog_tokens") or 0) == 0
