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

What it spends GPU-minutes on, and why the default does more than count jobs (issue 41; docs/benchmarks.md has
the figures): a GPU worker costs from the request to its stop, boot included, so the waste is in idle workers
kept for work that does not come, in boots for work that a kept worker would have done, and in workers kept busy
by a thin spread of jobs. Three rules, each off unless the caller gives what it needs:

- **Drain target** (:attr:`Decision.target`): the workers the backlog needs now. The workers obey it (newest
  drain first, gpu_worker/fleet.py): a surplus one takes no new job, so it turns idle and unprotected under load,
  and new work packs onto the others. The desired count itself keeps every rule below (never below busy
  workers), so ECS stops a drained worker only once it is idle.
- **Boot-aware scale-in** (``boot_s`` > 0, with the queue's arrival counter and the workers' measured run time):
  a worker that would be needed again within a boot time stays, the others go now rather than after the calm
  window. "Needed" is Little's law on the forecast: arrivals per second (smoothed over about a boot) times the
  seconds a job holds a slot, over the jobs per worker: the work the arrivals bring, not their count. The last
  worker goes as soon as it is idle when under one arrival is expected within a boot (a night's trickle: a boot
  per job costs less than a GPU kept up between them); otherwise the idle window holds, as before.
- **Gathering** (``gather_s`` > 0, with the oldest waiting job's age): at an empty fleet, fewer than a worker's
  load of jobs waits up to ``gather_s`` for company, so one boot serves them all. Off by default: wake-on-enqueue
  promises the first job a worker at once.

- **Work-based sizing** (``tokens_per_s`` > 0 and ``boot_s`` > 0, with the backlog's expected tokens; off by
  default, where the desired count is the job-count formula of docs/operations.md): the jobs' count says how many
  slots they need, their work how long those slots stay busy. The backlog's tokens (each job's ``max_tokens``,
  ``backlog_tokens`` in the stats hash) over one worker's throughput (output tokens per second of a slot, measured
  by the workers, times its slots; ``tokens_per_s`` until measured) are the seconds of work waiting; the fleet
  needs no more workers than finish it within a boot time, since one more would start serving only after the
  others are done. The job-count need stays the ceiling.

Without those inputs (``Demand`` built from job counts alone), the rules below are the whole policy.

