"""A worker's reads against a real Valkey (inferq/scripts/take.lua and Consumer.read), standalone and in cluster
mode, and each again with every script call resent (conftest.py): one round trip per read, whatever the lanes
hold; a read whose answer was lost, or what a previous process of the same name left pending, is taken again by
the next read instead of waiting to be reclaimed; held entries beyond the free slots wait for the next read; a
worker that keeps the queue drained reads with one blocking read."""

from __future__ import annotations

from typing import Any

import pytest

from inferq.jobs import JobRequest, JobStatus, Priority
from inferq.keys import GROUP
from inferq.queue import Outcome, Queue
from tests.integration.protocol.resend import Resending
from tests.integration.protocol.test_transitions import commandstats_calls

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
RESULT = {"status_code": 200, "body": {}}


def req(lane: Priority = Priority.NORMAL) -> JobRequest:
    return JobRequest(body=dict(CHAT), priority=lane)


def copies(q: Queue) -> int:
    """How many times each script call reaches the server (twice when every call is resent)."""
    return 2 if isinstance(q.scripts, Resending) else 1


async def round_trips(q: Queue, monkeypatch: pytest.MonkeyPatch, read: Any) -> tuple[Any, dict[str, int]]:
    """What ``read`` answered and the reading commands the client sent: script calls (take, start; counted by the
    server) and XREADGROUPs (counted here: the server's count includes those a script makes)."""
    sent = {"xreadgroup": 0}
    xreadgroup = q.redis.xreadgroup

    async def counted(*args: Any, **kwargs: Any) -> Any:
        sent["xreadgroup"] += 1
        return await xreadgroup(*args, **kwargs)

    monkeypatch.setattr(q.redis, "xreadgroup", counted)
    before = await commandstats_calls(q, "evalsha")
    answer = await read
    monkeypatch.undo()
    return answer, {"evalsha": await commandstats_calls(q, "evalsha") - before, **sent}


