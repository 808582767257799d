"""The scaling policy (docs/operations.md) as a pure function: observations in, decision and reason out.

``desired = clamp(ceil(backlog / target_per_worker), min, max)``, never below the workers still busy, with
timing rules on top:

- **Up at once.** More demand than capacity scales up in the same evaluation. Capacity is the current desired
  count (the ECS service's, when the caller knows it), which includes tasks still starting, so a burst does not
  scale twice while a GPU instance boots.
- **Down after a calm window.** The count drops only once the backlog has asked for fewer workers for
  ``cooldown_s`` without a break (a stabilisation window, as Kubernetes' HPA has), and then to the most it asked
  for during that window, not to the last sample: a drain that dips and recovers does not flap. Never below the
  workers with jobs in flight: they hold the count, but do not restart the window (a worker that finishes its
  last job can go at the next evaluation, instead of a whole cooldown later).
- **To zero after an idle window.** With nothing lagging, pending, delayed or in flight, one worker stays warm
  until the queue has been idle for ``zero_after_s`` (and ``cooldown_s`` has passed since the last change);
  then the count goes straight to zero.

Every scale-down comes at least ``cooldown_s`` after the previous change (the one exception: a count above
``max``, after the ceiling was lowered, comes down at once), and between two scale-downs the count only rises. So
under load that swings between two levels there are at most ``2 * (T / cooldown_s + 1) + 2`` changes in ``T``
seconds (tests/unit/test_policy.py checks this and the other properties).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .queue import Observation
    from .settings import Settings


class Action(StrEnum):
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    SCALE_TO_ZERO = "scale_to_zero"
    HOLD = "hold"  # demand wants fewer, the calm or idle window is not over yet
    STEADY = "steady"


@dataclass(frozen=True)
class ScalePolicy:
    min: int = 0
    max: int = 4
    target_per_worker: int = 8
    cooldown_s: float = 120.0
    zero_after_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.max:
            raise ValueError(f"scale bounds must satisfy 0 <= min <= max, got min={self.min} max={self.max}")
        if self.target_per_worker < 1:
            raise ValueError(f"target_per_worker must be >= 1, got {self.target_per_worker}")
        if self.cooldown_s < 0 or self.zero_after_s < 0:
            raise ValueError("cooldown_s and zero_after_s must be >= 0")

    @classmethod
    def from_settings(cls, settings: Settings) -> ScalePolicy:
        return cls(
            min=settings.scale_min,
            max=settings.scale_max,
            target_per_worker=settings.target_per_worker,
            cooldown_s=float(settings.scale_down_cooldown_s),
            zero_after_s=float(settings.scale_to_zero_after_s),
        )


@dataclass(frozen=True)
class Demand:
    """What the queue and the fleet look like now."""

    lag: int = 0
    pending: int = 0
    delayed: int = 0
    busy_workers: int = 0

    @classmethod
    def from_observation(cls, observation: Observation) -> Demand:
        return cls(
            lag=observation.lag,
            pending=observation.pending,
            delayed=observation.delayed,
            busy_workers=observation.busy_workers,
        )

    @property
    def backlog(self) -> int:
        return max(self.lag, 0) + max(self.pending, 0) + max(self.delayed, 0)

    @property
    def idle(self) -> bool:
        return self.backlog == 0 and self.busy_workers <= 0


def _float_or_none(raw: str | None) -> float | None:
    return float(raw) if raw else None


@dataclass(frozen=True)
class ScaleState:
    """What the policy remembers between evaluations (kept in ``inferq:{Q}:scale`` beside the decision)."""

    desired: int = 0
    changed_at: float = 0.0
    below_since: float | None = None  # demand has wanted fewer than ``desired`` since then, without a break
    idle_since: float | None = None  # nothing lagging, pending, delayed or in flight since then
    window_peak: int = 0  # the most demand asked for since ``below_since``

    def adopt(self, current: int, now: float) -> ScaleState:
        """The count actually in force (the ECS service's desired count). If someone else changed it, it is a
        change like our own: the calm window starts again, so a manual scale-up is not undone at once."""
        if current == self.desired:
            return self
        return replace(self, desired=max(current, 0), changed_at=now, below_since=None, window_peak=0)

    def to_fields(self) -> dict[str, str]:
        """The hash fields stored beside the contract fields ``desired``, ``reason`` and ``at``."""
        return {
            "changed_at": repr(self.changed_at),
            "below_since": "" if self.below_since is None else repr(self.below_since),
            "idle_since": "" if self.idle_since is None else repr(self.idle_since),
            "window_peak": str(self.window_peak),
        }

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> ScaleState:
        """Read back :meth:`to_fields` plus ``desired``; a missing or unreadable hash is the initial state."""
        try:
            return cls(
                desired=max(int(fields.get("desired") or 0), 0),
                changed_at=float(fields.get("changed_at") or 0.0),
                below_since=_float_or_none(fields.get("below_since")),
                idle_since=_float_or_none(fields.get("idle_since")),
                window_peak=max(int(fields.get("window_peak") or 0), 0),
            )
        except ValueError:
            return cls(desired=_int_or_zero(fields.get("desired")))


def _int_or_zero(raw: str | None) -> int:
    try:
        return max(int(raw or 0), 0)
    except ValueError:
        return 0


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    state: ScaleState
    changed: bool
    action: Action = Action.STEADY


def wanted(policy: ScalePolicy, demand: Demand) -> int:
    """The count the backlog asks for, before the timing rules: enough workers for the backlog, never fewer than
    the workers with jobs in flight or ``min``, never more than ``max`` (``max`` wins: it is the cost ceiling)."""
    return min(max(_needed(policy, demand), demand.busy_workers), policy.max)


def _needed(policy: ScalePolicy, demand: Demand) -> int:
    """Workers the backlog alone asks for, within the bounds."""
    return min(max(math.ceil(demand.backlog / policy.target_per_worker), policy.min), policy.max)


def decide(policy: ScalePolicy, demand: Demand, state: ScaleState, now: float) -> Decision:
    current = state.desired
    if demand.idle:
        idle_since = state.idle_since if state.idle_since is not None and state.idle_since <= now else now
    else:
        idle_since = None
    idle_for = now - idle_since if idle_since is not None else 0.0
    need = _needed(policy, demand)
    if need == 0:
        # nothing to do: one worker stays warm until the queue has been idle for the whole idle window
        need = 0 if idle_since is not None and idle_for >= policy.zero_after_s else min(1, current)
    busy = min(max(demand.busy_workers, 0), policy.max)
    floor = max(need, busy)  # the fewest workers allowed now: never below the workers with jobs in flight

    def changed_to(desired: int, action: Action, reason: str) -> Decision:
        new = ScaleState(desired=desired, changed_at=now, below_since=None, idle_since=idle_since, window_peak=0)
        return Decision(desired, reason, new, True, action)

    if floor > current:
        return changed_to(floor, Action.SCALE_UP,
                          f"scale_up: backlog {demand.backlog}, {demand.busy_workers} busy -> {floor} workers "
                          f"(target {policy.target_per_worker} per worker)")
    if current > policy.max:
        return changed_to(policy.max, Action.SCALE_DOWN, f"scale_down: {current} is above max {policy.max}")
    if need >= current:
        steady = replace(state, below_since=None, window_peak=0, idle_since=idle_since)
        return Decision(current, f"steady: backlog {demand.backlog} -> {current} workers", steady, False)

    # need < current: the backlog asks for fewer workers
    since_change = now - state.changed_at
    if need == 0:
        if since_change >= policy.cooldown_s:
            return changed_to(0, Action.SCALE_TO_ZERO, f"scale_to_zero: idle for {idle_for:.0f}s")
        held = replace(state, idle_since=idle_since)
        reason = f"hold: idle, cooldown {since_change:.0f}/{policy.cooldown_s:.0f}s since the last change"
        return Decision(current, reason, held, False, Action.HOLD)

    if state.below_since is not None and state.below_since <= now:  # the calm window is running
        below_since, peak = state.below_since, max(state.window_peak, need)
    else:
        below_since, peak = now, need
    below_since = max(below_since, state.changed_at)  # a window never starts before the last change
    held = replace(state, below_since=below_since, window_peak=peak, idle_since=idle_since)
    calm_for = now - below_since
    if calm_for < policy.cooldown_s:
        reason = f"hold: cooldown {calm_for:.0f}/{policy.cooldown_s:.0f}s before scaling {current} -> {peak}"
        return Decision(current, reason, held, False, Action.HOLD)
    target = max(peak, busy)
    if target >= current:
        reason = f"hold: {demand.busy_workers} workers busy, the backlog needs {need}"
        return Decision(current, reason, held, False, Action.HOLD)
    return changed_to(target, Action.SCALE_DOWN,
                      f"scale_down: backlog {demand.backlog}, {demand.busy_workers} busy, at most {peak} workers "
                      f"needed for {calm_for:.0f}s")