Every scale-down comes at least ``cooldown_s`` after the previous change (the exceptions: a count above
``max``, after the ceiling was lowered, comes down at once; and the boot-aware scale-in above), and between two
scale-downs the count only rises. So under load that swings between two levels there are at most
``2 * (T / cooldown_s + 1) + 2`` changes in ``T`` seconds (tests/unit/test_policy.py checks this and the other
properties, for the job-count policy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferq.config.settings import Settings
    from inferq.queue.protocol import Observation


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
    boot_s: float = 120.0
    """How long a new worker takes to serve (INFERQ_SCALE_BOOT_S): the horizon of boot-aware scale-in; 0 turns the
    arrival forecast off (the cooldown and the idle window alone decide scale-in)."""
    gather_s: float = 0.0
    """How long a few jobs at zero may wait for company before a worker is started (INFERQ_SCALE_GATHER_S)."""
    tokens_per_s: float = 0.0
    """Work-based sizing (INFERQ_SCALE_TOKENS_PER_S): the output tokens per second one worker is assumed to
    produce until the workers have measured it; 0 (the default) turns work-based sizing off: job counts alone."""
    drain: bool = True
    """Whether decisions carry a drain target (INFERQ_SCALE_DRAIN): off where nothing turns the desired count into
    workers (compose's fixed workers), since a target there would idle workers that no scale-in removes."""

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.max:
            raise ValueError(f"scale bounds must satisfy 0 <= min <= max, got min={self.min} max={self.max}")
        if self.target_per_worker < 1:
            raise ValueError(f"target_per_worker must be >= 1, got {self.target_per_worker}")
        if min(self.cooldown_s, self.zero_after_s, self.boot_s, self.gather_s, self.tokens_per_s) < 0:
            raise ValueError("cooldown_s, zero_after_s, boot_s, gather_s and tokens_per_s must be >= 0")

    @classmethod
    def from_settings(cls, settings: Settings) -> ScalePolicy:
        return cls(
            min=settings.scale_min,
            max=settings.scale_max,
            target_per_worker=settings.target_per_worker,
            cooldown_s=float(settings.scale_down_cooldown_s),
            zero_after_s=float(settings.scale_to_zero_after_s),
            boot_s=float(settings.scale_boot_s),
            gather_s=float(settings.scale_gather_s),
            tokens_per_s=float(settings.scale_tokens_per_s),
            drain=settings.scale_drain,
        )


@dataclass(frozen=True)
class Demand:
    """What the queue and the fleet look like now. The last five are optional: a caller that does not know them
    (None) gets the job-count policy alone, without gathering, the arrival forecast or work-based sizing."""

    lag: int = 0
    pending: int = 0
    delayed: int = 0
    busy_workers: int = 0
    oldest_wait_s: float | None = None
    """Age of the oldest job no worker has taken yet (0 when none): how long gathering has held it."""
    enqueued: int | None = None
    """The queue's running count of accepted jobs (``enqueued`` in ``inferq:{Q}:stats``): the arrival forecast."""
    job_s: float | None = None
    """Measured backend seconds of one job (the workers' mean): what one job costs a worker slot."""
    backlog_tokens: int | None = None
    """The unfinished jobs' expected tokens (``backlog_tokens`` in ``inferq:{Q}:stats``): the work waiting."""
    slot_tokens_per_s: float | None = None
    """Measured output tokens per backend second of one job slot (the workers' heartbeats); None before any."""

    @classmethod
    def from_observation(cls, observation: Observation, *, now_ms: int | None = None, enqueued: int | None = None,
                         job_s: float | None = None, backlog_tokens: int | None = None,
                         slot_tokens_per_s: float | None = None) -> Demand:
        oldest = observation.oldest_age_s(now_ms) if now_ms is not None and observation.lag else None
        return cls(
            lag=observation.lag,
            pending=observation.pending,
            delayed=observation.delayed,
            busy_workers=observation.busy_workers,
            oldest_wait_s=oldest if now_ms is not None else None,
            enqueued=enqueued,
            job_s=job_s,
            backlog_tokens=backlog_tokens,
            slot_tokens_per_s=slot_tokens_per_s,
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
    enqueued: int | None = None  # the arrival counter at ``rate_at``
    rate_at: float | None = None
    rate: float = 0.0  # arrivals per second, smoothed over about a boot time

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
            "enqueued": "" if self.enqueued is None else str(self.enqueued),
            "rate_at": "" if self.rate_at is None else repr(self.rate_at),
            "rate": repr(self.rate),
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
                enqueued=int(fields["enqueued"]) if fields.get("enqueued") else None,
                rate_at=_float_or_none(fields.get("rate_at")),
                rate=max(float(fields.get("rate") or 0.0), 0.0),
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
    target: int | None = None
    """The workers that should take new jobs (``target`` in the scale hash): the others, newest first, finish what
    they hold and take nothing more, so the fleet packs onto ``target`` workers and a surplus one turns idle (and
    loses its scale-in protection) even while work keeps coming. ``desired`` then follows once it is idle."""


def wanted(policy: ScalePolicy, demand: Demand) -> int:
    """The count the backlog asks for, before the timing rules: enough workers for the backlog, never fewer than
    the workers with jobs in flight or ``min``, never more than ``max`` (``max`` wins: it is the cost ceiling)."""
    return min(max(_needed(policy, demand), demand.busy_workers), policy.max)


def _needed(policy: ScalePolicy, demand: Demand) -> int:
    """Workers the backlog alone asks for, within the bounds: enough for its jobs to find a slot, and, when its
    work is known, no more than finish that work within a boot time (:func:`workers_for_work`)."""
    need = math.ceil(demand.backlog / policy.target_per_worker)
    by_work = workers_for_work(policy, demand)
    if by_work is not None:
        need = min(need, by_work)
    return min(max(need, policy.min), policy.max)


def worker_tokens_per_s(policy: ScalePolicy, demand: Demand) -> float:
    """One worker's throughput: the measured output tokens per second of a slot times the slots of a worker, or
    the assumed ``tokens_per_s`` before any measurement; 0 when work-based sizing is off."""
    if policy.tokens_per_s <= 0:
        return 0.0
    if demand.slot_tokens_per_s is not None and demand.slot_tokens_per_s > 0:
        return demand.slot_tokens_per_s * policy.target_per_worker
    return policy.tokens_per_s


def workers_for_work(policy: ScalePolicy, demand: Demand) -> int | None:
    """Workers that finish the backlog's expected work within a boot time: ``ceil(backlog_tokens / throughput /
    boot_s)``, at least one while there is a backlog. A worker beyond them would serve only after the others
    have done the work (it boots for ``boot_s``), so it is not started, and under load it drains. None (job
    counts decide) with work-based sizing off, or without the backlog's tokens or a boot time."""
    rate = worker_tokens_per_s(policy, demand)
    if demand.backlog_tokens is None or rate <= 0 or policy.boot_s <= 0 or demand.backlog <= 0:
        return None
    return max(1, math.ceil(demand.backlog_tokens / rate / policy.boot_s))


def arrival_rate(policy: ScalePolicy, demand: Demand, state: ScaleState, now: float) -> ScaleState:
    """The state with its arrival rate brought up to date from the queue's ``enqueued`` counter: an exponential
    average over about a boot time, so a rate is forgotten about as fast as a new worker could be started."""
    if demand.enqueued is None:
        return state
    if state.enqueued is None or state.rate_at is None or demand.enqueued < state.enqueued or now <= state.rate_at:
        if state.enqueued == demand.enqueued and state.rate_at is not None:
            return state
        return replace(state, enqueued=demand.enqueued, rate_at=now)  # first sample, or the counter was reset
    elapsed = now - state.rate_at
    sample = (demand.enqueued - state.enqueued) / elapsed
    weight = 1.0 - math.exp(-elapsed / max(policy.boot_s, 1.0))
    return replace(state, enqueued=demand.enqueued, rate_at=now, rate=state.rate + weight * (sample - state.rate))


def _gathering(policy: ScalePolicy, demand: Demand, current: int) -> bool:
    """A few jobs at zero wait up to ``gather_s`` (by the oldest one's age) for company, so one boot serves them
    all: the latency budget spent where it is cheap, on a quiet queue, never under load."""
    return (policy.gather_s > 0 and policy.min == 0 and current == 0 and demand.busy_workers <= 0
            and demand.oldest_wait_s is not None and demand.oldest_wait_s < policy.gather_s
            and demand.pending <= 0 and demand.delayed <= 0 and 0 < demand.lag < policy.target_per_worker)


def _expect_work_within_a_boot(policy: ScalePolicy, demand: Demand, state: ScaleState) -> bool:
    """Whether a worker stopped now would likely be asked for again before a new one could boot: at least one
    arrival expected within ``boot_s``. Unknown (no arrival counter) counts as yes, as before the forecast."""
    return demand.enqueued is None or policy.boot_s <= 0 or state.rate * policy.boot_s >= 1.0


def _expected_workers(policy: ScalePolicy, demand: Demand, state: ScaleState) -> int | None:
    """Workers the arrivals alone keep busy (Little's law: arrivals per second times the seconds each job holds a
    slot, over the jobs one worker carries); None without a forecast or a measured job time."""
    if demand.enqueued is None or demand.job_s is None or policy.boot_s <= 0:
        return None
    return math.ceil(state.rate * demand.job_s / policy.target_per_worker)


def decide(policy: ScalePolicy, demand: Demand, state: ScaleState, now: float) -> Decision:
    state = arrival_rate(policy, demand, state, now)
    decision = _decide(policy, demand, state, now)
    current = decision.desired
    if not policy.drain:
        return decision
    if current == 0:
        return replace(decision, target=0)
    need = _needed(policy, demand)
    return replace(decision, target=min(current, max(need, 1)))


def _decide(policy: ScalePolicy, demand: Demand, state: ScaleState, now: float) -> Decision:
    current = state.desired
    if demand.idle:
        idle_since = state.idle_since if state.idle_since is not None and state.idle_since <= now else now
    else:
        idle_since = None
    idle_for = now - idle_since if idle_since is not None else 0.0
    need = _needed(policy, demand)
    gather = _gathering(policy, demand, current)
    if gather:
        need = 0
    elif need == 0:
        # nothing to do: one worker stays warm until the queue has been idle for the whole idle window, or, when
        # the arrival forecast says no job is due within a boot time, goes at once (a boot costs less than the wait)
        soon = _expect_work_within_a_boot(policy, demand, state)
        done = idle_since is not None and (idle_for >= policy.zero_after_s or not soon)
        need = 0 if done else min(1, current)
    busy = min(max(demand.busy_workers, 0), policy.max)
    floor = max(need, busy)  # the fewest workers allowed now: never below the workers with jobs in flight

    def changed_to(desired: int, action: Action, reason: str) -> Decision:
        new = replace(state, desired=desired, changed_at=now, below_since=None, idle_since=idle_since, window_peak=0)
        return Decision(desired, reason, new, True, action)

    if floor > current:
        return changed_to(floor, Action.SCALE_UP,
                          f"scale_up: backlog {demand.backlog}, {demand.busy_workers} busy -> {floor} workers "
                          f"(target {policy.target_per_worker} per worker)")
    if current > policy.max:
        return changed_to(policy.max, Action.SCALE_DOWN, f"scale_down: {current} is above max {policy.max}")
    if gather and current == 0:
        held = replace(state, below_since=None, window_peak=0, idle_since=idle_since)
        return Decision(0, f"hold: gathering {demand.lag} job(s) for {demand.oldest_wait_s:.0f}/"
                           f"{policy.gather_s:.0f}s before starting a worker", held, False, Action.HOLD)
    if need >= current:
        steady = replace(state, below_since=None, window_peak=0, idle_since=idle_since)
        return Decision(current, f"steady: backlog {demand.backlog} -> {current} workers", steady, False)

    # need < current: the backlog asks for fewer workers
    since_change = now - state.changed_at
    if need == 0:
        if since_change >= policy.cooldown_s:
            why = f"idle for {idle_for:.0f}s" if idle_for >= policy.zero_after_s else (
                f"idle, and under one job expected within a {policy.boot_s:.0f}s boot")
            return changed_to(0, Action.SCALE_TO_ZERO, f"scale_to_zero: {why}")
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
        # boot-aware: within the calm window only the workers the arrival forecast may ask for again stay
        expected = _expected_workers(policy, demand, state)
        early = max(min(current, expected), need, busy) if expected is not None else current
        if early < current:
            return changed_to(early, Action.SCALE_DOWN,
                              f"scale_down: backlog {demand.backlog}, {demand.busy_workers} busy, arrivals "
                              f"{state.rate:.3f}/s need {expected} within a {policy.boot_s:.0f}s boot")
        reason = f"hold: cooldown {calm_for:.0f}/{policy.cooldown_s:.0f}s before scaling {current} -> {peak}"
        return Decision(current, reason, held, False, Action.HOLD)
    target = max(peak, busy)
    if target >= current:
        reason = f"hold: {demand.busy_workers} workers busy, the backlog needs {need}"
        return Decision(current, reason, held, False, Action.HOLD)
    return changed_to(target, Action.SCALE_DOWN,
                      f"scale_down: backlog {demand.backlog}, {demand.busy_workers} busy, at most {peak} workers "
                      f"needed for {calm_for:.0f}s")
