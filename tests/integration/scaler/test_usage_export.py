"""The scaler's usage pass (functions/scaler/usage.py) against a real Valkey and moto's S3: each settled hour's
metrics once (per model; per tenant only when turned on), each day's JSON Lines object rewritten whole (a rerun
writes the same bytes), the tenants' budget shares, and nothing at all with metering off."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from functions.scaler import usage as scaler_usage
from functions.scaler.usage import SETTLE_S, s3_put, usage_pass
from inferq.config.parsers import Budget
from inferq.config.settings import Settings
from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.protocol import Queue
from inferq.usage.export import day_key
from inferq.usage.periods import DAY_S, HOUR_S, hour_start
from inferq.usage.spend import Spend
from tests.support.s3 import in_process_bucket

log = logging.getLogger("test.usage")
BUCKET = "usage-export"
DAY = (int(time.time()) // DAY_S - 2) * DAY_S
"""The start of the UTC day before yesterday: CloudWatch takes metrics stamped up to two weeks back."""


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with in_process_bucket(monkeypatch, BUCKET) as client:
        yield client


def emitted(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"_aws"')]


async def ended(queue: Queue, tenant: str, model: str, at_ms: int, spend: Spend) -> None:
    await queue.enqueue(tenant, JobRequest(body={"model": model, "prompt": "x"}))
    (d,), _ = await queue.read("w", 1)
    await queue.finish(d, JobStatus.SUCCEEDED, result={}, spend=spend, now=at_ms)


@pytest.fixture(autouse=True)
def budgets_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scaler_usage, "_budgets_at", 0.0)


async def test_settled_hours_are_emitted_once_and_each_day_written_whole_again(
    queue: Queue, settings: Settings, s3: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    await ended(queue, "a", "m", (DAY + 10 * HOUR_S + 5) * 1000, Spend(2000, 1000, 10, 20))
    await ended(queue, "b", "m", (DAY + 10 * HOUR_S + 9) * 1000, Spend(4000, 3000, 1, 2))
    await ended(queue, "a", "m", (DAY + 23 * HOUR_S + 9) * 1000, Spend(1000, 1000, 5, 5))
    fleets = [(None, settings)]
    put = s3_put(BUCKET)
    # 00:04 the next day: hour 23 is not settled yet; every hour since the catch-up bound up to 22 is
    await usage_pass(settings, fleets, queue.redis, log, now=DAY + DAY_S + SETTLE_S - 60, put=put)
    docs = emitted(capsys.readouterr().out)
    assert [(d["model"], d["Jobs"], d["GpuSeconds"]) for d in docs] == [("m", [2.0], [4.0])]
    assert docs[0]["_aws"]["Timestamp"] == (DAY + 10 * HOUR_S) * 1000
    assert all("tenant" not in d for d in docs)
    first = s3.get_object(Bucket=BUCKET, Key=day_key(DAY))["Body"].read()
    lines = [json.loads(line) for line in first.splitlines()]
    ten, eleven_pm = (time.strftime(f"%Y-%m-%dT{h}:00:00Z", time.gmtime(DAY)) for h in ("10", "23"))
    assert [(x["hour"], x["tenant"], x["jobs_succeeded"], x["prompt_tokens"], x["gpu_seconds"]) for x in lines] == [
        (ten, "a", 1, 10, 1.0), (ten, "b", 1, 1, 3.0), (eleven_pm, "a", 1, 5, 1.0)]
    assert lines[0]["estimated_cost_usd"] == round(1.0 / 3600 * settings.gpu_hour_usd, 6)

    # again within the same hour: nothing more to do
    await usage_pass(settings, fleets, queue.redis, log, now=DAY + DAY_S + SETTLE_S - 30, put=put)
    assert emitted(capsys.readouterr().out) == []
    # once hour 23 settles: its metrics, and the day's object written again, the same
    await usage_pass(settings, fleets, queue.redis, log, now=DAY + DAY_S + SETTLE_S + 1, put=put)
    assert [(d["Jobs"], d["_aws"]["Timestamp"]) for d in emitted(capsys.readouterr().out)] == [
        ([1.0], (DAY + 23 * HOUR_S) * 1000)]
    assert s3.get_object(Bucket=BUCKET, Key=day_key(DAY))["Body"].read() == first
    # the next day's first job: its own object, the day before's untouched
    await ended(queue, "a", "m", (DAY + DAY_S + 2 * HOUR_S) * 1000, Spend(1, 1, 1, 1))
    await usage_pass(settings, fleets, queue.redis, log, now=DAY + DAY_S + 3 * HOUR_S + SETTLE_S, put=put)
    assert len(s3.get_object(Bucket=BUCKET, Key=day_key(DAY + DAY_S))["Body"].read().splitlines()) == 1
    assert s3.get_object(Bucket=BUCKET, Key=day_key(DAY))["Body"].read() == first


async def test_per_tenant_metrics_only_when_turned_on_and_budgets_reported(
    queue: Queue, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    now = hour_start(DAY + 3 * HOUR_S) + SETTLE_S + 1
    await ended(queue, "a", "m", (now - HOUR_S) * 1000, Spend(1000, 3_600_000, 100, 700))
    settings = settings.replace(usage_tenant_metrics=True, tenant_budgets={"a": Budget(tokens=1000)},
                                gpu_hour_usd=2.0)
    await usage_pass(settings, [(None, settings)], queue.redis, log, now=now)
    docs = emitted(capsys.readouterr().out)
    per_tenant = [d for d in docs if d.get("tenant") == "a" and "Jobs" in d]
    assert per_tenant and per_tenant[0]["EstimatedCostUSD"] == [2.0] and per_tenant[0]["model"] == "m"
    assert [d["EstimatedCostUSD"] for d in docs if "Jobs" in d and "tenant" not in d] == [[2.0]]


async def test_a_tenant_past_80_percent_of_its_budget_is_reported_and_logged(
    queue: Queue, settings: Settings, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    import time

    await ended(queue, "a", "m", int(time.time() * 1000), Spend(1000, 1000, 400, 450))
    settings = settings.replace(tenant_budgets={"a": Budget(tokens=1000), "idle": Budget(usd=5.0)})
    with caplog.at_level(logging.WARNING, logger="test.usage"):
        await usage_pass(settings, [(None, settings)], queue.redis, log)
    shares = {d["tenant"]: d["BudgetUsedPercent"] for d in emitted(capsys.readouterr().out)
              if "BudgetUsedPercent" in d}
    assert shares == {"a": [85.0], "idle": [0.0]}
    assert any(getattr(r, "tenant", None) == "a" for r in caplog.records)


async def test_metering_off_exports_nothing(queue: Queue, settings: Settings, s3: Any,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    settings = settings.replace(usage_retention_days=0)
    await usage_pass(settings, [(None, settings)], queue.redis, log, now=DAY + DAY_S, put=s3_put(BUCKET))
    assert emitted(capsys.readouterr().out) == [] and await queue.redis.get(queue.keys.usage_exported) is None


async def test_the_month_is_summed_through_the_settled_hour_and_a_budget_reads_the_hours_since(
    queue: Queue, settings: Settings
) -> None:
    from inferq.usage.budgets import THROUGH, month_to_date
    from inferq.usage.periods import month_label, month_start

    now = max(time.time(), month_start(time.time()) + 5 * HOUR_S)  # hours of this month before now's
    this_hour = hour_start(now)
    first = this_hour - 3 * HOUR_S
    await ended(queue, "a", "m", (first + 60) * 1000, Spend(10, 3_600_000, 100, 200))  # settled: rolled up
    await ended(queue, "a", "m", (this_hour + 1) * 1000, Spend(10, 1_800_000, 1, 2))  # this hour: not yet
    await ended(queue, "b", "m", (this_hour + 2) * 1000, Spend(10, 1, 5, 5))
    sources = [scaler_usage.Source(queue.redis, queue.keys, None, 2.0)]
    before = await month_to_date(sources, "a", now)  # no totals yet: every bucket of the month is read
    assert (before.tokens, before.usd) == (303, 3.0)
    await usage_pass(settings, [(None, settings)], queue.redis, log, now=this_hour + SETTLE_S + 1)
    totals = await queue.redis.hgetall(queue.keys.usage_month(month_label(now)))
    assert totals[THROUGH] == str(this_hour - HOUR_S) and totals["a|tokens"] == "300"
    assert totals["a|gpu_ms"] == "3600000" and "b|tokens" not in totals
    after = await month_to_date(sources, "a", now)  # the totals, and this hour's bucket on top
    assert (after.tokens, after.usd) == (303, 3.0)
    assert (await month_to_date(sources, "b", now)).tokens == 10
    # a rerun of the pass (its marker lost) writes the same totals
    await queue.redis.delete(queue.keys.usage_exported)
    await usage_pass(settings, [(None, settings)], queue.redis, log, now=this_hour + SETTLE_S + 1)
    assert await queue.redis.hgetall(queue.keys.usage_month(month_label(now))) == totals
