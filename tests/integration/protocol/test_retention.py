"""What the queue keeps once a job ends (issue 40), in every mode of the ``q`` fixture: the request body is dropped
with the terminal transition unless the job is dead-lettered (a redrive runs it again); a tenant's dead letters are
read from its own part of the dead-letter index, newest first, without touching another tenant's; a poison
dead-letter ends the job after one attempt."""

from __future__ import annotations

from typing import Any

import pytest

from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.protocol import Delivery, NotDeadLettered, Outcome, Queue, now_ms

from .resend import Resending

CHAT = {"model": "m", "messages": [{"role": "user", "content": "secret prompt"}]}
ERROR = {"type": "engine_died", "message": "the model server died"}


def req(**kw: Any) -> JobRequest:
    return JobRequest(body=dict(CHAT), **kw)


async def _read(q: Queue, count: int) -> list[Delivery]:
    got: list[Delivery] = []
    while len(got) < count:
        deliveries, _ = await q.read("w1", count - len(got))
        assert deliveries, "nothing to read"
        got += deliveries
    return got


async def _dead_letter(q: Queue, tenant: str, n: int = 1) -> list[str]:
    ids = [(await q.enqueue(tenant, req()))[0].id for _ in range(n)]
    for delivery in await _read(q, n):
        assert await q.retry(delivery, delay_ms=0, error=ERROR, dead_letter="engine_died") is Outcome.DEAD_LETTERED
    return ids


async def test_an_ended_jobs_body_is_dropped_and_a_dead_lettered_one_keeps_it_for_its_redrive(q: Queue) -> None:
    done, _ = await q.enqueue("t", req())
    failed, _ = await q.enqueue("t", req())
    running, _ = await q.enqueue("t", req())
    deliveries = {d.job.id: d for d in await _read(q, 3)}
    await q.finish(deliveries[done.id], JobStatus.SUCCEEDED, result={"status_code": 200, "body": {}})
    await q.finish(deliveries[failed.id], JobStatus.FAILED, error={"type": "model_error", "message": "m"})
    assert await q.retry(deliveries[running.id], delay_ms=0, error=ERROR, dead_letter="engine_died") \
        is Outcome.DEAD_LETTERED
    queued, _ = await q.enqueue("t", req())
    await q.cancel("t", queued.id)
    for job_id in (done.id, failed.id, queued.id):
        assert not await q.redis.hexists(q.keys.job(job_id), "body")
        assert (await q.get(job_id, "t")).status.terminal  # type: ignore[union-attr]
    dead = await q.get(running.id, "t")
    assert dead is not None and dead.dead_lettered and dead.attempts == 1 and dead.body == CHAT

    redriven = await q.redrive("t", running.id, operator=True)  # engine_died: an operator's
    assert redriven.status is JobStatus.QUEUED
    [again] = await _read(q, 1)
    assert again.job.id == running.id and again.job.body == CHAT  # the redrive runs the request as it was


async def test_a_tenants_dead_letters_come_from_its_own_index_newest_first(q: Queue) -> None:
    mine = await _dead_letter(q, "a", 3)
    theirs = await _dead_letter(q, "b", 2)
    assert [j.id for j in await q.dead_letters("a", 10)] == list(reversed(mine))
    assert [j.id for j in await q.dead_letters("b", 10)] == list(reversed(theirs))
    assert [j.id for j in await q.dead_letters("a", 2)] == list(reversed(mine))[:2]
    assert await q.dead_letters("a.b", 10) == [] and await q.dead_letters("", 10) == []
    members = await q.redis.zrange(q.keys.dlq_index, 0, -1)
    assert sorted(m.split("|")[0] for m in members) == ["a", "a", "a", "b", "b"]

    # redriven: no longer listed, its member removed; dead-lettered again: listed once, as the newest
    await q.redrive("a", mine[0], operator=True)  # engine_died: an operator's
    assert [j.id for j in await q.dead_letters("a", 10)] == [mine[2], mine[1]]
    assert len(await q.redis.zrange(q.keys.dlq_index, 0, -1)) == 4
    [delivery] = await _read(q, 1)
    await q.retry(delivery, delay_ms=0, error=ERROR, dead_letter="engine_died")
    assert [j.id for j in await q.dead_letters("a", 10)] == [mine[0], mine[2], mine[1]]


