"""On-demand stand-ins while Spot is short: one step of :mod:`inferq.scaling.capacity`'s rule against ECS.

With Spot on (``INFERQ_SCALE_SPOT_FALLBACK_S`` > 0) a model's fleet is two services: the primary one, sized by the
scaling policy, whose tasks run on Spot, and the fallback one (the primary's name + ``-on-demand``) on on-demand
capacity alone. Each tick, after the policy's count is applied to the primary, this reads how long the primary's
tasks have waited for an instance (``ListTasks`` + ``DescribeTasks``, only while it has tasks starting), and sets
the fallback's desired count to the stand-ins the rule asks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from inferq.scaling.capacity import Fallback, stand_ins

from .ecs import ECS_ERRORS, EcsService, EcsUnavailable, ServiceCounts

DESCRIBE_BATCH = 100  # DescribeTasks takes at most 100 tasks


@dataclass(frozen=True)
class StandInStep:
    count: int
    """The fallback service's desired count after this step."""
    previous: int
    short: int
    """The primary's tasks Spot is short for (waiting for an instance past the delay, or at all after a shortage)."""
    short_at: float | None
    """When a shortage was last seen, remembered in the scale hash (``spot_short_at``)."""

    @property
    def changed(self) -> bool:
        return self.count != self.previous


class StandIns:
    def __init__(self, primary: EcsService, fallback: EcsService, rule: Fallback) -> None:
        self.primary = primary
        self.fallback = fallback
        self.rule = rule

    def step(self, desired: int, primary: ServiceCounts, short_at: float | None, now: float) -> StandInStep:
        """Size the fallback service for the policy's ``desired`` count, given the primary's counts (before this
        tick's update: what runs now). Raises :class:`EcsUnavailable` when ECS cannot be read or updated."""
        waiting = self.waiting_for_capacity(now) if primary.pending > 0 else []
        short, short_at = self.rule.short(waiting, short_at, now)
        current = self.fallback.counts().desired
        count = stand_ins(desired, primary.running, short, current)
        if count != current:
            self.fallback.set_desired(count)
        return StandInStep(count, current, short, short_at)

    def waiting_for_capacity(self, now: float) -> list[float]:
        """How long each of the primary's tasks has waited for an instance: its tasks still ``PROVISIONING``
        (placed on no container instance yet), by their ``createdAt``."""
        ecs, client = self.primary, self.primary.client
        try:
            arns: list[str] = []
            for page in client.get_paginator("list_tasks").paginate(
                cluster=ecs.cluster, serviceName=ecs.service, desiredStatus="RUNNING"
            ):
                arns.extend(page.get("taskArns") or [])
            tasks: list[dict[str, Any]] = []
            for i in range(0, len(arns), DESCRIBE_BATCH):
                tasks.extend(client.describe_tasks(cluster=ecs.cluster, tasks=arns[i:i + DESCRIBE_BATCH])
                             .get("tasks") or [])
        except ECS_ERRORS as exc:
            raise EcsUnavailable(f"ListTasks/DescribeTasks failed: {exc}") from exc
        return [max(now - _seconds(t["createdAt"]), 0.0) for t in tasks
                if t.get("lastStatus") == "PROVISIONING" and t.get("createdAt") is not None]


def _seconds(created: Any) -> float:
    return created.timestamp() if isinstance(created, datetime) else float(created)
