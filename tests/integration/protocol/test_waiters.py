"""One reader of terminal events per process for every long-poll waiter (inferq/queue/waiters.py), against a real
Valkey: it wakes every waiter with one blocking read on the server, and a reader that loses events or its
connection delays a wake by the recheck interval at most, never loses one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.exceptions

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.producer import QueueFull
from inferq.queue.protocol import Delivery, Outcome, Queue
from inferq.queue.waiters import SharedWaiters
from inferq.redis.connection import pipelined
from tests.support.clock import FakeClock
from tests.support.waiting import eventually_async

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
OK = {"status_code": 200, "body": {}}


@pytest.fixture
async def q(valkey: ValkeyProcess, queue_name: str) -> AsyncIterator[Queue]:
    queue = Queue.connect(Settings(redis_url=valkey.url, queue=queue_name))
    await queue.ensure_groups()
    yield queue
    await queue.close()


async def started(q: Queue, n: int) -> list[Delivery]:
    await q.enqueue_many("t", [JobRequest(body=dict(BODY)) for _ in range(n)])
    deliveries: list[Delivery] = []
    while len(deliveries) < n:
        got, _ = await q.read("w1", n - len(deliveries))
        deliveries += got
    return deliveries


def blocked_clients(valkey: ValkeyProcess) -> int:
    return int(valkey.info("clients")["blocked_clients"])


async def test_two_hundred_waiters_are_woken_by_one_blocking_read_on_the_server(
    q: Queue, valkey: ValkeyProcess
) -> None:
    deliveries = await started(q, 200)
    waits = [asyncio.create_task(q.wait(d.job.id, "t", 30, shared=True)) for d in deliveries]
    await registered(q, *(d.job.id for d in deliveries))
    samples = []
    for _ in range(20):  # the reader re-issues its XREAD at the end of each block slice: sample across slices
        await asyncio.sleep(0.05)
        samples.append(blocked_clients(valkey))
    assert not any(w.done() for w in waits)
    assert max(samples) == 1  # one XREAD for them all, where BLMOVE would block 200 connections
    await q.finish_many([(d, JobStatus.SUCCEEDED, OK, None) for d in deliveries])
    jobs = await asyncio.wait_for(asyncio.gather(*waits), 5)  # well before any recheck of 200 waiters
    assert [j.id for j in jobs if j and j.status is JobStatus.SUCCEEDED] == [d.job.id for d in deliveries]
    assert q.waiters.wakes == 200


async def test_a_reader_that_loses_every_event_still_wakes_its_waiter_at_the_next_recheck(q: Queue) -> None:
    q._waiters = SharedWaiters(q.redis, q.keys.events, block_s=0.2, recheck_s=0.3)
    q._waiters._deliver = lambda reply: None  # type: ignore[method-assign]  # a reader that sees nothing
    [d] = await started(q, 1)
    wait = asyncio.create_task(q.wait(d.job.id, "t", 20, shared=True))
    await registered(q, d.job.id)
    await q.finish(d, JobStatus.FAILED, error={"type": "x", "message": "y"})
    job = await asyncio.wait_for(wait, 5)
    assert job is not None and job.status is JobStatus.FAILED


async def test_a_wait_that_outlasts_several_rechecks_is_still_woken_by_its_event(
    q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each recheck registers the waiter anew (its timeout cancelled the last registration): one registration at a
    time, none left behind, and the job's end still ends the wait."""
    q._waiters = SharedWaiters(q.redis, q.keys.events, block_s=0.2, recheck_s=0.15, job_key=q.keys.job)
    [d] = await started(q, 1)
    reads = Reads(q, monkeypatch)
    wait = asyncio.create_task(q.wait(d.job.id, "t", 20, shared=True, with_body=False))
    await eventually_async(lambda: reads.done.count("hget") >= 4, what="four rechecks (each reads the status)")
    assert [len(w) for w in q.waiters._waiting.values()] == [1]
    await q.finish(d, JobStatus.SUCCEEDED, result=OK)
    job = await asyncio.wait_for(wait, 5)
    assert job is not None and job.status is JobStatus.SUCCEEDED and q.waiters._waiting == {}


