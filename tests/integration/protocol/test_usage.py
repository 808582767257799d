"""Usage metering in the transitions that end a job (``includes/meter.lua``), against a real Valkey, standalone and
cluster, each also with every script call resent: every ending counts the job once into its tenant's row of the
hour (jobs by status, tokens, run and GPU time of all its attempts) and into the month's totals; what does not end a
job (a refused, stale, duplicate or resent write) counts nothing."""

from __future__ import annotations

import time
from typing import Any

import pytest

from inferq.queue.jobs import JobRequest, JobStatus, Priority
from inferq.queue.keys import USAGE_OTHER, USAGE_ROWS
from inferq.queue.protocol import Outcome, Queue, now_ms
from inferq.usage.periods import DAY_S, HOUR_S, hour_label, hour_start
from inferq.usage.report import Row, Source, usage
from inferq.usage.spend import Spend
from tests.support.queued import read_all

ERROR = {"type": "server_error", "message": "503"}


def req(model: str = "m", **kw: Any) -> JobRequest:
    return JobRequest(body={"model": model, "messages": [{"role": "user", "content": "hi"}]}, **kw)


async def rows_of(q: Queue, tenant: str | None = None) -> dict[tuple[str, str, str], Row]:
    now = time.time()
    found = await usage([Source(q.redis, q.keys, None, 1.0)], now - 2 * HOUR_S, now + HOUR_S, tenant=tenant)
    return {(r.tenant, r.model, r.lane): r for r in found}


def figures(row: Row) -> tuple[list[int], int, int, int, int]:
    return row.jobs, row.prompt_tokens, row.completion_tokens, row.run_ms, row.gpu_ms


async def test_each_ending_counts_the_job_once_with_all_its_attempts(q: Queue) -> None:
    q.settings = q.settings.replace(max_attempts=2)
    ok, _ = await q.enqueue("t", req())
    retried, _ = await q.enqueue("t", req())
    dead, _ = await q.enqueue("t", req(priority=Priority.HIGH))
    deliveries, _ = await read_all(q, "w1", 3)
    by_id = {d.job.id: d for d in deliveries}
    assert await q.finish(by_id[ok.id], JobStatus.SUCCEEDED, result={}, spend=Spend(100, 40, 7, 9)) is Outcome.WRITTEN
    assert await q.retry(by_id[retried.id], delay_ms=0, error=ERROR, spend=Spend(30, 10)) is Outcome.RETRY_SCHEDULED
    assert await q.retry(by_id[dead.id], delay_ms=0, error=ERROR, spend=Spend(5, 5)) is Outcome.RETRY_SCHEDULED
    again, _ = await read_all(q, "w1", 2)
    by_id = {d.job.id: d for d in again}
    # the second attempt's finish counts the first attempt's time too; the dead letter counts both of its attempts
    assert await q.finish(by_id[retried.id], JobStatus.FAILED, error=ERROR, spend=Spend(20, 20)) is Outcome.WRITTEN
    assert await q.retry(by_id[dead.id], delay_ms=0, error=ERROR, spend=Spend(6, 3)) is Outcome.DEAD_LETTERED
    # a duplicate result and a stale write count nothing
    assert await q.finish(by_id[retried.id], JobStatus.SUCCEEDED, result={},
                          spend=Spend(999, 999, 999, 999)) is Outcome.DUPLICATE
    rows = await rows_of(q)
    assert figures(rows[("t", "m", "normal")]) == ([1, 1, 0, 0], 7, 9, 150, 70)
    assert figures(rows[("t", "m", "high")]) == ([0, 1, 0, 0], 0, 0, 11, 8)
    assert await q.redis.keys(q.keys.prefix + "usage:month:*") == []  # the scaler sums the month, off this path


async def test_endings_without_a_worker_count_the_attempts_the_record_holds(q: Queue) -> None:
    queued, _ = await q.enqueue("a", req())
    await q.cancel("a", queued.id)                                                  # cancel: queued
    await q.enqueue("a", req(ttl_s=1), now=now_ms() - 5000)
    assert await q.expire_due() == 1                                                # expire
    await q.enqueue("a", req(ttl_s=1), now=now_ms() - 5000)
    _, skipped = await q.read("w1", 1)                                              # start: expired
    assert [s.status for s in skipped] == ["expired"]
    running, _ = await q.enqueue("a", req())
    (d,), _ = await q.read("w1", 1)
    assert await q.release(d, spend=Spend(40, 20)) is Outcome.RELEASED            # release: time kept
    (d,), _ = await q.read("w1", 1)
    await q.cancel("a", running.id)                                                 # cancel: running
    assert await q.retry(d, delay_ms=0, error=ERROR, spend=Spend(10, 10)) is Outcome.ENDED
    rows = await rows_of(q, "a")
    assert figures(rows[("a", "m", "normal")]) == ([0, 0, 2, 2], 0, 0, 50, 30)


