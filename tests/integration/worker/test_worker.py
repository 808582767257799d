"""The worker loop in this process against a real Valkey: window, results, retries, timeouts, cancellation,
leases and reclaim."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulator.valkey import ValkeyProcess, fail_over, wait_in_sync
from gpu_worker.backends.mock import MockBackend
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.jobs import Job, JobStatus
from inferq.queue.protocol import Queue
from tests.support.waiting import eventually_async

from .support import chat, mock_calls, running_worker, status_is, submit, terminal, terminal_events


class CountingBackend(MockBackend):
    """The mock, also recording how many calls run at once and which trace headers it got."""

    def __init__(self, queue: Queue) -> None:
        super().__init__(queue.redis, queue.keys)
        self.running = 0
        self.most = 0
        self.traceparents: list[str] = []

    async def complete(self, url: str, body: dict[str, Any], *, timeout_s: float, traceparent: str,
                       job: Job, output: Any = None) -> tuple[int, Any]:
        self.running += 1
        self.most = max(self.most, self.running)
        self.traceparents.append(traceparent)
        try:
            return await super().complete(url, body, timeout_s=timeout_s, traceparent=traceparent, job=job,
                                          output=output)
        finally:
            self.running -= 1


async def test_success_writes_the_model_answer_once(settings: Settings, queue: Queue) -> None:
    job = await submit(queue, chat("what is a lease"))
    await Worker(settings, queue, MockBackend(queue.redis, queue.keys), burst=True).run()
    done = await queue.get(job.id)
    assert done is not None and done.status is JobStatus.SUCCEEDED
    assert done.result is not None and done.result["status_code"] == 200
    assert done.result["body"]["choices"][0]["message"]["content"] == "what is a lease"
    assert done.attempts == 1 and await mock_calls(queue, job.id) == 1
    assert len(await terminal_events(queue, job.id)) == 1
    stats = await queue.stats()
    assert stats["succeeded"] == 1 and stats["unfinished"] == 0


async def test_window_bounds_the_jobs_in_flight(settings: Settings, queue: Queue) -> None:
    backend = CountingBackend(queue)
    jobs = [await submit(queue, chat(f"q{i}", latency_ms=100)) for i in range(12)]
    await Worker(settings.replace(window=3), queue, backend, burst=True).run()
    assert backend.most == 3
    for job in jobs:
        assert (await queue.get(job.id)).status is JobStatus.SUCCEEDED  # type: ignore[union-attr]


async def test_the_next_job_goes_to_the_backend_while_an_outcome_is_written_and_twice_the_window_bounds_all(
        settings: Settings, queue: Queue) -> None:
    """The window bounds the jobs at the backend: a job whose call is over frees its slot while its outcome is
    written, so the engine's slot is refilled without waiting for Redis; held outcomes and calls together stay
    within twice the window, so writes that cannot keep up do not let the worker take ever more."""
    backend = CountingBackend(queue)
    jobs = [await submit(queue, chat(f"q{i}")) for i in range(3)]
    gate = asyncio.Event()
    write = queue.finish_many

    async def held(items: list[Any]) -> Any:
        await gate.wait()
        return await write(items)

    queue.finish_many = held  # type: ignore[method-assign]  # the worker's finishes are written through it
    async with running_worker(settings.replace(window=1), queue, backend) as worker:

        async def two_calls() -> bool:
            return len(backend.traceparents) == 2

        # the first outcome is held: the second job was still taken and called, the third was not (2 x window)
        await eventually_async(two_calls, what="the second call")
        await asyncio.sleep(0.3)  # proves a negative: the third job is not taken while the first outcome is held
        assert len(backend.traceparents) == 2 and backend.most == 1 and worker.in_flight == 2
        gate.set()
        for job in jobs:
            await status_is(queue, job.id, "succeeded")
    assert len(backend.traceparents) == 3 and backend.most == 1


async def test_traceparent_of_the_job_is_forwarded_with_a_new_span(settings: Settings, queue: Queue) -> None:
    backend = CountingBackend(queue)
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await submit(queue, chat("x"), traceparent=trace)
    await submit(queue, chat("y"))
    await Worker(settings, queue, backend, burst=True).run()
    first, second = sorted(backend.traceparents, key=lambda t: "4bf92f35" not in t)
    assert first.split("-")[1] == "4bf92f3577b34da6a3ce929d0e0e4736" and first != trace
    assert len(second.split("-")[1]) == 32  # a job without a trace gets one


async def test_retryable_failures_back_off_then_succeed(settings: Settings, queue: Queue) -> None:
    settings = settings.replace(retry_base_ms=100, retry_max_ms=200, max_attempts=3)
    job = await submit(queue, chat("x", fail_attempts=2))
    await Worker(settings, queue, MockBackend(queue.redis, queue.keys), burst=True).run()
    assert (await queue.stats()).get("dead_lettered", 0) == 0
    done = await queue.get(job.id)
    assert done is not None and done.status is JobStatus.SUCCEEDED
    assert done.attempts == 3 and await mock_calls(queue, job.id) == 3
    assert (await queue.stats())["retried"] == 2


async def test_retries_are_bounded_by_max_attempts_then_dead_lettered(settings: Settings) -> None:
    settings = settings.replace(max_attempts=2)
    queue = Queue.connect(settings)
    job = await submit(queue, chat("x", fail_attempts=10))
    await Worker(settings, queue, MockBackend(queue.redis, queue.keys), burst=True).run()
    done = await queue.get(job.id)
    assert done is not None and done.status is JobStatus.FAILED and done.dead_lettered
    assert done.attempts == 2 and await mock_calls(queue, job.id) == 2
    assert done.error is not None and done.error["type"] == "backend_error" and "503" in done.error["message"]
    assert set(done.error) == {"type", "message"}
    await queue.close()


def test_a_worker_refuses_a_queue_with_other_protocol_settings(settings: Settings, queue: Queue) -> None:
    try:
        Worker(settings.replace(max_attempts=9), queue, MockBackend(queue.redis, queue.keys))
    except ValueError as exc:
        assert "max_attempts" in str(exc)
    else:
        raise AssertionError("expected a ValueError")


async def test_fatal_error_fails_at_once_without_retry(settings: Settings, queue: Queue) -> None:
    job = await submit(queue, chat("x", fatal=True))
    await Worker(settings, queue, MockBackend(queue.redis, queue.keys), burst=True).run()
    done = await queue.get(job.id)
    assert done is not None and done.status is JobStatus.FAILED and not done.dead_lettered
    assert done.attempts == 1 and await mock_calls(queue, job.id) == 1
    assert done.error is not None
    assert done.error == {"type": "model_error", "message": done.error["message"]}
    assert "400" in done.error["message"]


async def test_hung_backend_times_out_while_other_jobs_keep_flowing(settings: Settings) -> None:
    settings = settings.replace(window=4, max_attempts=2)
    queue = Queue.connect(settings)
    hung = await submit(queue, chat("stuck", hang=True), timeout_s=2)
    others = [await submit(queue, chat(f"q{i}", latency_ms=50)) for i in range(24)]
    await Worker(settings, queue, MockBackend(queue.redis, queue.keys), burst=True).run()
    done = await queue.get(hung.id)
    assert done is not None and done.status is JobStatus.FAILED and done.dead_lettered
    assert done.error is not None and done.error["type"] == "timeout"
    assert done.attempts == 2 and await mock_calls(queue, hung.id) == 2
    assert done.started_at is not None and done.finished_at is not None
    assert done.finished_at - done.started_at >= 4  # the record's own times: two attempts of 2 s each
    first_timeout = done.started_at + 2
    for other in others:
        finished = await queue.get(other.id)
        assert finished is not None and finished.status is JobStatus.SUCCEEDED
        # the 24 others went through the 3 free slots before the hung job's first attempt timed out
        assert finished.finished_at is not None and finished.finished_at < first_timeout, (finished, done)
    await queue.close()


async def test_cancelling_a_running_job_aborts_its_model_call(settings: Settings, queue: Queue) -> None:
    async with running_worker(settings.replace(window=1), queue):
        job = await submit(queue, chat("long", latency_ms=60_000))
        await status_is(queue, job.id, "running")
        await queue.cancel("acme", job.id)
        # the 60 s call is aborted: the job ends cancelled (the guard, 5 s, is far below the call)
        done = await terminal(queue, job.id, timeout=5)
        assert done.status is JobStatus.CANCELLED
        assert done.error is not None and done.error["type"] == "cancelled"
        # the slot is free again: the next job runs at once
        after = await submit(queue, chat("next"))
        assert (await terminal(queue, after.id, timeout=5)).status is JobStatus.SUCCEEDED
    assert await mock_calls(queue, job.id) == 1


async def test_a_job_running_three_times_the_claim_idle_time_is_not_stolen(
    settings: Settings, queue: Queue
) -> None:
    assert settings.claim_idle_ms == 1000
    job = await submit(queue, chat("slow", latency_ms=3000))
    async with running_worker(settings, queue, worker_id="first") as first:
        await status_is(queue, job.id, "running")
        # a second, idle worker keeps trying to reclaim idle entries all along
        async with running_worker(settings, queue, worker_id="thief"):
            done = await terminal(queue, job.id, timeout=10)
        assert first.leases.renewals >= 3
    assert done.status is JobStatus.SUCCEEDED
    assert await mock_calls(queue, job.id) == 1
    assert (await queue.stats()).get("reclaimed", 0) == 0


async def test_entries_of_a_dead_consumer_are_reclaimed_after_claim_idle(settings: Settings, queue: Queue) -> None:
    job = await submit(queue, chat("orphan"))
    taken, _ = await queue.read("dead-worker", 1)  # a worker that took the job and died
    assert [d.job.id for d in taken] == [job.id]
    first = await queue.get(job.id)
    assert first is not None and first.started_at is not None and first.deliveries == 1
    async with running_worker(settings, queue):
        done = await terminal(queue, job.id, timeout=10)
    assert done.status is JobStatus.SUCCEEDED and await mock_calls(queue, job.id) == 1
    assert (await queue.stats())["reclaimed"] == 1
    # taken again once, and only after the entry had been idle for the claim-idle time (the record's own times)
    assert done.deliveries == 2 and done.finished_at is not None
    assert done.finished_at - first.started_at >= settings.claim_idle_ms / 1000, (first, done)


async def test_a_cancelled_job_of_a_dead_worker_is_ended_without_calling_the_model(
    settings: Settings, queue: Queue
) -> None:
    job = await submit(queue, chat("orphan"))
    await queue.read("dead-worker", 1)
    await queue.cancel("acme", job.id)  # running: only flagged, and its worker is gone
    await Worker(settings, queue, MockBackend(queue.redis, queue.keys), burst=True).run()
    done = await queue.get(job.id)
    assert done is not None and done.status is JobStatus.CANCELLED
    assert await mock_calls(queue, job.id) == 0


async def test_heartbeat_reports_in_flight_and_stop_deregisters(settings: Settings, queue: Queue) -> None:
    async with running_worker(settings.replace(drain_s=0), queue, worker_id="beater"):
        job = await submit(queue, chat("x", latency_ms=3000))
        await status_is(queue, job.id, "running")

        async def beats_one() -> bool:
            beat = await queue.redis.hget(queue.keys.workers, "beater")
            return beat is not None and beat.endswith(" 1")

        await eventually_async(beats_one, what="a heartbeat with one job in flight", timeout=5)
        observation = await queue.observe()
        assert observation.workers == 1 and observation.in_flight == 1
    assert await queue.redis.hget(queue.keys.workers, "beater") is None


async def test_stop_releases_unfinished_jobs_without_spending_an_attempt(settings: Settings, queue: Queue) -> None:
    job = await submit(queue, chat("long", latency_ms=60_000))
    async with running_worker(settings.replace(drain_s=0), queue):
        await status_is(queue, job.id, "running")
    released = await queue.get(job.id)
    assert released is not None and released.status is JobStatus.QUEUED
    assert released.attempts == 1 and released.deliveries == 0
    assert (await queue.stats())["released"] == 1
    observation = await queue.observe()
    assert observation.lag == 1 and observation.pending == 0  # at once available to any other worker


async def test_stop_drains_jobs_that_finish_within_the_drain(settings: Settings, queue: Queue) -> None:
    job = await submit(queue, chat("short", latency_ms=500))
    async with running_worker(settings.replace(drain_s=10), queue):
        await status_is(queue, job.id, "running")
    done = await queue.get(job.id)
    assert done is not None and done.status is JobStatus.SUCCEEDED


async def test_many_jobs_each_finish_exactly_once(settings: Settings, queue: Queue) -> None:
    jobs = [await submit(queue, chat(f"q{i}", latency_ms=i % 7)) for i in range(300)]
    workers = [Worker(settings.replace(window=16), queue, MockBackend(queue.redis, queue.keys), worker_id=name,
                      burst=True)
               for name in ("a", "b")]
    await asyncio.gather(*(worker.run() for worker in workers))
    calls = await queue.redis.hgetall(queue.keys.mock_calls)
    assert len(calls) == 300 and set(calls.values()) == {"1"}
    stats = await queue.stats()
    assert stats["succeeded"] == 300 and stats["unfinished"] == 0 and stats.get("duplicate_results", 0) == 0
    events = await queue.redis.xrange(queue.keys.events)
    assert sorted(f["job"] for _, f in events) == sorted(j.id for j in jobs)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ValkeyProcess, ValkeyProcess]]:
    """A primary and its replica, in sync: what a managed Redis fails over between."""
    primary = ValkeyProcess(tmp_path / "primary", appendfsync=None).start()
    replica = ValkeyProcess(tmp_path / "replica", appendfsync=None).start()
    try:
        replica.replicate(primary)
        wait_in_sync(replica, primary)
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


async def test_the_lease_keeper_outlives_a_failover_and_no_long_job_runs_twice(
    pair: tuple[ValkeyProcess, ValkeyProcess], queue_name: str
) -> None:
    """The old primary demoted for a second and a half answers READONLY to every write of the worker (its lease
    renewals included), then is promoted back: the leases are renewed again before anyone may reclaim them."""
    primary, replica = pair
    settings = Settings(redis_url=primary.url, queue=queue_name, claim_idle_ms=3000, window=8, retry_base_ms=0,
                        metrics_port=0, job_timeout_s=30, drain_s=5)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    jobs = [await submit(queue, chat(f"long {i}", latency_ms=7000)) for i in range(4)]
    async with running_worker(settings, queue, worker_id="first", webhooks=False) as first:
        for job in jobs:
            await status_is(queue, job.id, "running")
        # an idle worker keeps trying to reclaim idle entries all along
        async with running_worker(settings, queue, worker_id="thief", webhooks=False):
            await eventually_async(lambda: queue.redis.hexists(queue.keys.workers, "thief"), what="the thief to start")
            await asyncio.to_thread(fail_over, primary, replica)
            await asyncio.sleep(1.5)
            await asyncio.to_thread(fail_over, replica, primary)
            renewals = first.leases.renewals
            await eventually_async(lambda: _more(first, renewals), what="renewals after the failover", timeout=10)
            for job in jobs:
                assert (await terminal(queue, job.id, timeout=30)).status is JobStatus.SUCCEEDED
                assert await mock_calls(queue, job.id) == 1
                assert len(await terminal_events(queue, job.id)) == 1
        assert first.failure is None
        assert first.metrics.redis_errors._value.get() > 0  # it saw the READONLY answers, counted, waited them out
    stats = await queue.stats()
    assert stats.get("reclaimed", 0) == 0 and stats["unfinished"] == 0
    assert await queue.redis.xlen(queue.keys.stream) == 0
    await queue.close()


async def _more(worker: Worker, renewals: int) -> bool:
    return worker.leases.renewals > renewals


async def test_a_dead_background_task_stops_the_worker_and_releases_what_it_holds(
    settings: Settings, queue: Queue
) -> None:
    job = await submit(queue, chat("long", latency_ms=30_000))
    worker = Worker(settings, queue, MockBackend(queue.redis, queue.keys), worker_id="w", webhooks=False)
    run = asyncio.create_task(worker.run())
    await status_is(queue, job.id, "running")
    await queue.redis.set(queue.keys.delayed, "not a sorted set")  # the maintenance task's promotion: WRONGTYPE
    await asyncio.wait_for(run, 20)  # it stopped by itself, without a stop()
    assert worker.failure is not None and worker.failure.startswith("maintenance: ResponseError")
    released = await queue.get(job.id)
    assert released is not None and released.status is JobStatus.QUEUED and released.attempts == 1
    assert await queue.redis.hget(queue.keys.workers, "w") is None
    assert await mock_calls(queue, job.id) == 1
