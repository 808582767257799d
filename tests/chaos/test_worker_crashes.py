"""Workers killed with SIGKILL: their jobs are reclaimed and finished once; a job that kills every worker that
runs it is dead-lettered after INFERQ_MAX_DELIVERIES, and the fleet goes on; in each lane, which a redrive keeps."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

from gpu_worker.backends.mock import CRASH_EXIT_CODE
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus, Priority
from inferq.queue.protocol import Queue
from tests.integration.worker.support import (
    chat,
    mock_calls,
    status_is,
    submit,
    terminal,
    terminal_events,
    worker_processes,
)
from tests.support.waiting import eventually_async


@pytest.mark.parametrize("lane", list(Priority))
async def test_a_job_of_a_worker_killed_mid_inference_is_reclaimed_and_finished_once(
    settings: Settings, queue: Queue, tmp_path: Path, lane: Priority
) -> None:
    with worker_processes(settings, tmp_path) as spawn:
        first = spawn("first")
        await first.started(queue)
        jobs = [await submit(queue, chat(f"q{i}", latency_ms=1500), priority=lane) for i in range(3)]
        for job in jobs:
            await status_is(queue, job.id, "running")
            # running is written by start, a moment before the worker calls the model (whose count is a round trip
            # more): kill only once every job's model call is under way, as "mid inference" means
            await eventually_async(functools.partial(mock_calls, queue, job.id), what=f"the model call of {job.id}")
        first.kill()  # SIGKILL: no drain, no release, leases simply stop being renewed
        assert first.proc.returncode == -9
        spawn("second")
        for job in jobs:
            done = await terminal(queue, job.id, timeout=20)
            assert done.status is JobStatus.SUCCEEDED and done.attempts == 1 and done.priority is lane
            assert await mock_calls(queue, job.id) == 2  # once on each worker
            assert len(await terminal_events(queue, job.id)) == 1
    stats = await queue.stats()
    assert stats["reclaimed"] == 3 and stats["succeeded"] == 3
    assert stats.get("duplicate_results", 0) == 0 and stats["unfinished"] == 0


@pytest.mark.parametrize("lane", list(Priority))
async def test_a_poison_job_is_dead_lettered_and_the_fleet_survives(
    settings: Settings, tmp_path: Path, lane: Priority
) -> None:
    settings = settings.replace(max_deliveries=2, window=4)
    queue = Queue.connect(settings)
    with worker_processes(settings, tmp_path) as spawn:
        fleet = [spawn("w0"), spawn("w1")]
        for worker in fleet:
            await worker.started(queue)
        poison = await submit(queue, chat("boom", crash_deliveries=100), priority=lane)
        normal = [await submit(queue, chat(f"q{i}", latency_ms=50), priority=lane) for i in range(20)]
        crashes = 0
        # supervise like ECS does: a task that exits is replaced
        for _ in range(600):
            if (await queue.get(poison.id)).status.terminal:  # type: ignore[union-attr]
                break
            for i, worker in enumerate(fleet):
                if not worker.alive():
                    assert worker.proc.returncode == CRASH_EXIT_CODE
                    crashes += 1
                    fleet[i] = spawn(f"w{i}-{crashes}")
            await asyncio.sleep(0.05)
        dead = await queue.get(poison.id)
        assert dead is not None and dead.status is JobStatus.FAILED and dead.dead_lettered and dead.priority is lane
        assert dead.error is not None and dead.error["type"] == "max_deliveries"
        assert await mock_calls(queue, poison.id) == 2 and crashes == 2
        assert [f["job"] for _, f in await queue.redis.xrange(queue.keys.dlq)] == [poison.id]
        for job in normal:
            assert (await terminal(queue, job.id, timeout=20)).status is JobStatus.SUCCEEDED
            assert len(await terminal_events(queue, job.id)) == 1
        # the fleet is still up and working
        after = await submit(queue, chat("after"))
        assert (await terminal(queue, after.id, timeout=10)).status is JobStatus.SUCCEEDED
        assert all(worker.alive() for worker in fleet)
    # with the fleet gone (the poison would crash it again): a redrive puts it back into its own lane
    redriven = await queue.redrive("acme", poison.id)
    assert redriven.priority is lane and redriven.status is JobStatus.QUEUED
    assert [f["job"] for _, f in await queue.redis.xrange(queue.keys.stream_of(lane))] == [poison.id]
    await queue.close()
