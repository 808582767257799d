"""The queue's expected work (``backlog_tokens`` in the stats hash, docs/data-model.md) against a real Valkey,
standalone and cluster mode, each also with every script resent (G9: the protocol conftest's ``q``): each
accepted job adds its ``tokens`` (its ``max_tokens``, or the default), every way a job ends takes them back, a
redrive adds them again, and a replayed submit adds nothing."""

from __future__ import annotations

from typing import Any

import pytest

from inferq.queue.jobs import DEFAULT_EXPECTED_TOKENS, JobRequest, JobStatus, expected_tokens
from inferq.queue.protocol import Outcome, Queue
from tests.support.queued import read_all

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
RESULT = {"status_code": 200, "body": {}}
ERROR = {"type": "server_error", "message": "the model server died"}


def chat(**body: Any) -> dict[str, Any]:
    return {**CHAT, **body}


@pytest.fixture
def sizing_by_work(q: Queue) -> None:
    """The counter is kept only while sizing by work is on (INFERQ_SCALE_TOKENS_PER_S > 0), for every process that
    enqueues (the gateway, the batch driver)."""
    q.settings = q.settings.replace(scale_tokens_per_s=200.0)


async def backlog_tokens(q: Queue) -> int:
    return int(await q.redis.hget(q.keys.stats, "backlog_tokens") or 0)


def test_a_jobs_expected_tokens_come_from_its_body() -> None:
    assert expected_tokens(chat(max_tokens=100)) == 100
    assert expected_tokens(chat(max_completion_tokens=40)) == 40
    assert expected_tokens(chat()) == DEFAULT_EXPECTED_TOKENS
    for odd in ("100", -1, True, 1.5, None):  # not a count of tokens: the default
        assert expected_tokens(chat(max_tokens=odd)) == DEFAULT_EXPECTED_TOKENS


@pytest.mark.usefixtures("sizing_by_work")
async def test_backlog_tokens_follow_the_unfinished_jobs_through_every_ending(q: Queue) -> None:
    done, _ = await q.enqueue("t", JobRequest(body=chat(max_tokens=100)))
    twice = JobRequest(body=chat(max_completion_tokens=40), idempotency_key="k")
    failed, _ = await q.enqueue("t", twice)
    _, replay = await q.enqueue("t", twice)
    assert replay
    cancelled, _ = await q.enqueue("t", JobRequest(body=chat()))
    await q.enqueue_many("t", [JobRequest(body=chat(max_tokens=7)) for _ in range(3)])
    assert await backlog_tokens(q) == 100 + 40 + DEFAULT_EXPECTED_TOKENS + 21  # the replay added nothing

    await q.cancel("t", cancelled.id)  # a queued job cancelled
    assert await backlog_tokens(q) == 100 + 40 + 21

    deliveries, _ = await read_all(q, "w1", 5)
    by_id = {d.job.id: d for d in deliveries}
    assert await q.finish(by_id.pop(done.id), JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
    assert await backlog_tokens(q) == 40 + 21

    dead = by_id.pop(failed.id)
    assert await q.retry(dead, delay_ms=0, error=ERROR, dead_letter="engine_died") is Outcome.DEAD_LETTERED
    assert await backlog_tokens(q) == 21
    await q.redrive("t", failed.id)  # its work counts again
    assert await backlog_tokens(q) == 40 + 21

    outcomes = await q.finish_many([(d, JobStatus.SUCCEEDED, RESULT, None) for d in by_id.values()])
    assert outcomes == [Outcome.WRITTEN] * 3
    (again,), _ = await q.read("w1", 10)
    assert await q.finish(again, JobStatus.FAILED, error=ERROR) is Outcome.WRITTEN
    assert await backlog_tokens(q) == 0
    assert int(await q.redis.hget(q.keys.stats, "unfinished") or 0) == 0


async def test_with_sizing_by_work_off_no_job_carries_tokens_and_the_counter_stays_unset(q: Queue) -> None:
    """The default (INFERQ_SCALE_TOKENS_PER_S=0): the queue pays nothing for the counter."""
    q.settings = q.settings.replace(scale_tokens_per_s=0.0)
    job, _ = await q.enqueue("t", JobRequest(body=chat(max_tokens=100)))
    assert await q.redis.hget(q.keys.job(job.id), "tokens") is None
    (delivery,), _ = await q.read("w1", 10)
    assert await q.finish(delivery, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
    assert await q.redis.hget(q.keys.stats, "backlog_tokens") is None
