"""The scaling policy (DESIGN.md section 6) as a pure function: observations in, decision and reason out.

``desired = clamp(ceil(backlog / target_per_worker), min, max)`` with three rules on top:
- up at once: more demand than capacity scales up in the same evaluation; capacity counts tasks still
  starting (the previous desired count), so a burst does not scale twice while a GPU instance boots;
- down only after the demand has stayed below the current count for the whole cooldown (a stabilisation
  window, as Kubernetes' HPA does), and never below the workers still busy;
- to zero only after ``scale_to_zero_after_s`` with nothing lagging, pending, delayed or in flight.
Between those, the count holds. The bound on changes follows: every step down needs ``cooldown_s`` of calm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ScalePolicy:
    min: int = 0
    max: int = 4
    target_per_worker: int = 8
    cooldown_s: float = 120.0
    zero_after_s: float = 300.0

    @classmethod
    def from_settings(cls, settings: object) -> ScalePolicy:
        return cls(
            min=settings.scale_min,  # type: ignore[attr-defined]
            max=settings.scale_max,  # type: ignore[attr-defined]
            target_per_worker=settings.target_per_worker,  # type: ignore[attr-defined]
            cooldown_s=settings.scale_down_cooldown_s,  # type: ignore[attr-defined]
            zero_after_s=settings.scale_to_zero_after_s,  # type: ignore[attr-defined]
        )


@dataclass(frozen=True)
class Demand:
    """What the queue and the fleet look like now."""

    lag: int = 0
    pending: int = 0
    delayed: int = 0
    busy_workers: int = 0

    @property
    def backlog(self) -> int:
        return max(self.lag, 0) + max(self.pending, 0) + max(self.delayed, 0)

    @property
    def idle(self) -> bool:
        return self.backlog == 0 and self.busy_workers == 0


@dataclass(frozen=True)
class ScaleState:
    """What the policy remembers between evaluations (kept in ``inferq:{Q}:scale``)."""

    desired: int = 0
    changed_at: float = 0.0
    below_since: float | None = None  # demand has wanted fewer than ``desired`` since then
    idle_since: float | None = None  # nothing lagging, pending, delayed or in flight since then


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    state: ScaleState
    changed: bool


def wanted(policy: ScalePolicy, demand: Demand) -> int:
    """The count the backlog asks for, before the timing rules."""
    want = math.ceil(demand.backlog / max(policy.target_per_worker, 1))
    want = max(want, demand.busy_workers, policy.min)
    return min(want, policy.max)


def decide(policy: ScalePolicy, demand: Demand, state: ScaleState, now: float) -> Decision:
    current = state.desired
    idle_since = (state.idle_since if state.idle_since is not None else now) if demand.idle else None
    want = wanted(policy, demand)
    if want > 0 or policy.min > 0:
        floor = want
    else:
        # nothing to do: keep one warm worker until the fleet has been idle long enough
        idle_for = now - idle_since if idle_since is not None else 0.0
        floor = 0 if idle_for >= policy.zero_after_s else min(1, current)

    if floor > current:
        new = ScaleState(desired=floor, changed_at=now, below_since=None, idle_since=idle_since)
        return Decision(floor, f"scale_up: backlog {demand.backlog} needs {floor} (target {policy.target_per_worker}"
                        f" per worker)", new, True)
    if floor == current:
        return Decision(current, "steady", replace(state, below_since=None, idle_since=idle_since), False)

    below_since = state.below_since if state.below_since is not None else now
    calm_for = now - below_since
    if floor > 0 and calm_for < policy.cooldown_s:  # the way to zero has its own, longer, idle window
        held = replace(state, below_since=below_since, idle_since=idle_since)
        reason = f"hold: cooldown {calm_for:.0f}/{policy.cooldown_s:.0f}s before scaling {current} -> {floor}"
        return Decision(current, reason, held, False)
    reason = "scale_to_zero: idle" if floor == 0 else f"scale_down: backlog {demand.backlog} needs {floor}"
    new = ScaleState(desired=floor, changed_at=now, below_since=None, idle_since=idle_since)
    return Decision(floor, reason, new, True)