async def test_a_tenants_index_members_older_than_the_result_ttl_are_trimmed_when_it_dead_letters_again(
    q: Queue
) -> None:
    old = f"a|{9999999999999 - (now_ms() - (q.settings.result_ttl_s + 60) * 1000):013d}|9999999999|job_gone"
    other = f"b|{9999999999999 - (now_ms() - (q.settings.result_ttl_s + 60) * 1000):013d}|9999999999|job_gone"
    await q.redis.zadd(q.keys.dlq_index, {old: 0, other: 0})
    await _dead_letter(q, "a")
    members = await q.redis.zrange(q.keys.dlq_index, 0, -1)
    assert old not in members and other in members and len(members) == 2


@pytest.mark.parametrize("q", ["standalone"], indirect=True)
async def test_listing_one_tenant_reads_none_of_another_tenants_dead_letters(q: Queue) -> None:
    await _dead_letter(q, "busy", 30)
    [mine] = await _dead_letter(q, "quiet")
    reads: list[str] = []
    real = q.redis.pipeline

    def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = real(*args, **kwargs)
        hgetall = pipe.hgetall

        def counted(key: str) -> Any:
            reads.append(key)
            return hgetall(key)

        pipe.hgetall = counted
        return pipe

    q.redis.pipeline = counting_pipeline  # type: ignore[method-assign]
    assert [j.id for j in await q.dead_letters("quiet", 20)] == [mine]
    assert reads == [q.keys.job(mine)]


async def test_a_redrive_resets_the_engine_death_strikes_and_removes_the_jobs_index_member(q: Queue) -> None:
    """Issue 40 leftovers, point 4: the redrive itself (not a later listing) removes the job's member of the tenant's
    dead-letter index, and the engine deaths counted against the job start again from none; in the ``*-resent``
    modes every script call, the redrive's included, runs twice and the copy changes nothing (G9)."""
    [other] = await _dead_letter(q, "a")
    job, _ = await q.enqueue("a", req())
    [delivery] = await _read(q, 1)
    # the engine died twice while running it: poison at two strikes
    assert await q.retry(delivery, delay_ms=0, error=ERROR, dead_letter="engine_died", strikes=2) \
        is Outcome.RETRY_SCHEDULED
    [delivery] = await _read(q, 1)
    assert await q.retry(delivery, delay_ms=0, error=ERROR, dead_letter="engine_died", strikes=2) \
        is Outcome.DEAD_LETTERED
    assert await q.redis.hget(q.keys.job(job.id), "strikes") == "2"
    members = await q.redis.zrange(q.keys.dlq_index, 0, -1)
    assert sorted(m.rsplit("|", 1)[-1] for m in members) == sorted([job.id, other])

    redriven = await q.redrive("a", job.id, operator=True)  # engine_died: an operator's
    assert redriven.status is JobStatus.QUEUED and not redriven.dead_lettered
    assert not await q.redis.hexists(q.keys.job(job.id), "strikes")
    assert [m.rsplit("|", 1)[-1] for m in await q.redis.zrange(q.keys.dlq_index, 0, -1)] == [other]
    assert await q.redis.xlen(q.keys.dlq) == 1
    # one engine death after the redrive is the first strike again: retried, not dead-lettered at once
    [delivery] = await _read(q, 1)
    assert await q.retry(delivery, delay_ms=0, error=ERROR, dead_letter="engine_died", strikes=2) \
        is Outcome.RETRY_SCHEDULED
    assert await q.redis.hget(q.keys.job(job.id), "strikes") == "1"
    # a second redrive of the same job (not dead-lettered now) is refused and changes nothing
    before = await q.redis.zrange(q.keys.dlq_index, 0, -1)
    with pytest.raises(NotDeadLettered):
        await q.redrive("a", job.id, operator=True)
    assert await q.redis.zrange(q.keys.dlq_index, 0, -1) == before
    if isinstance(q.scripts, Resending):
        assert q.scripts.checked.get("redrive", 0) >= 1
