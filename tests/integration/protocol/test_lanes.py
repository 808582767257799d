"""Priority lanes against a real Valkey, standalone and in cluster mode, and each again with every script call
resent (conftest.py): reads take higher lanes first within the starvation bound, and every guarantee holds per
lane -- a job's entries stay in its lane's stream through retries, promotion, releases, reclaims, dead-lettering
and redrive; cancel, expiry, lease renewal and crash-looping deliveries work in each lane; a blocking read never
starts more than it was asked for; the scaler's view counts every lane."""

from __future__ import annotations

from typing import Any

import pytest

from inferq.queue.jobs import LANES, JobRequest, JobStatus, Priority
from inferq.queue.keys import GROUP
from inferq.queue.protocol import JobTerminal, Lease, Outcome, Queue, now_ms
from tests.support.queued import read_all

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
ERROR = {"type": "server_error", "message": "503"}
RESULT = {"status_code": 200, "body": {}}
PLAIN = ["standalone", "cluster"]


def req(lane: Priority = Priority.NORMAL, **kw: object) -> JobRequest:
    return JobRequest(body=dict(CHAT), priority=lane, **kw)  # type: ignore[arg-type]


async def places(q: Queue, job_id: str) -> dict[Priority, int]:
    """How many entries of the job each lane's stream holds."""
    found = {}
    for lane in LANES:
        found[lane] = sum(1 for _, f in await q.redis.xrange(q.keys.stream_of(lane)) if f["job"] == job_id)
    return found


def only(lane: Priority, n: int = 1) -> dict[Priority, int]:
    return {other: (n if other is lane else 0) for other in LANES}


async def empty(q: Queue) -> bool:
    return all([await q.redis.xlen(stream) == 0 for stream in q.keys.lane_streams])


# ---------------------------------------------------------------- order and share


async def test_reads_take_high_then_normal_then_low(q: Queue) -> None:
    low, _ = await q.enqueue("t", req(Priority.LOW))
    normal, _ = await q.enqueue("t", req(Priority.NORMAL))
    high, _ = await q.enqueue("t", req(Priority.HIGH))
    order = []
    for _ in range(3):
        (d,), _ = await q.read("w1", 1)
        order.append((d.job.id, d.lane, d.job.priority))
    assert order == [(high.id, Priority.HIGH, Priority.HIGH), (normal.id, Priority.NORMAL, Priority.NORMAL),
                     (low.id, Priority.LOW, Priority.LOW)]


async def test_a_high_job_submitted_after_a_low_backlog_is_taken_first(q: Queue) -> None:
    backlog = [(await q.enqueue("t", req(Priority.LOW)))[0].id for _ in range(5)]
    high, _ = await q.enqueue("t", req(Priority.HIGH))
    (first,), _ = await q.read("w1", 1)
    assert first.job.id == high.id
    taken = [d.job.id for d in (await read_all(q, "w1", 5))[0]]
    assert taken == backlog  # and the low lane stays in its own order


