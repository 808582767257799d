"""Per-tenant monthly budgets (``INFERQ_TENANT_BUDGETS``): what a tenant spent this UTC month, from each queue's month
totals (``inferq:{Q}:usage:month:<YYYY-MM>``, written with the hourly buckets by ``includes/meter.lua``), summed
over the queues; past a budget the gateway refuses the tenant's submits (429 ``quota_exceeded``).

A budget stops new work, not work already accepted: jobs in flight when it is reached still run and count, so a
month's usage can pass the budget by what was in flight (bounded by ``INFERQ_TENANT_MAX_DEPTH``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from inferq.config.parsers import Budget
from inferq.usage.periods import month_label, next_month_start
from inferq.usage.report import Source

RECHECK_S = 10.0
"""How long a gateway process trusts a tenant's month-to-date under its budget before reading it again: one read per
budgeted tenant every few seconds, not one per submit. A tenant found over stays over until the month ends."""
WARN_AT = 0.8
"""The share of a budget past which the scaler's ``BudgetUsedPercent`` metric is meant to alarm (docs/operations.md)."""


@dataclass(frozen=True)
class Spent:
    """A tenant's month to date, all models together."""

    tokens: int
    usd: float

    def share_of(self, budget: Budget) -> float:
        """The larger share of the tenant's budgets used (1.0: reached)."""
        shares = []
        if budget.tokens is not None:
            shares.append(self.tokens / budget.tokens if budget.tokens else float("inf"))
        if budget.usd is not None:
            shares.append(self.usd / budget.usd if budget.usd else float("inf"))
        return max(shares, default=0.0)

    def exceeded(self, budget: Budget) -> str | None:
        """Which budget is reached, in words; None while under every one."""
        if budget.tokens is not None and self.tokens >= budget.tokens:
            return f"its monthly budget of {budget.tokens} tokens (used: {self.tokens})"
        if budget.usd is not None and self.usd >= budget.usd:
            return f"its monthly budget of ${budget.usd:g} (estimated GPU cost used: ${self.usd:.2f})"
        return None


async def month_to_date(sources: Sequence[Source], tenant: str, now_s: float) -> Spent:
    """What ``tenant`` spent this UTC month: one read per queue, side by side."""
    label = month_label(now_s)
    replies = await asyncio.gather(*(s.redis.hmget(s.keys.usage_month(label), f"{tenant}|tokens", f"{tenant}|gpu_ms")
                                     for s in sources))
    tokens, usd = 0, 0.0
    for source, (spent_tokens, gpu_ms) in zip(sources, replies, strict=True):
        tokens += int(spent_tokens or 0)
        usd += int(gpu_ms or 0) / 3_600_000 * source.gpu_hour_usd
    return Spent(tokens, usd)


class BudgetExceeded(Exception):
    def __init__(self, tenant: str, which: str) -> None:
        super().__init__(f"tenant {tenant!r} has used {which}; new jobs are refused until the month ends (UTC)")
        self.tenant = tenant


class BudgetGuard:
    """The gateway's check before accepting a tenant's job: nothing for a tenant without a budget; for one with a
    budget, its month to date read at most every :data:`RECHECK_S` seconds per process (clock injected)."""

    def __init__(self, budgets: dict[str, Budget] | None, clock: Callable[[], float] = time.time,
                 read: Callable[[Sequence[Source], str, float], Awaitable[Spent]] | None = None) -> None:
        self.budgets = budgets or {}
        self.clock = clock
        self.read = read or month_to_date
        self._known: dict[str, tuple[float, str | None]] = {}
        """tenant -> (until when the answer holds, what was exceeded or None)."""

    def applies(self, tenant: str) -> bool:
        return tenant in self.budgets

    async def check(self, tenant: str, sources: Callable[[], Sequence[Source]]) -> None:
        """Raise :class:`BudgetExceeded` when ``tenant`` has reached one of its budgets this month."""
        budget = self.budgets.get(tenant)
        if budget is None:
            return
        now = self.clock()
        until, exceeded = self._known.get(tenant, (0.0, None))
        if now >= until:
            spent = await self.read(sources(), tenant, now)
            exceeded = spent.exceeded(budget)
            until = next_month_start(now) if exceeded else now + RECHECK_S
            self._known[tenant] = (until, exceeded)
        if exceeded:
            raise BudgetExceeded(tenant, exceeded)
