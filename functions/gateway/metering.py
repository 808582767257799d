"""What the gateway needs of usage metering beside its route (:mod:`.usage`): each queue as a usage
:class:`~inferq.usage.report.Source` (its model and its price per GPU-hour), and the budget check a submit makes
(``INFERQ_TENANT_BUDGETS``: past a budget, 429 ``quota_exceeded`` naming it). No route is built here: the submit path
imports it."""

import math
import time
from typing import Any
from weakref import WeakKeyDictionary

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


def budget_guard(gw: Any) -> BudgetGuard:
    guard = _guards.get(gw)
    if guard is None:
        guard = _guards[gw] = BudgetGuard(gw.settings.tenant_budgets)
    return guard


async def check_budget(gw: Any, tenant: str) -> None:
    """Before accepting ``tenant``'s job: 429 ``quota_exceeded`` when it has reached one of its monthly budgets
    (nothing at all for a tenant without one, or with metering off)."""
    guard = budget_guard(gw)
    if not guard.applies(tenant) or gw.settings.usage_retention_days <= 0:
        return
    try:
        await gw.call(guard.check(tenant, lambda: sources(gw)))
    except BudgetExceeded as exc:
        now = time.time()
        raise ApiError(429, str(exc), type_="quota_exceeded",
                       headers={"Retry-After": str(max(1, math.ceil(next_month_start(now) - now)))}) from None
