"""Per-tenant monthly budgets (``INFERQ_TENANT_BUDGETS``): what a tenant spent this UTC month, summed over the queues;
past a budget the gateway refuses the tenant's submits (429 ``quota_exceeded``).

A queue's month to date is its month totals (``inferq:{Q}:usage:month:<YYYY-MM>``, which the scaler writes once an
hour has settled, through that hour: :func:`month_totals`) plus the hourly buckets since (usually one or two): the
terminal transition writes the hourly bucket alone, and the month is summed off its hot path.

A budget stops new work, not work already accepted: jobs in flight when it is reached still run and count, so a
month's usage can pass the budget by what was in flight (bounded by ``INFERQ_TENANT_MAX_DEPTH``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from inferq.config.parsers import Budget
from inferq.usage.periods import HOUR_S, hours, month_label, month_start, next_month_start
from inferq.usage.report import Row, Source, parse, read_buckets

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


THROUGH = "through"
"""The month totals' field: the start of the last hour they include (unix s)."""


async def _queue_month(source: Source, tenant: str, now_s: float) -> tuple[int, float]:
    """One queue's month to date of ``tenant``: its month totals, then the buckets of the hours after them."""
    totals = await source.redis.hgetall(source.keys.usage_month(month_label(now_s)))
    through = totals.get(THROUGH)
    since = int(through) + HOUR_S if through and through.isdigit() else month_start(now_s)
    tokens, gpu_ms = int(totals.get(f"{tenant}|tokens") or 0), int(totals.get(f"{tenant}|gpu_ms") or 0)
    prefix = f"{tenant}|"
    for _, bucket in await read_buckets(source, hours(since, now_s + 1)) if since <= now_s else []:
        for name, value in bucket.items():
            parsed = parse(name, value) if name.startswith(prefix) else None
            if parsed is not None:
                numbers = parsed[3]
                tokens, gpu_ms = tokens + numbers[4] + numbers[5], gpu_ms + numbers[7]
    return tokens, gpu_ms / 3_600_000 * source.gpu_hour_usd


async def month_to_date(sources: Sequence[Source], tenant: str, now_s: float) -> Spent:
    """What ``tenant`` spent this UTC month, every queue read side by side."""
    found = await asyncio.gather(*(_queue_month(source, tenant, now_s) for source in sources))
    return Spent(sum(t for t, _ in found), sum(usd for _, usd in found))


def month_totals(rows: Sequence[Row], through: int) -> dict[str, str]:
    """The month totals' fields, from one queue's rows of the month through the hour starting at ``through``."""
    fields: dict[str, int] = {}
    for row in rows:
        fields[f"{row.tenant}|tokens"] = fields.get(f"{row.tenant}|tokens", 0) + row.tokens
        fields[f"{row.tenant}|gpu_ms"] = fields.get(f"{row.tenant}|gpu_ms", 0) + row.gpu_ms
    return {THROUGH: str(through), **{name: str(value) for name, value in fields.items()}}


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
