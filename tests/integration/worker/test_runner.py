"""The job runner alone (gpu_worker/runner.py) against a real Valkey, with the mock backend: a job's call, its
outcome and its slot; jobs at the engine together marked as sharing it; an abort from outside ended as its reason
says; a dead model server reported to the worker and its job's strike written."""

from __future__ import annotations

import asyncio
from typing import Any

from gpu_worker.attempt import Abort, Attempt
from gpu_worker.backends.base import EngineDied
from gpu_worker.backends.mock import MockBackend
from gpu_worker.claim_check import ClaimCheck
from gpu_worker.held import HeldJobs
from gpu_worker.runner import JobRunner
from gpu_worker.window import StaticWindow
from inferq.config.settings import Settings
from inferq.queue.jobs import Job, JobStatus
from inferq.queue.protocol import Delivery, Queue
from tests.support.queued import read_all
from tests.support.waiting import eventually_async

from .support import chat, mock_calls, settler_for, submit


class Harness:
    """A runner as a worker makes it, recording what it reports to the worker."""

    def __init__(self, settings: Settings, queue: Queue, backend: Any = None) -> None:
        self.held = HeldJobs(StaticWindow(4))
        self.settler = settler_for(settings, queue)
        self.engine_deaths = 0
        self.errors: list[BaseException] = []
        self.runner = JobRunner(
            settings, backend or MockBackend(queue.redis, queue.keys), ClaimCheck(settings), self.settler,
            self.held, self.settler.metrics, on_engine_died=self._engine_died, on_error=self.errors.append,
        )

    def _engine_died(self) -> None:
        self.engine_deaths += 1


async def delivered(queue: Queue, *bodies: dict[str, Any]) -> list[Delivery]:
    for body in bodies:
        await submit(queue, body)
    got, _ = await read_all(queue, "w", len(bodies))
    assert len(got) == len(bodies)
    return got


async def test_a_job_is_called_once_its_outcome_written_and_its_slot_freed(settings: Settings, queue: Queue) -> None:
    [delivery] = await delivered(queue, chat("what is a lease"))
    harness = Harness(settings, queue)
    attempt = harness.runner.start(delivery)
    assert delivery.key in harness.held and harness.held.at_engine() == 1
    assert attempt.task is not None
    await asyncio.wait_for(attempt.task, 10)
    job = await queue.get(delivery.job.id)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert job.result is not None and job.result["body"]["choices"][0]["message"]["content"] == "what is a lease"
    assert len(harness.held) == 0 and harness.held.free() == 4 and await mock_calls(queue, job.id) == 1
    assert harness.settler.metrics.run_time._sum.get() > 0 and not harness.errors and not attempt.shared


async def test_jobs_at_the_engine_together_are_marked_as_sharing_it(settings: Settings, queue: Queue) -> None:
    together = await delivered(queue, chat("a", latency_ms=300), chat("b", latency_ms=300))
    harness = Harness(settings, queue)
    attempts = [harness.runner.start(d) for d in together]
    await asyncio.wait_for(asyncio.gather(*(a.task for a in attempts if a.task)), 10)
    assert [a.shared for a in attempts] == [True, True]
    [alone] = await delivered(queue, chat("c"))
    attempt = harness.runner.start(alone)
    assert attempt.task is not None
    await asyncio.wait_for(attempt.task, 10)
    assert not attempt.shared and len(harness.runner.engine) == 0


async def _aborted(queue: Queue, harness: Harness, reason: str) -> tuple[Attempt, Job]:
    [delivery] = await delivered(queue, chat("long", latency_ms=60_000))
    attempt = harness.runner.start(delivery)

    async def at_engine() -> bool:
        return await mock_calls(queue, delivery.job.id) == 1

    await eventually_async(at_engine, what="the call under way")
    assert attempt.cancel(reason) and attempt.task is not None
    await asyncio.wait_for(attempt.task, 5)
    job = await queue.get(delivery.job.id)
    assert job is not None
    return attempt, job


async def test_an_abort_ends_the_call_as_its_reason_says(settings: Settings, queue: Queue) -> None:
    harness = Harness(settings, queue)
    _, cancelled = await _aborted(queue, harness, Abort.CANCEL)
    assert cancelled.status is JobStatus.CANCELLED and cancelled.error is not None
    assert cancelled.error["type"] == "cancelled"
    _, released = await _aborted(queue, harness, Abort.SHUTDOWN)
    assert released.status is JobStatus.QUEUED and released.deliveries == 0
    _, lost = await _aborted(queue, harness, Abort.LOST)
    assert lost.status is JobStatus.RUNNING  # nothing written: another worker holds it, or it ended
    assert len(harness.held) == 0 and not harness.errors


class DyingEngine(MockBackend):
    """The mock, but its model server dies under every call."""

    async def complete(self, url: str, body: dict[str, Any], *, timeout_s: float, traceparent: str,
                       job: Job, output: Any = None) -> tuple[int, Any]:
        raise EngineDied("the model server died while running the request (ConnectionResetError)")


async def test_a_dead_model_server_is_reported_and_the_job_alone_at_it_is_dead_lettered(
    settings: Settings, queue: Queue
) -> None:
    [delivery] = await delivered(queue, chat("poison"))
    harness = Harness(settings, queue, DyingEngine(queue.redis, queue.keys))
    attempt = harness.runner.start(delivery)
    assert attempt.task is not None
    await asyncio.wait_for(attempt.task, 10)
    assert harness.engine_deaths == 1
    job = await queue.get(delivery.job.id)
    assert job is not None and job.dead_lettered and job.error is not None and job.error["type"] == "engine_died"
