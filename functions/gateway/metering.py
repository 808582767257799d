"""What the gateway needs of usage metering beside its route (:mod:`.usage`): each queue as a usage
:class:`~inferq.usage.report.Source` (its model and its price per GPU-hour), and the budget check a submit makes
(``INFERQ_TENANT_BUDGETS``: past a budget, 429 ``quota_exceeded`` naming it). No route is built here: the submit path
imports it."""

import math
import time
from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

from inferq.queue.jobs import idempotency_digest
from inferq.queue.protocol import Queue
from inferq.usage.budgets import BudgetExceeded, BudgetGuard
from inferq.usage.periods import next_month_start
from inferq.usage.report import Source

from .errors import ApiError

_guards: "WeakKeyDictionary[Any, BudgetGuard]" = WeakKeyDictionary()
"""One budget guard per gateway (its cache of the tenants' month to date)."""


def sources(gw: Any) -> list[Source]:
    """Every queue of the gateway as a usage source: a registry's model by model, else the one queue."""
    if gw.registry is None:
        queue = gw.queue
        return [Source(queue.redis, queue.keys, None, gw.settings.gpu_hour_usd)]
    return [Source(queue.redis, queue.keys, model.name, model.settings.gpu_hour_usd)
            for model in gw.registry.models for queue in (gw.queues.get(model.queue),)]


def budget_guard(gw: Any, clock: Callable[[], float] | None = None) -> BudgetGuard:
    """The gateway's budget guard, made on first use (``clock``: wall-clock seconds, ``time.time`` by default)."""
    guard = _guards.get(gw)
    if guard is None:
        guard = _guards[gw] = BudgetGuard(gw.settings.tenant_budgets, clock=clock or time.time)
    return guard


async def check_budget(gw: Any, tenant: str, queue: Queue | None = None, idempotency_key: str | None = None) -> None:
    """Before accepting ``tenant``'s job: 429 ``quota_exceeded`` when it has reached one of its monthly budgets
    (nothing at all for a tenant without one, or with metering off). A retry of a submit accepted before (its
    ``idempotency_key`` already names a live job of ``queue``) is no new job: it goes on to its replay."""
    budgets = gw.settings.tenant_budgets
    if not budgets or tenant not in budgets or gw.settings.usage_retention_days <= 0:
        return
    guard = budget_guard(gw)
    try:
        await gw.call(guard.check(tenant, lambda: sources(gw)))
    except BudgetExceeded as exc:
        if queue is not None and idempotency_key is not None and await gw.call(
                _accepted_before(queue, tenant, idempotency_key)):
            return
        now = guard.clock()
        raise ApiError(429, str(exc), type_="quota_exceeded",
                       headers={"Retry-After": str(max(1, math.ceil(next_month_start(now) - now)))}) from None


async def _accepted_before(queue: Queue, tenant: str, idempotency_key: str) -> bool:
    """Whether ``tenant``'s ``idempotency_key`` names a job ``queue`` still holds (the enqueue then replays it)."""
    job_id = await queue.redis.get(queue.keys.idem(tenant, idempotency_digest(idempotency_key)))
    return bool(job_id) and bool(await queue.redis.exists(queue.keys.job(job_id)))
