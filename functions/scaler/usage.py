"""The scaler's usage pass (docs/operations.md, "Usage and chargeback"), once per invocation beside the scaling:

- each UTC day's usage to S3, ``usage/date=<day>/usage.jsonl`` in the files bucket (:mod:`inferq.usage.export`), once
  its hours are settled (:data:`SETTLE_S` after each hour ends), rewritten whole each time, so a rerun or a later
  pass writes the same object again;
- CloudWatch metrics (EMF) of each settled hour, stamped with the hour: per model (``Jobs``, ``PromptTokens``,
  ``CompletionTokens``, ``RunSeconds``, ``GpuSeconds``, ``EstimatedCostUSD``), and per model and tenant only with
  ``INFERQ_USAGE_TENANT_METRICS`` (each tenant's metrics are custom metrics CloudWatch bills for);
- each queue's month totals per tenant through the last settled hour (``inferq:{Q}:usage:month:<YYYY-MM>``, what
  budgets are checked against with the buckets since: :mod:`inferq.usage.budgets`), recomputed whole from the month's
  buckets, so the terminal transition writes its hourly bucket alone;
- ``BudgetUsedPercent`` per tenant with a budget (``INFERQ_TENANT_BUDGETS``), at most once a minute, and a warning in
  the log at 80 %.

The last hour exported is kept in ``inferq:{Q}:usage:exported`` (the primary queue): a pass that finds it current
does one read. Hours missed while nothing ran are caught up, :data:`CATCH_UP_HOURS` at most (CloudWatch takes
metrics up to two weeks old). A failure is logged and the next invocation tries again; it never stops the scaling.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from inferq.config.settings import Settings
from inferq.queue.keys import Keys
from inferq.usage.budgets import WARN_AT, month_to_date, month_totals
from inferq.usage.export import day_key, jsonl
from inferq.usage.periods import DAY_S, HOUR_S, MONTH_KEEP_S, hour_start, month_label, month_start, next_month_start
from inferq.usage.report import Row, Source, totals, usage

SETTLE_S = 300
"""An hour is exported this long after it ends: a worker's finish sent just before the hour ended, retried across a
brief Redis fault, is counted in that hour by then."""
CATCH_UP_HOURS = 48
BUDGET_EVERY_S = 60.0

_budgets_at = 0.0
"""When this process last emitted the budget metrics."""


def sources(client: Any, fleets: Sequence[tuple[str | None, Settings]]) -> list[Source]:
    return [Source(client, Keys(fleet.queue), model, fleet.gpu_hour_usd) for model, fleet in fleets]


def _metrics() -> Any:
    from aws_lambda_powertools.metrics import EphemeralMetrics

    # a metric set of its own (the scaler's shared one carries the ticks' dimensions), service "" as the scaler's
    return EphemeralMetrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "inferq", service="")


def emit_hour(rows: Sequence[Row], hour: int, *, per_tenant: bool) -> int:
    """The hour's metrics, per model (and per model and tenant): one EMF document each, stamped with the hour.
    Answers how many documents were printed."""
    from aws_lambda_powertools.metrics import MetricUnit

    groups: dict[tuple[str, str | None], Row] = {}
    for row in rows:
        keys = [(row.model, None)] + ([(row.model, row.tenant)] if per_tenant else [])
        for key in keys:
            total = groups.get(key)
            if total is None:
                total = groups[key] = Row(key[1] or "*", key[0], "*")
            total.add([*row.jobs, row.prompt_tokens, row.completion_tokens, row.run_ms, row.gpu_ms], 0.0)
            total.cost_usd += row.cost_usd
    for (model, tenant), total in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1] or "")):
        metrics = _metrics()
        metrics.set_timestamp(hour * 1000)
        metrics.add_dimension(name="model", value=model)
        if tenant is not None:
            metrics.add_dimension(name="tenant", value=tenant)
        metrics.add_metric(name="Jobs", unit=MetricUnit.Count, value=sum(total.jobs))
        metrics.add_metric(name="PromptTokens", unit=MetricUnit.Count, value=total.prompt_tokens)
        metrics.add_metric(name="CompletionTokens", unit=MetricUnit.Count, value=total.completion_tokens)
        metrics.add_metric(name="RunSeconds", unit=MetricUnit.Seconds, value=total.run_ms / 1000)
        metrics.add_metric(name="GpuSeconds", unit=MetricUnit.Seconds, value=total.gpu_ms / 1000)
        metrics.add_metric(name="EstimatedCostUSD", unit=MetricUnit.NoUnit, value=round(total.cost_usd, 6))
        metrics.flush_metrics()
    return len(groups)


async def emit_budgets(settings: Settings, found: Sequence[Source], now: float, logger: Any) -> int:
    """``BudgetUsedPercent`` of each tenant with a budget (the larger share of its budgets), dimension ``tenant``."""
    from aws_lambda_powertools.metrics import MetricUnit

    budgets = settings.tenant_budgets or {}
    spent = await asyncio.gather(*(month_to_date(found, tenant, now) for tenant in budgets))
    for (tenant, budget), month in zip(budgets.items(), spent, strict=True):
        share = month.share_of(budget)
        if share >= WARN_AT:
            logger.warning("tenant past %d%% of its monthly budget", round(WARN_AT * 100),
                           extra={"tenant": tenant, "budget": budget.describe(), "used_percent": round(share * 100, 1)})
        metrics = _metrics()
        metrics.add_dimension(name="tenant", value=tenant)
        metrics.add_metric(name="BudgetUsedPercent", unit=MetricUnit.Percent, value=round(share * 100, 2))
        metrics.flush_metrics()
    return len(budgets)


async def export_pass(
    settings: Settings,
    found: Sequence[Source],
    *,
    put: Callable[[str, bytes], None] | None,
    now: float,
    logger: Any,
) -> list[int]:
    """Export the hours settled since the last pass (metrics, and their days to S3 when ``put`` is given); answers
    the hours exported."""
    primary = found[0]
    settled = hour_start(now - SETTLE_S) - HOUR_S
    last = await primary.redis.get(primary.keys.usage_exported)
    oldest = settled - (CATCH_UP_HOURS - 1) * HOUR_S  # a first pass, or one after a long pause, catches up this far
    first = max(int(last) + HOUR_S, oldest) if last and last.isdigit() else oldest
    if first > settled:
        return []
    hours = list(range(first, settled + HOUR_S, HOUR_S))
    rows = await usage(found, first, settled + HOUR_S, width="hour")
    for hour in hours:
        emit_hour([r for r in rows if r.start == hour], hour, per_tenant=settings.usage_tenant_metrics)
    if put is not None:
        for day in sorted({hour - hour % DAY_S for hour in hours}):
            day_rows = await usage(found, day, day + DAY_S, width="hour")
            if day_rows:
                await asyncio.to_thread(put, day_key(day), jsonl(day_rows))
                logger.info("usage exported", extra={"key": day_key(day), "rows": len(day_rows),
                                                     "tenants": len(totals(day_rows))})
    for first_of_month in sorted({month_start(hour) for hour in hours}):
        await roll_up_month(found, first_of_month, min(settled, next_month_start(first_of_month) - HOUR_S))
    await primary.redis.set(primary.keys.usage_exported, str(settled))
    return hours


async def roll_up_month(found: Sequence[Source], first_of_month: int, through: int) -> None:
    """Each queue's month totals through the hour starting at ``through``, summed again from the month's buckets and
    written in one step: a rerun writes the same."""
    for source in found:
        fields = month_totals(await usage([source], first_of_month, through + HOUR_S), through)
        key = source.keys.usage_month(month_label(first_of_month))
        async with source.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=fields)
            pipe.expireat(key, next_month_start(first_of_month) + MONTH_KEEP_S)
            await pipe.execute()


def s3_put(bucket: str) -> Callable[[str, bytes], None]:
    from functions.storage import Bucket

    store = Bucket(bucket)

    def put(key: str, body: bytes) -> None:
        store.client.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/x-ndjson")

    return put


async def usage_pass(settings: Settings, fleets: Sequence[tuple[str | None, Settings]], client: Any, logger: Any,
                     *, now: float | None = None, put: Callable[[str, bytes], None] | None = None) -> None:
    """The pass, once per invocation; never raises (the next invocation tries again)."""
    global _budgets_at
    if settings.usage_retention_days <= 0:
        return
    now = time.time() if now is None else now
    found = sources(client, fleets)
    try:
        if settings.tenant_budgets and now - _budgets_at >= BUDGET_EVERY_S:
            _budgets_at = now
            await emit_budgets(settings, found, now, logger)
        store = put or (s3_put(settings.files_bucket) if settings.files_bucket else None)
        await export_pass(settings, found, put=store, now=now, logger=logger)
    except Exception:  # S3 or Redis unreachable, a full server: nothing is lost, the next pass exports it
        logger.exception("usage pass failed")