@pytest.mark.parametrize("q", PLAIN, indirect=True)
@pytest.mark.parametrize("window", [1, 4])
async def test_a_low_backlog_gets_at_least_a_tenth_of_the_takes_under_a_constant_high_stream(
    q: Queue, window: int
) -> None:
    """Counted in takes: 100 takes while the high lane never runs dry (it holds more than 100)."""
    q.settings = q.settings.replace(max_queue_depth=0)
    await q.enqueue_many("t", [req(Priority.LOW) for _ in range(40)])
    await q.enqueue_many("t", [req(Priority.HIGH) for _ in range(110)])
    takes = dict.fromkeys(LANES, 0)
    while sum(takes.values()) < 100:
        got, _ = await q.read("w1", window)
        for d in got:
            takes[d.lane] += 1
            assert await q.finish(d, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
    assert await q.redis.xlen(q.keys.stream_of("high")) > 0  # high was never empty
    assert takes[Priority.LOW] >= sum(takes.values()) // 10, takes
    assert takes[Priority.HIGH] >= 80, takes


async def test_a_blocking_read_that_finds_several_lanes_starts_only_what_it_may(q: Queue) -> None:
    """COUNT applies per stream in a read across the lanes: the extra entries go back to the end of their lane,
    unstarted, with no attempt or delivery spent, and no longer pending on the reader."""
    high, _ = await q.enqueue("t", req(Priority.HIGH))
    normal, _ = await q.enqueue("t", req(Priority.NORMAL))
    low, _ = await q.enqueue("t", req(Priority.LOW))
    (d,), skipped = await q.read_blocking("w1", 1, 100)
    assert d.job.id == high.id and skipped == []
    for job, lane in ((normal, Priority.NORMAL), (low, Priority.LOW)):
        stored = await q.get(job.id)
        assert stored and stored.status is JobStatus.QUEUED and stored.attempts == 1 and stored.deliveries == 0
        assert stored.entry != job.entry and await places(q, job.id) == only(lane)
        assert (await q.redis.xpending(q.keys.stream_of(lane), GROUP))["pending"] == 0
    got, _ = await q.read("w2", 5)
    assert {x.job.id for x in got} == {normal.id, low.id}


# ---------------------------------------------------------------- every guarantee, per lane


@pytest.mark.parametrize("lane", list(Priority))
async def test_a_retry_keeps_the_lane_at_once_and_after_its_backoff(q: Queue, lane: Priority) -> None:
    job, _ = await q.enqueue("t", req(lane))
    (d,), _ = await q.read("w1", 1)
    assert await q.retry(d, delay_ms=0, error=ERROR) is Outcome.RETRY_SCHEDULED
    assert await places(q, job.id) == only(lane)
    (d,), _ = await q.read("w1", 1)
    assert d.lane is lane and d.attempt == 2
    assert await q.retry(d, delay_ms=5_000, error=ERROR) is Outcome.RETRY_SCHEDULED
    assert await places(q, job.id) == only(lane, 0)
    assert await q.promote(now=now_ms() + 10_000) == 1
    assert await places(q, job.id) == only(lane)
    (d,), _ = await q.read("w1", 1)
    assert d.lane is lane and d.attempt == 3


@pytest.mark.parametrize("lane", list(Priority))
async def test_a_release_and_a_reclaim_keep_the_lane(q: Queue, lane: Priority) -> None:
    job, _ = await q.enqueue("t", req(lane))
    (d,), _ = await q.read("w1", 1)
    assert await q.release(d) is Outcome.RELEASED
    assert await places(q, job.id) == only(lane)
    (d,), _ = await q.read("w1", 1)
    (stolen,), _ = await q.reclaim("w2", 1)  # claim-idle 0: w1 looks dead at once
    assert stolen.job.id == job.id and stolen.lane is lane and stolen.reclaimed
    assert await q.renew("w1", [d]) == [Lease.LOST]
    assert await q.finish(d, JobStatus.SUCCEEDED, result=RESULT) is Outcome.STALE
    assert await q.finish(stolen, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
    assert await empty(q) and (await q.stats())["unfinished"] == 0


@pytest.mark.parametrize("lane", list(Priority))
async def test_a_dead_lettered_job_is_redriven_into_its_own_lane(q: Queue, lane: Priority) -> None:
    job, _ = await q.enqueue("t", req(lane))
    outcome = None
    for _ in range(3):  # max_attempts 3
        (d,), _ = await q.read("w1", 1)
        outcome = await q.retry(d, delay_ms=0, error=ERROR)
    assert outcome is Outcome.DEAD_LETTERED and await empty(q)
    redriven = await q.redrive("t", job.id)
    assert redriven.status is JobStatus.QUEUED and redriven.priority is lane
    assert await places(q, job.id) == only(lane)
    (d,), _ = await q.read("w1", 1)
    assert d.job.id == job.id and d.lane is lane and d.attempt == 1


@pytest.mark.parametrize("lane", list(Priority))
async def test_a_job_that_crashes_its_workers_is_dead_lettered_in_any_lane(q: Queue, lane: Priority) -> None:
    job, _ = await q.enqueue("t", req(lane))
    await q.read("w1", 1)            # delivery 1: w1 dies
    await q.reclaim("w2", 1)         # delivery 2: w2 dies (max_deliveries 2)
    got, skipped = await q.reclaim("w3", 1)
    assert got == [] and skipped[0].status == "failed"
    stored = await q.get(job.id)
    assert stored and stored.dead_lettered and stored.priority is lane and await empty(q)


@pytest.mark.parametrize("lane", list(Priority))
async def test_cancel_works_in_every_lane_queued_or_running(q: Queue, lane: Priority) -> None:
    queued, _ = await q.enqueue("t", req(lane))
    assert (await q.cancel("t", queued.id)).status is JobStatus.CANCELLED
    assert await places(q, queued.id) == only(lane, 0)
    running, _ = await q.enqueue("t", req(lane))
    (d,), _ = await q.read("w1", 1)
    await q.cancel("t", running.id)
    assert await q.renew("w1", [d]) == [Lease.CANCEL_REQUESTED]
    assert await q.finish(d, JobStatus.CANCELLED, error={"type": "cancelled", "message": "c"}) is Outcome.WRITTEN
    with pytest.raises(JobTerminal):
        await q.cancel("t", running.id)
    assert await empty(q) and (await q.stats())["unfinished"] == 0


@pytest.mark.parametrize("lane", list(Priority))
async def test_a_job_past_its_ttl_expires_from_every_lane(q: Queue, lane: Priority) -> None:
    swept, _ = await q.enqueue("t", req(lane, ttl_s=1), now=now_ms() - 5000)
    read, _ = await q.enqueue("t", req(lane, ttl_s=1), now=now_ms() - 5000)
    assert await q.expire_due() == 2
    for job in (swept, read):
        stored = await q.get(job.id)
        assert stored and stored.status is JobStatus.EXPIRED and await places(q, job.id) == only(lane, 0)


@pytest.mark.parametrize("lane", list(Priority))
async def test_an_idempotency_key_gives_one_job_and_one_entry_in_its_lane(q: Queue, lane: Priority) -> None:
    first, _ = await q.enqueue("t", req(lane, idempotency_key="k"))
    again, replayed = await q.enqueue("t", req(lane, idempotency_key="k"))
    assert replayed and again.id == first.id and again.priority is lane
    assert await places(q, first.id) == only(lane)


async def test_renewal_covers_deliveries_of_every_lane_in_one_call(q: Queue) -> None:
    for lane in (Priority.LOW, Priority.HIGH, Priority.NORMAL):
        await q.enqueue("t", req(lane))
    held, _ = await q.read("w1", 3)
    assert [d.lane for d in held] == [Priority.HIGH, Priority.NORMAL, Priority.LOW]
    (stolen,), _ = await q.reclaim("w2", 1)  # the high one
    assert stolen.lane is Priority.HIGH
    assert await q.renew("w1", list(reversed(held))) == [Lease.HELD, Lease.HELD, Lease.LOST]


async def test_the_scalers_view_counts_every_lane(q: Queue) -> None:
    for lane, n in ((Priority.HIGH, 1), (Priority.NORMAL, 2), (Priority.LOW, 3)):
        await q.enqueue_many("t", [req(lane) for _ in range(n)])
    seen = await q.observe()
    assert (seen.lag, seen.pending) == (6, 0)
    assert seen.lag_by_lane == {Priority.HIGH: 1, Priority.NORMAL: 2, Priority.LOW: 3}
    await q.read("w1", 2)  # high, then normal
    seen = await q.observe()
    assert (seen.lag, seen.pending, seen.backlog) == (4, 2, 6)
    assert seen.lag_by_lane == {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 3}


async def test_a_stopped_workers_consumers_go_from_every_lane_but_the_one_it_still_holds(q: Queue) -> None:
    await q.enqueue("t", req(Priority.LOW))
    await q.read("w1", 1, 10)  # reads (and so joins) every lane; holds the low entry
    await q.forget_worker("w1")
    for lane in LANES:
        names = {c["name"] for c in await q.redis.xinfo_consumers(q.keys.stream_of(lane), GROUP)}
        assert names == ({"w1"} if lane is Priority.LOW else set()), lane


async def test_a_consumer_that_found_every_lane_drained_reads_with_one_blocking_read(
    q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a read found every lane short, the next read is one XREADGROUP across the lanes (it answers at once what
    came meanwhile); a read that fills the free slots, or finds a lane with more, reads lane by lane again. (First
    come, first served: the backlog is in the stream for one read to find, as fair share would not leave it; with
    fair share, tests/integration/protocol/test_fairshare.py.)"""
    q.settings = q.settings.replace(fair_share=False)
    reads: list[int] = []
    xreadgroup = q.redis.xreadgroup

    async def counted(group: str, consumer: str, streams: dict[str, str], *args: Any, **kwargs: Any) -> Any:
        reads.append(len(streams))
        return await xreadgroup(group, consumer, streams, *args, **kwargs)

    monkeypatch.setattr(q.redis, "xreadgroup", counted)
    await q.enqueue("t", req(Priority.NORMAL))
    (d,), _ = await q.read("w1", 4, block_ms=10)
    assert reads == [1, 1, 1]  # lane by lane: each came back short
    reads.clear()
    low, _ = await q.enqueue("t", req(Priority.LOW))
    high, _ = await q.enqueue("t", req(Priority.HIGH))
    got, _ = await q.read("w1", 4, block_ms=1000)
    assert reads == [3] and [x.job.id for x in got] == [high.id, low.id]  # one read across the lanes
    reads.clear()
    backlog = [(await q.enqueue("t", req()))[0].id for _ in range(5)]
    full, _ = await q.read("w1", 4, block_ms=1000)
    assert reads == [3] and [x.job.id for x in full] == backlog[:4]
    reads.clear()
    (last,), _ = await q.read("w1", 4, block_ms=1000)  # the last read filled the slots: lane by lane again
    assert reads == [1, 1, 1] and last.job.id == backlog[4]
    for x in [d, *got, *full, last]:
        assert await q.finish(x, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