async def test_a_redriven_job_counts_again_when_it_ends_again_with_only_its_new_attempts(q: Queue) -> None:
    q.settings = q.settings.replace(max_attempts=1)
    job, _ = await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)
    assert await q.retry(d, delay_ms=0, error=ERROR, spend=Spend(50, 50)) is Outcome.DEAD_LETTERED
    await q.redrive("t", job.id)
    (d,), _ = await q.read("w1", 1)
    assert await q.finish(d, JobStatus.SUCCEEDED, result={}, spend=Spend(10, 10, 1, 2)) is Outcome.WRITTEN
    assert figures((await rows_of(q))[("t", "m", "normal")]) == ([1, 1, 0, 0], 1, 2, 60, 60)


async def test_a_batch_of_finishes_is_counted_per_row_and_a_refused_one_taken_back(q: Queue) -> None:
    for tenant in ("a", "a", "b"):
        await q.enqueue(tenant, req())
    await q.enqueue("a", req("other-model"))
    deliveries, _ = await read_all(q, "w1", 4)
    first = deliveries[0]
    assert await q.finish(first, JobStatus.SUCCEEDED, result={}, spend=Spend(1, 1, 1, 1)) is Outcome.WRITTEN
    # the first again, as a late result (another write than the one it made: its resend would replay), and the others
    items: list[Any] = [(first, JobStatus.FAILED, None, ERROR, Spend(10, 5, 3, 4))]
    items += [(d, JobStatus.SUCCEEDED, {}, None, Spend(10, 5, 3, 4)) for d in deliveries[1:]]
    assert await q.finish_many(items) == [Outcome.DUPLICATE, Outcome.WRITTEN, Outcome.WRITTEN, Outcome.WRITTEN]
    # and the first write of the first delivery resent within a batch: replayed, not counted again
    assert await q.finish_many([(first, JobStatus.SUCCEEDED, {}, None, Spend(1, 1, 1, 1))]) == [Outcome.WRITTEN]
    rows = await rows_of(q)
    total = sum(r.jobs[0] for r in rows.values())
    assert total == 4 and sum(r.prompt_tokens for r in rows.values()) == 1 + 3 * 3
    assert rows[("a", "other-model", "normal")].jobs == [1, 0, 0, 0]
    assert rows[("b", "m", "normal")].jobs == [1, 0, 0, 0]


@pytest.mark.parametrize("q", ["standalone"], indirect=True)
async def test_metering_off_counts_nothing_and_leaves_the_record_alone(q: Queue) -> None:
    q.settings = q.settings.replace(usage_retention_days=0)
    await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)
    assert await q.retry(d, delay_ms=0, error=ERROR, spend=Spend(5, 5)) is Outcome.RETRY_SCHEDULED
    (d,), _ = await q.read("w1", 1)
    assert await q.finish(d, JobStatus.SUCCEEDED, result={}, spend=Spend(5, 5, 5, 5)) is Outcome.WRITTEN
    assert await q.redis.keys(q.keys.prefix + "usage:*") == []
    record = await q.redis.hgetall(q.keys.job(d.job.id))
    assert "run_ms" not in record and "model" not in record


@pytest.mark.parametrize("q", ["standalone"], indirect=True)
async def test_buckets_expire_after_the_retention(q: Queue) -> None:
    q.settings = q.settings.replace(usage_retention_days=3)
    await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)
    now = now_ms()
    await q.finish(d, JobStatus.SUCCEEDED, result={}, spend=Spend(1, 1, 1, 1), now=now)
    hour_key = q.keys.usage_hour(hour_label(hour_start(now / 1000)))
    assert await q.redis.expiretime(hour_key) == hour_start(now / 1000) + HOUR_S + 3 * DAY_S


@pytest.mark.parametrize("q", ["standalone", "standalone-resent"], indirect=True)
async def test_a_tenant_naming_ever_new_models_fills_at_most_its_rows_of_an_hour(q: Queue) -> None:
    for i in range(USAGE_ROWS + 3):
        await q.enqueue("greedy", req(f"model-{i}"))
    await q.enqueue("quiet", req("m"))
    deliveries, _ = await read_all(q, "w1", USAGE_ROWS + 4)
    for d in deliveries:
        await q.finish(d, JobStatus.SUCCEEDED, result={}, spend=Spend(1, 1, 1, 1))
    rows = await rows_of(q)
    greedy = [r for (tenant, _, _), r in rows.items() if tenant == "greedy"]
    assert len(greedy) == USAGE_ROWS + 1 and rows[("greedy", USAGE_OTHER, "normal")].jobs[0] == 3
    assert sum(r.jobs[0] for r in greedy) == USAGE_ROWS + 3
    assert rows[("quiet", "m", "normal")].jobs == [1, 0, 0, 0]  # another tenant's rows are its own