async def test_a_read_across_the_lanes_is_one_take_whatever_they_hold(
    q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's reads (the owed low take, then high, normal, low) are made in one script call, and the entries
    are started by one more."""
    await q.enqueue("t", req())
    (warm,), _ = await q.read("w1", 1)  # the scripts are loaded (a first EVALSHA answers NOSCRIPT)
    await q.finish(warm, JobStatus.SUCCEEDED, result=RESULT)
    for lane in (Priority.LOW, Priority.NORMAL, Priority.HIGH, Priority.NORMAL):
        await q.enqueue("t", req(lane))
    (got, skipped), sent = await round_trips(q, monkeypatch, q.read("w1", 3))
    assert [d.lane for d in got] == [Priority.HIGH, Priority.NORMAL, Priority.NORMAL] and skipped == []
    assert sent == {"evalsha": 2 * copies(q), "xreadgroup": 0}
    (rest,), _ = await q.read("w1", 3)
    assert rest.lane is Priority.LOW


async def test_a_read_whose_answer_was_lost_is_taken_by_the_next_read(q: Queue) -> None:
    """The entries a take delivered are pending on the consumer though its answer never arrived: the next take
    answers them again (in lane order, then entry order) instead of new ones, so they start now, not after the
    claim timeout, and nothing else is taken meanwhile."""
    jobs = [(await q.enqueue("t", req(lane)))[0] for lane in (Priority.NORMAL, Priority.HIGH, Priority.NORMAL)]
    reads = q._reads_of("w1")
    lost = await q.scripts("take", q.keys.lane_streams, ["w1", 2, "0-0", "0-0", "0-0", 2, 0, 1, 0, 3, 0])
    assert len(lost) == 6  # two entries were delivered to w1; nobody saw them
    later, _ = await q.enqueue("t", req(Priority.HIGH))
    got, _ = await q.read("w1", 5)
    assert [d.job.id for d in got] == [jobs[1].id, jobs[0].id]
    assert all(d.job.status is JobStatus.RUNNING and d.job.deliveries == 1 for d in got)
    assert reads.delivered[Priority.HIGH] == got[0].entry_id
    got, _ = await q.read("w1", 5)
    assert [d.job.id for d in got] == [later.id, jobs[2].id]


async def test_held_entries_beyond_the_free_slots_wait_for_the_next_read(q: Queue) -> None:
    """A blocking read whose answer was lost took up to COUNT entries of each lane; the next takes start no more
    than their free slots of them, higher lanes first, and give none back (a previous holder may have started
    them)."""
    ids = {lane: [(await q.enqueue("t", req(lane)))[0].id for _ in range(2)] for lane in (Priority.HIGH,
                                                                                           Priority.LOW)}
    await q.redis.xreadgroup(GROUP, "w1", {q.keys.stream_of(lane): ">" for lane in (Priority.HIGH, Priority.LOW)},
                             count=2)
    first, _ = await q.read("w1", 3)
    assert [d.job.id for d in first] == [*ids[Priority.HIGH], ids[Priority.LOW][0]]
    second, _ = await q.read("w1", 3)
    assert [d.job.id for d in second] == [ids[Priority.LOW][1]]
    for lane in (Priority.HIGH, Priority.LOW):
        assert await q.redis.xlen(q.keys.stream_of(lane)) == 2  # nothing given back under a new entry
    for d in first + second:
        assert await q.finish(d, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN


async def test_a_worker_restarted_under_its_name_starts_what_its_predecessor_left_pending(q: Queue) -> None:
    """A new process of the same worker name (its first take knows no entry yet) is answered the entries its
    predecessor held: started again at once, as a further delivery of each job."""
    job, _ = await q.enqueue("t", req())
    (before,), _ = await q.read("w1", 1)  # the predecessor started it, then died
    successor = Queue(q.redis, q.settings)
    successor.scripts = q.scripts
    (again,), _ = await successor.read("w1", 4)
    assert again.job.id == job.id and again.entry_id == before.entry_id and again.job.deliveries == 2
    assert await q.finish(before, JobStatus.SUCCEEDED, result=RESULT) is Outcome.STALE
    assert await successor.finish(again, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN


async def test_a_worker_that_keeps_the_queue_drained_reads_with_one_blocking_read(
    q: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a read found every lane short, the next read is one XREADGROUP across the lanes, which answers at once
    what came meanwhile; a read that fills the slots takes again next time."""
    await q.enqueue("t", req())
    (warm,), _ = await q.read("w1", 4, block_ms=10)  # a take, which finds the lanes short
    await q.finish(warm, JobStatus.SUCCEEDED, result=RESULT)
    assert q._reads_of("w1").drained
    await q.enqueue("t", req())
    (got, _), sent = await round_trips(q, monkeypatch, q.read("w1", 4, block_ms=1000))
    assert len(got) == 1 and sent == {"evalsha": copies(q), "xreadgroup": 1}  # the blocking read, then start
    for _ in range(5):
        await q.enqueue("t", req())
    (full, _), sent = await round_trips(q, monkeypatch, q.read("w1", 4, block_ms=1000))
    assert len(full) == 4 and sent == {"evalsha": copies(q), "xreadgroup": 1}
    assert not q._reads_of("w1").drained  # the slots are full: there may be more
    (last, _), sent = await round_trips(q, monkeypatch, q.read("w1", 4, block_ms=1000))
    assert len(last) == 1 and sent == {"evalsha": 2 * copies(q), "xreadgroup": 0}  # a take, then start
    for d in [*got, *full, *last]:
        assert await q.finish(d, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN


async def test_a_read_of_a_stream_whose_group_is_gone_makes_it_again(q: Queue) -> None:
    await q.redis.delete(*q.keys.lane_streams)
    assert await q.read("w1", 4) == ([], [])
    await q.enqueue("t", req())
    (got,), _ = await q.read("w1", 4)
    assert got.job.status is JobStatus.RUNNING

