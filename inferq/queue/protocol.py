"""The asyncio client of the queue protocol: one typed method per Lua script, plus the plain reads around them.

Every state change is one script (see ``scripts/``). :class:`Queue` is both sides on one client: the producer side
(:mod:`.producer`, what the HTTP API runs), the consumer side (:mod:`.consumer`, what a worker runs),
and the scaler's reads and records below. Callers import everything from here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from inferq.queue.consumer import Consumer
from inferq.queue.core import new_token, now_ms
from inferq.queue.deliveries import Delivery, Lease, Outcome, Skipped, settle_token
from inferq.queue.jobs import Priority
from inferq.queue.keys import LANE_KEYS
from inferq.queue.producer import (
    EngineCoolOff,
    IdempotencyConflict,
    JobNotFound,
    JobTerminal,
    NotDeadLettered,
    OperatorOnly,
    Producer,
    QueueError,
    QueueFull,
    RetainedQuotaFull,
    TenantQuotaFull,
)
from inferq.redis.scripting import ReplicationLag

__all__ = [
    "Delivery", "EngineCoolOff", "IdempotencyConflict", "JobNotFound", "JobTerminal", "Lease", "NotDeadLettered",
    "Observation", "OperatorOnly", "Outcome", "Queue", "QueueError", "QueueFull", "ReplicationLag",
    "RetainedQuotaFull", "Skipped", "TenantQuotaFull", "new_token", "now_ms", "settle_token",
]


@dataclass(frozen=True)
class Observation:
    lag: int
    pending: int
    delayed: int
    delayed_due: int
    unfinished: int
    workers: int
    busy_workers: int
    in_flight: int
    oldest_entry_ms: int
    group_missing: bool
    dlq: int
    desired: int | None
    reason: str
    decided_at: float | None
    lag_by_lane: dict[Priority, int] = field(default_factory=dict)
    """Per lane: its never-delivered entries and its jobs waiting for admission (both in ``lag``)."""
    waiting_by_lane: dict[Priority, int] = field(default_factory=dict)
    """Per lane: its jobs waiting for admission (fair share, G10)."""
    waiting_by_tenant: dict[str, dict[Priority, int]] = field(default_factory=dict)
    """Per tenant with jobs waiting for admission: how many, per lane, among the next 10,000 of the lane (only when
    asked for: :meth:`Queue.observe`'s ``by_tenant``)."""

    def waiting_json(self) -> dict[str, dict[str, int]]:
        """:attr:`waiting_by_tenant` as the gateway shows it: tenant -> lane name -> jobs waiting."""
        return {tenant: {lane.value: n for lane, n in lanes.items()}
                for tenant, lanes in self.waiting_by_tenant.items()}

    @property
    def backlog(self) -> int:
        return self.lag + self.pending + self.delayed

    def oldest_age_s(self, now_ms: int) -> float:
        return max(0.0, (now_ms - self.oldest_entry_ms) / 1000.0) if self.oldest_entry_ms else 0.0


def _optional_int(value: Any) -> int | None:
    return int(value) if value not in (None, "") else None


class Queue(Producer, Consumer):
    """One queue on one Redis client: both sides, and what the scaler reads and records."""

    async def observe(self, *, now: int | None = None, heartbeat_stale_ms: int | None = None,
                      by_tenant: bool = False) -> Observation:
        """One read-only look at the queue (``observe.lua``); ``by_tenant``: each tenant's jobs waiting for admission
        too (among the next 10,000 of each lane), for operators (``GET /v1/scale``)."""
        now = now or now_ms()
        stale = heartbeat_stale_ms or max(3 * self.settings.claim_idle_ms, 15000)
        keys = [*self.keys.fair_lanes, self.keys.delayed, self.keys.stats, self.keys.workers, self.keys.scale,
                self.keys.dlq]
        r = await self.scripts("observe", keys, [now, stale, "1" if by_tenant else "0"])
        lanes = len(LANE_KEYS)
        waiting: dict[str, dict[Priority, int]] = {}
        tail = r[14 + 2 * lanes:]
        for lane, tenant, count in zip(tail[0::3], tail[1::3], tail[2::3], strict=True):
            waiting.setdefault(tenant, {})[Priority(lane)] = int(count)
        return Observation(
            lag=int(r[0]), pending=int(r[1]), delayed=int(r[2]), delayed_due=int(r[3]), unfinished=int(r[4]),
            workers=int(r[5]), busy_workers=int(r[6]), in_flight=int(r[7]), oldest_entry_ms=int(r[8]),
            group_missing=bool(int(r[9])), dlq=int(r[10]), desired=_optional_int(r[11]), reason=r[12] or "",
            decided_at=float(r[13]) if r[13] else None,
            lag_by_lane={Priority(lane): int(n) for lane, n in zip(LANE_KEYS, r[14:14 + lanes], strict=True)},
            waiting_by_lane={Priority(lane): int(n)
                             for lane, n in zip(LANE_KEYS, r[14 + lanes:14 + 2 * lanes], strict=True)},
            waiting_by_tenant=waiting,
        )

    async def skip_webhookless_events(self, seen: str | None) -> tuple[bool, str]:
        """For a webhook sender: when the ``webhook_events`` count is still ``seen`` (the count when it last read the
        group to its end), move the group's position past every event, none of which carries a webhook. Returns
        whether it moved, and the count now (``skipevents.lua``)."""
        skipped, count = await self.scripts("skipevents", [self.keys.events, self.keys.stats], [seen or ""])
        return bool(int(skipped)), str(count)

    async def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in (await self.redis.hgetall(self.keys.stats)).items()}

    async def record_decision(self, desired: int, reason: str, *, at: float | None = None, **extra: Any) -> None:
        mapping: dict[str, Any] = {"desired": desired, "reason": reason, "at": at if at is not None else time.time()}
        mapping.update(extra)
        await self.redis.hset(self.keys.scale, mapping=mapping)

    async def scale_state(self) -> dict[str, str]:
        return dict(await self.redis.hgetall(self.keys.scale))