async def test_the_reader_survives_its_connection_being_killed(q: Queue, valkey: ValkeyProcess) -> None:
    q._waiters = SharedWaiters(q.redis, q.keys.events, block_s=0.5, recheck_s=30)  # no recheck to fall back on
    first, second = await started(q, 2)
    wait = asyncio.create_task(q.wait(first.job.id, "t", 20, shared=True))
    await registered(q, first.job.id)
    await eventually_async(lambda: blocked_clients(valkey) >= 1, what="the reader's XREAD blocked")
    assert valkey.kill_clients() >= 1  # the blocked XREAD among them
    await q.finish(first, JobStatus.SUCCEEDED, result=OK)  # while the reader reconnects, or after
    job = await asyncio.wait_for(wait, 10)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    # and it keeps serving the next waiter
    again = asyncio.create_task(q.wait(second.job.id, "t", 20, shared=True))
    await registered(q, second.job.id)
    await q.finish(second, JobStatus.SUCCEEDED, result=OK)
    assert (await asyncio.wait_for(again, 10)).status is JobStatus.SUCCEEDED  # type: ignore[union-attr]


async def test_the_reader_stops_when_no_one_waits_and_starts_again_for_the_next_waiter(q: Queue,
                                                                                        valkey: ValkeyProcess) -> None:
    clock = FakeClock()
    q._waiters = SharedWaiters(q.redis, q.keys.events, block_s=0.1, idle_stop_s=60, clock=clock)
    first, second = await started(q, 2)
    assert await q.wait(first.job.id, "t", 0.2, shared=True) is not None  # times out: the job is running
    assert q.waiters.running
    clock.advance(60.1)  # a minute without waiters
    await eventually_async(lambda: not q.waiters.running, what="the idle reader to stop")
    assert blocked_clients(valkey) == 0
    wait = asyncio.create_task(q.wait(second.job.id, "t", 20, shared=True))
    await registered(q, second.job.id)
    assert q.waiters.running
    await q.finish(second, JobStatus.SUCCEEDED, result=OK)
    assert (await asyncio.wait_for(wait, 5)).status is JobStatus.SUCCEEDED  # type: ignore[union-attr]


async def test_a_job_that_ended_between_submit_and_wait_answers_at_once(q: Queue) -> None:
    [d] = await started(q, 1)
    await q.finish(d, JobStatus.SUCCEEDED, result=OK)
    job = await asyncio.wait_for(q.wait(d.job.id, "t", 20, shared=True), 2)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert await q.wait(d.job.id, "another tenant", 1, shared=True) is None


