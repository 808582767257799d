"""The worker loop with priority lanes, in this process against a real Valkey: higher lanes start first, a low
backlog still gets its share of takes under a constant high-priority stream, and the worker's own guarantees
(retries, reclaim of a dead worker's entries, lease renewal, cancel while running, release on stop, expiry) hold
in every lane, each job staying in its lane."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_worker.backends.mock import MockBackend
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.jobs import LANES, Job, JobRequest, JobStatus, Priority
from inferq.queue.protocol import Queue, now_ms
from tests.support.blocked import blocked_in
from tests.support.waiting import eventually_async

from .support import chat, mock_calls, running_worker, status_is, submit, terminal


class RecordingBackend(MockBackend):
    """The mock, recording the lane of each call in the order the calls start (with window 1: the take order)."""

    def __init__(self, queue: Queue) -> None:
        super().__init__(queue.redis, queue.keys)
        self.lanes: list[Priority] = []
        self.ids: list[str] = []

    async def complete(self, url: str, body: dict[str, Any], *, timeout_s: float, traceparent: str,
                       job: Job, output: Any = None) -> tuple[int, Any]:
        self.lanes.append(job.priority)
        self.ids.append(job.id)
        return await super().complete(url, body, timeout_s=timeout_s, traceparent=traceparent, job=job,
                                          output=output)


async def lane_of_entries(queue: Queue, job_id: str) -> list[Priority]:
    return [lane for lane in LANES
            for _, f in await queue.redis.xrange(queue.keys.stream_of(lane)) if f["job"] == job_id]


async def test_a_high_job_submitted_after_a_low_backlog_starts_first(settings: Settings, queue: Queue) -> None:
    backend = RecordingBackend(queue)
    backlog = [await submit(queue, chat(f"bulk {i}", latency_ms=300), priority=Priority.LOW) for i in range(5)]
    async with running_worker(settings.replace(window=1), queue, backend, webhooks=False):
        await status_is(queue, backlog[0].id, "running")
        urgent = await submit(queue, chat("urgent"), priority=Priority.HIGH)
        assert (await terminal(queue, urgent.id, timeout=10)).status is JobStatus.SUCCEEDED
        for job in backlog:
            await terminal(queue, job.id, timeout=10)
    # the one low job running when it came, then the high one, then the rest of the backlog in its order
    assert backend.ids == [backlog[0].id, urgent.id, *(j.id for j in backlog[1:])]


async def test_a_low_backlog_gets_a_tenth_of_the_takes_under_a_constant_high_stream(
    settings: Settings, queue: Queue
) -> None:
    """Counted in takes (the backend's calls, in order, with window 1), not time: the high lane holds more than
    the 100 takes counted, so it never runs dry while they are made."""
    await queue.enqueue_many("acme", [_request(Priority.LOW) for _ in range(40)])
    await queue.enqueue_many("acme", [_request(Priority.HIGH) for _ in range(120)])
    backend = RecordingBackend(queue)
    async with running_worker(settings.replace(window=1, drain_s=0), queue, backend, webhooks=False):
        await eventually_async(lambda: _at_least(backend, 100), what="100 takes", timeout=60)
    first = backend.lanes[:100]
    assert first.count(Priority.LOW) >= 10, first
    assert first.count(Priority.HIGH) >= 80, first


def _request(lane: Priority) -> JobRequest:
    return JobRequest(body=chat("x"), priority=lane)


async def _at_least(backend: RecordingBackend, n: int) -> bool:
    return len(backend.lanes) >= n


@pytest.mark.parametrize("lane", list(Priority))
async def test_retries_keep_the_lane_until_the_job_succeeds(settings: Settings, queue: Queue, lane: Priority) -> None:
    settings = settings.replace(retry_base_ms=50, retry_max_ms=100, max_attempts=3)
    job = await submit(queue, chat("x", fail_attempts=2), priority=lane)
    backend = RecordingBackend(queue)
    await Worker(settings, queue, backend, webhooks=False, burst=True).run()
    done = await queue.get(job.id)
    assert done is not None and done.status is JobStatus.SUCCEEDED and done.attempts == 3
    assert done.priority is lane and backend.lanes == [lane, lane, lane]


@pytest.mark.parametrize("lane", list(Priority))
async def test_entries_of_a_dead_worker_are_reclaimed_in_their_lane(
    settings: Settings, queue: Queue, lane: Priority
) -> None:
    job = await submit(queue, chat("orphan"), priority=lane)
    taken, _ = await queue.read("dead-worker", 1)  # a worker that took the job and died
    assert [d.lane for d in taken] == [lane]
    backend = RecordingBackend(queue)
    async with running_worker(settings, queue, backend, webhooks=False):
        done = await terminal(queue, job.id, timeout=10)
    assert done.status is JobStatus.SUCCEEDED and backend.lanes == [lane] and await mock_calls(queue, job.id) == 1
    assert (await queue.stats())["reclaimed"] == 1


@pytest.mark.parametrize("lane", [Priority.HIGH, Priority.LOW])
async def test_a_long_job_is_never_stolen_while_its_worker_renews_its_lease(
    settings: Settings, queue: Queue, lane: Priority
) -> None:
    job = await submit(queue, chat("slow", latency_ms=2500), priority=lane)
    async with running_worker(settings, queue, worker_id="first", webhooks=False) as first:
        await status_is(queue, job.id, "running")
        async with running_worker(settings, queue, worker_id="thief", webhooks=False):
            done = await terminal(queue, job.id, timeout=10)
        assert first.leases.renewals >= 2
    assert done.status is JobStatus.SUCCEEDED and await mock_calls(queue, job.id) == 1
    assert (await queue.stats()).get("reclaimed", 0) == 0


@pytest.mark.parametrize("lane", list(Priority))
async def test_cancel_of_a_running_job_and_release_on_stop_work_in_every_lane(
    settings: Settings, queue: Queue, lane: Priority
) -> None:
    cancelled = await submit(queue, chat("long", latency_ms=60_000), priority=lane)
    released = await submit(queue, chat("long too", latency_ms=60_000), priority=lane)
    async with running_worker(settings.replace(window=2, drain_s=0), queue, webhooks=False):
        await status_is(queue, cancelled.id, "running")
        await status_is(queue, released.id, "running")
        await queue.cancel("acme", cancelled.id)
        assert (await terminal(queue, cancelled.id, timeout=5)).status is JobStatus.CANCELLED
    back = await queue.get(released.id)
    assert back is not None and back.status is JobStatus.QUEUED and back.attempts == 1 and back.deliveries == 0
    assert await lane_of_entries(queue, released.id) == [lane]
    assert await lane_of_entries(queue, cancelled.id) == []


@pytest.mark.parametrize("lane", list(Priority))
async def test_a_job_whose_ttl_passed_expires_without_running(settings: Settings, queue: Queue, lane: Priority) -> None:
    job, _ = await queue.enqueue("acme", JobRequest(body=chat("late"), ttl_s=1, priority=lane), now=now_ms() - 5000)
    await Worker(settings, queue, MockBackend(queue.redis, queue.keys), webhooks=False, burst=True).run()
    done = await queue.get(job.id)
    assert done is not None and done.status is JobStatus.EXPIRED and await mock_calls(queue, job.id) == 0
    assert await lane_of_entries(queue, job.id) == []


async def test_a_worker_idle_on_every_lane_wakes_for_a_job_in_any_lane(settings: Settings, queue: Queue) -> None:
    async def blocked_reading() -> bool:
        return await blocked_in(queue.redis, "xreadgroup") > 0

    async with running_worker(settings, queue, webhooks=False):
        await eventually_async(blocked_reading, what="the worker blocked across the three empty lanes")
        for lane in (Priority.LOW, Priority.HIGH, Priority.NORMAL):
            job = await submit(queue, chat(lane.value), priority=lane)
            assert (await terminal(queue, job.id, timeout=5)).status is JobStatus.SUCCEEDED