async def test_the_reader_hands_woken_waiters_their_records_read_in_one_round_trip(
    q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's waits (the job object, without the body): the reader reads the records of every waiter one
    event read woke, pipelined; a waiter reads its job once, before it waits, not again after the wake."""
    # no recheck within the test: a recheck is a waiter's own read (tested above), and on a loaded machine the 2 s
    # default came before the wake (CI: 4 of 50 waiters read their ended job themselves)
    q._waiters = SharedWaiters(q.redis, q.keys.events, block_s=0.5, recheck_s=60, job_key=q.keys.job)
    deliveries = await started(q, 50)
    own_reads: list[str] = []
    fields_read: set[tuple[object, ...]] = set()
    hmget = q.redis.hmget

    async def counted(key: str, *args: object) -> object:
        own_reads.append(key)
        fields_read.add(args)
        return await hmget(key, *args)

    monkeypatch.setattr(q.redis, "hmget", counted)
    waits = [asyncio.create_task(q.wait(d.job.id, "t", 30, shared=True, with_body=False)) for d in deliveries]
    stranger = asyncio.create_task(q.wait(deliveries[0].job.id, "another tenant", 30, shared=True, with_body=False))
    await eventually_async(lambda: len(own_reads) >= 51, what="every waiter's read before it waits")
    assert len(own_reads) == 51  # each waiter's read before it waits (the stranger's too)
    assert fields_read == {("status", "tenant", "expires_at", "started_at")}  # what tells whether to wait, no more
    # another tenant's job: unknown at its first read (awaited before the ends: a read counted above may not have
    # answered yet, and a waiter still registered when the ends come would be woken too)
    assert await asyncio.wait_for(stranger, 5) is None
    await q.finish_many([(d, JobStatus.SUCCEEDED, OK, None) for d in deliveries])
    jobs = await asyncio.wait_for(asyncio.gather(*waits), 5)
    assert [(j.id, j.status, j.result) for j in jobs if j] == [(d.job.id, JobStatus.SUCCEEDED, OK) for d in deliveries]
    assert len(own_reads) == 51  # none after the wake
    waiters = q.waiters
    assert waiters.wakes == 50 and waiters.records == 50
    assert 1 <= waiters.record_reads <= waiters.reads  # at most one round trip per event read


async def test_a_wait_that_runs_out_answers_the_job_as_it_is_then_and_a_job_past_its_ttl_expires_at_once(
    q: Queue
) -> None:
    job, _ = await q.enqueue("t", JobRequest(body=dict(BODY)))
    wait = asyncio.create_task(q.wait(job.id, "t", 1.0, shared=True, with_body=False))
    await registered(q, job.id)
    [d] = (await q.read("w1", 1))[0]  # started while the wait runs: not an end, so no wake
    answer = await asyncio.wait_for(wait, 5)
    assert answer is not None and answer.status is JobStatus.RUNNING and answer.started_at is not None
    await q.finish(d, JobStatus.SUCCEEDED, result=OK)

    late, _ = await q.enqueue("t", JobRequest(body=dict(BODY), ttl_s=1), now=1_000)  # long expired
    expired = await asyncio.wait_for(q.wait(late.id, "t", 20, shared=True, with_body=False), 2)
    assert expired is not None and expired.status is JobStatus.EXPIRED
    assert await q.wait(late.id, "another tenant", 20, shared=True) is None
    assert await q.wait("job_" + "a" * 26, "t", 20, shared=True) is None


class FailingPipelines:
    """The queue's client, but every pipeline fails with a connection error."""

    def __init__(self, redis: object) -> None:
        self._redis = redis

    def pipeline(self, *args: object, **kwargs: object) -> object:
        class Failing:
            def execute_command(self, *args: object) -> None:
                pass

            async def execute(self, raise_on_error: bool = True) -> None:
                raise redis.exceptions.ConnectionError("reset by peer")

        return Failing()

    def __getattr__(self, name: str) -> object:
        return getattr(self._redis, name)


async def test_a_reader_that_cannot_read_the_records_still_wakes_the_waiters_who_read_their_own(q: Queue) -> None:
    q._waiters = SharedWaiters(FailingPipelines(q.redis), q.keys.events, block_s=0.2, recheck_s=30,
                               job_key=q.keys.job)
    with pytest.raises(redis.exceptions.ConnectionError):  # the double fails as a connection would, nothing else
        await pipelined(q._waiters._redis, [("HMGET", "k", "f")])
    deliveries = await started(q, 3)
    waits = [asyncio.create_task(q.wait(d.job.id, "t", 20, shared=True, with_body=False)) for d in deliveries]
    await registered(q, *(d.job.id for d in deliveries))
    await q.finish_many([(d, JobStatus.FAILED, None, {"type": "x", "message": "y"}) for d in deliveries])
    jobs = await asyncio.wait_for(asyncio.gather(*waits), 5)  # well before the 30 s recheck
    assert [j.status for j in jobs if j] == [JobStatus.FAILED] * 3
    assert q.waiters.wakes == 3 and q.waiters.records == 0


async def test_waiters_woken_while_the_reader_is_stopped_are_still_resolved(q: Queue) -> None:
    """A reader stopped (cancelled) while it reads the woken jobs' records still resolves their futures, without
    records: the waiters read their own at once instead of waiting for the recheck."""
    release, stalled = asyncio.Event(), asyncio.Event()

    class Stalled:
        def execute_command(self, *args: object) -> None:
            pass

        async def execute(self, raise_on_error: bool = True) -> None:
            stalled.set()
            await release.wait()  # never released: the reader is stopped meanwhile

    class StalledPipelines(FailingPipelines):
        def pipeline(self, *args: object, **kwargs: object) -> object:
            return Stalled()

    q._waiters = SharedWaiters(StalledPipelines(q.redis), q.keys.events, block_s=0.2, recheck_s=30,
                               job_key=q.keys.job)
    [d] = await started(q, 1)
    wait = asyncio.create_task(q.wait(d.job.id, "t", 20, shared=True, with_body=False))
    await registered(q, d.job.id)
    await q.finish(d, JobStatus.SUCCEEDED, result=OK)
    await asyncio.wait_for(stalled.wait(), 10)  # the event is read; the records' read stalls
    assert not wait.done()
    await q.waiters.aclose()
    job = await asyncio.wait_for(wait, 5)  # well before the 30 s recheck
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.result == OK
    assert q.waiters.records == 0


class Reads:
    """The queue's own job reads (HMGET, HGETALL, HGET), counted when made (``calls``) and when answered
    (``done``); the reader's pipelined reads are not among them."""

    def __init__(self, q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self.done: list[str] = []
        for name in ("hmget", "hgetall", "hget"):
            original = getattr(q.redis, name)

            async def counted(*args: object, _name: str = name, _original: Any = original) -> object:
                self.calls.append(_name)
                answer = await _original(*args)
                self.done.append(_name)
                return answer

            monkeypatch.setattr(q.redis, name, counted)


async def registered(q: Queue, *job_ids: str) -> None:
    """Until a waiter of each job is registered with the queue's reader."""
    await eventually_async(lambda: all(q.waiters.waiting(job_id) for job_id in job_ids),
                           what=f"waiters of {len(job_ids)} job(s) registered")


async def reader_running(q: Queue) -> None:
    """Start the queue's reader the way a first waiter does (a short wait for an unknown job)."""
    assert await q.wait("job_" + "b" * 26, "t", 0.05, shared=True) is None
    assert q.waiters.running


async def test_a_job_submitted_here_is_waited_for_without_a_read_before_the_wake(
    q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's commonest use, submit then wait, on one process: the submit names the job to the running
    reader, so the wait blocks at once, and the job comes with the wake (the reader's one pipelined read)."""
    await reader_running(q)
    jobs = [(await q.enqueue("t", JobRequest(body=dict(BODY))))[0] for _ in range(20)]
    assert all(q.waiters.expected(job.id, "t") is False for job in jobs)
    assert q.waiters.expected(jobs[0].id, "another tenant") is None
    reads = Reads(q, monkeypatch)
    waits = [asyncio.create_task(q.wait(job.id, "t", 30, shared=True, with_body=False)) for job in jobs]
    stranger = asyncio.create_task(q.wait(jobs[0].id, "another tenant", 30, shared=True, with_body=False))
    assert await asyncio.wait_for(stranger, 5) is None
    await registered(q, *(job.id for job in jobs))
    assert reads.calls == ["hmget"]  # the stranger's: another tenant's job is read, and unknown to it
    deliveries = []
    while len(deliveries) < len(jobs):
        deliveries += (await q.read("w1", len(jobs)))[0]
    await q.finish_many([(d, JobStatus.SUCCEEDED, OK, None) for d in deliveries])
    done = await asyncio.wait_for(asyncio.gather(*waits), 5)  # well before any recheck
    assert [(j.id, j.status, j.result) for j in done if j] == [(job.id, JobStatus.SUCCEEDED, OK) for job in jobs]
    assert reads.calls == ["hmget"]  # no read before the waits, none after the wakes
    assert all(q.waiters.expected(job.id, "t") is None for job in jobs)  # forgotten once answered


async def test_a_job_submitted_here_that_ended_before_its_wait_is_read_once(
    q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    await reader_running(q)
    job, _ = await q.enqueue("t", JobRequest(body=dict(BODY)))
    [d] = (await q.read("w1", 1))[0]
    await q.finish(d, JobStatus.SUCCEEDED, result=OK)
    await eventually_async(lambda: q.waiters.expected(job.id, "t"), what="the reader to read the end")
    reads = Reads(q, monkeypatch)
    answer = await asyncio.wait_for(q.wait(job.id, "t", 20, shared=True, with_body=False), 2)
    assert answer is not None and answer.status is JobStatus.SUCCEEDED and answer.result == OK
    assert reads.calls == ["hmget"]  # the job object's read, nothing before it


async def test_a_job_submitted_here_that_ended_and_was_redriven_is_waited_for_again(
    q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    await reader_running(q)
    job, _ = await q.enqueue("t", JobRequest(body=dict(BODY)))
    outcome = None
    for _ in range(3):  # max_attempts 3
        (d,), _ = await q.read("w1", 1)
        outcome = await q.retry(d, delay_ms=0, error={"type": "x", "message": "y"})
    assert outcome is Outcome.DEAD_LETTERED
    await eventually_async(lambda: q.waiters.expected(job.id, "t"), what="the reader to read the end")
    assert (await q.redrive("t", job.id)).status is JobStatus.QUEUED
    reads = Reads(q, monkeypatch)
    wait = asyncio.create_task(q.wait(job.id, "t", 20, shared=True, with_body=False))
    await eventually_async(lambda: reads.done, what="the wait's read of the job")
    assert not wait.done()  # queued again: worth waiting for, not answered as it was read
    (d,), _ = await q.read("w1", 1)
    await q.finish(d, JobStatus.SUCCEEDED, result=OK)
    answer = await asyncio.wait_for(wait, 5)
    assert answer is not None and answer.status is JobStatus.SUCCEEDED


async def test_nothing_is_expected_without_a_running_reader_nor_across_its_restart_nor_with_a_ttl(
    q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader sees an end only while it runs: a job submitted while it is stopped, or before it stopped and
    started again, is read before its wait as any other; a job with a ttl_s is read too (it may have expired)."""
    clock = FakeClock()
    q._waiters = SharedWaiters(q.redis, q.keys.events, block_s=0.1, idle_stop_s=60, job_key=q.keys.job, clock=clock)
    unseen, _ = await q.enqueue("t", JobRequest(body=dict(BODY)))
    assert q.waiters.expected(unseen.id, "t") is None  # no reader yet
    await reader_running(q)
    before, _ = await q.enqueue("t", JobRequest(body=dict(BODY)))
    with_ttl, _ = await q.enqueue("t", JobRequest(body=dict(BODY), ttl_s=60))
    assert q.waiters.expected(before.id, "t") is False and q.waiters.expected(with_ttl.id, "t") is None
    clock.advance(60.1)
    await eventually_async(lambda: not q.waiters.running, what="the reader to stop: no one waited")
    reads = Reads(q, monkeypatch)
    wait = asyncio.create_task(q.wait(before.id, "t", 20, shared=True, with_body=False))
    await eventually_async(lambda: reads.done, what="the wait's read of the job")
    assert q.waiters.running and q.waiters.expected(before.id, "t") is None  # a new run knows nothing
    assert reads.calls == ["hmget"]  # read before it waits, as any other job
    deliveries = []
    while len(deliveries) < 3:
        deliveries += (await q.read("w1", 3))[0]
    await q.finish_many([(d, JobStatus.SUCCEEDED, OK, None) for d in deliveries])
    answer = await asyncio.wait_for(wait, 5)
    assert answer is not None and answer.status is JobStatus.SUCCEEDED


async def test_an_idempotent_replay_or_a_refused_submit_leaves_nothing_expected(valkey: ValkeyProcess,
                                                                               queue_name: str) -> None:
    q = Queue.connect(Settings(redis_url=valkey.url, queue=queue_name, max_queue_depth=1))
    await q.ensure_groups()
    try:
        await reader_running(q)
        first, replay = await q.enqueue("t", JobRequest(body=dict(BODY), idempotency_key="k"))
        assert not replay and q.waiters.expected(first.id, "t") is False
        again, replay = await q.enqueue("t", JobRequest(body=dict(BODY), idempotency_key="k"))
        assert replay and again.id == first.id
        with pytest.raises(QueueFull):
            await q.enqueue("t", JobRequest(body=dict(BODY)))
        assert list(q.waiters._expected) == [first.id]  # the replay's and the refused submit's ids are dropped
    finally:
        await q.close()


async def test_a_bug_stops_the_reader_and_fails_its_waiters_instead_of_being_retried_forever(
    q: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """A fault that waiting does not cure (here the events stream replaced by a string: WRONGTYPE) is not retried
    in the background: the reader stops, logs it, and the waits fail with it (the gateway's logged 500); a later
    wait starts a reader that tries once more, and fails at once rather than hanging."""
    [d] = await started(q, 1)
    q._waiters = SharedWaiters(q.redis, q.keys.events, block_s=0.1, recheck_s=30)  # no recheck within the test
    wait = asyncio.create_task(q.wait(d.job.id, "t", 20, shared=True))
    await registered(q, d.job.id)
    await q.redis.delete(q.keys.events)
    await q.redis.set(q.keys.events, "not a stream")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await asyncio.wait_for(wait, 10)
    assert not q.waiters.running
    assert "waiters reader: stopped by an unexpected error" in caplog.text
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await asyncio.wait_for(q.wait(d.job.id, "t", 20, shared=True), 10)
    assert not q.waiters.running
    await q.redis.delete(q.keys.events)
    await q.finish(d, JobStatus.SUCCEEDED, result=OK)  # once repaired, waits are served again
    answer = await asyncio.wait_for(q.wait(d.job.id, "t", 20, shared=True), 10)
    assert answer is not None and answer.status is JobStatus.SUCCEEDED
