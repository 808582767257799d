"""The scaling policy's guarantees (docs/operations.md), as properties over any policy, demand and memory."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from inferq.config.settings import Settings
from inferq.queue.protocol import Observation
from inferq.scaling.policy import Action, Demand, ScalePolicy, ScaleState, decide, wanted

PROPERTY = settings(deadline=None, max_examples=300)
NOW = 1_764_400_000.0


@st.composite
def policies(draw: st.DrawFn, min_cooldown: float = 0.0) -> ScalePolicy:
    lo = draw(st.integers(0, 3))
    return ScalePolicy(
        min=lo,
        max=draw(st.integers(max(lo, 1), lo + 10)),
        target_per_worker=draw(st.integers(1, 16)),
        cooldown_s=draw(st.one_of(st.just(min_cooldown), st.floats(min_cooldown, 600.0))),
        zero_after_s=draw(st.one_of(st.just(0.0), st.floats(0.0, 900.0))),
    )


def _demands(most: int) -> st.SearchStrategy[Demand]:
    return st.builds(
        Demand,
        lag=st.integers(0, most),
        pending=st.integers(0, most // 2),
        delayed=st.integers(0, most // 8),
        busy_workers=st.integers(0, 14),
    )


# idle, draining (nothing waiting, workers still busy), nearly idle and loaded queues
demands = st.one_of(
    st.just(Demand()), st.builds(Demand, busy_workers=st.integers(1, 14)), _demands(3), _demands(400)
)
maybe_past = st.one_of(st.none(), st.floats(0.0, 3600.0).map(lambda ago: NOW - ago))
states = st.builds(
    ScaleState,
    desired=st.integers(0, 16),
    changed_at=st.floats(0.0, 3600.0).map(lambda ago: NOW - ago),
    below_since=maybe_past,
    idle_since=maybe_past,
    window_peak=st.integers(0, 16),
)


@PROPERTY
@given(policies(), demands, states)
def test_desired_stays_within_min_and_max(policy: ScalePolicy, demand: Demand, state: ScaleState) -> None:
    d = decide(policy, demand, state, NOW)
    assert policy.min <= d.desired <= policy.max
    assert d.state.desired == d.desired
    assert d.changed == (d.desired != state.desired)


@PROPERTY
@given(policies(), demands, states)
def test_never_below_the_busy_workers(policy: ScalePolicy, demand: Demand, state: ScaleState) -> None:
    assert decide(policy, demand, state, NOW).desired >= min(demand.busy_workers, policy.max)


@PROPERTY
@given(policies(), demands, states, st.integers(0, 400), st.sampled_from(["lag", "pending", "delayed"]))
def test_monotone_in_backlog(policy: ScalePolicy, demand: Demand, state: ScaleState, more: int, part: str) -> None:
    bigger = replace(demand, **{part: getattr(demand, part) + more})
    assert decide(policy, demand, state, NOW).desired <= decide(policy, bigger, state, NOW).desired


@PROPERTY
@given(policies(), demands, states)
def test_scale_up_is_immediate(policy: ScalePolicy, demand: Demand, state: ScaleState) -> None:
    want = wanted(policy, demand)
    assume(want > state.desired)
    d = decide(policy, demand, state, NOW)
    assert (d.desired, d.action, d.changed) == (want, Action.SCALE_UP, True)


@PROPERTY
@given(policies(), demands, states)
def test_zero_only_when_idle_for_the_whole_idle_window(policy: ScalePolicy, demand: Demand, state: ScaleState) -> None:
    d = decide(policy, demand, state, NOW)
    if d.desired == 0:
        assert demand.backlog == 0 and demand.busy_workers == 0
        if state.desired > 0:
            assert d.action is Action.SCALE_TO_ZERO
            assert d.state.idle_since is not None and NOW - d.state.idle_since >= policy.zero_after_s
            assert NOW - state.changed_at >= policy.cooldown_s


@PROPERTY
@given(policies(), states)
def test_one_job_at_zero_scales_to_one(policy: ScalePolicy, state: ScaleState) -> None:
    d = decide(policy, Demand(lag=1), replace(state, desired=0), NOW)
    assert d.desired == max(1, policy.min)
    assert d.action is Action.SCALE_UP


@pytest.mark.parametrize("part", ["lag", "pending", "delayed"])
def test_any_kind_of_backlog_wakes_a_fleet_at_zero(part: str) -> None:
    d = decide(ScalePolicy(), Demand(**{part: 1}), ScaleState(), NOW)
    assert d.desired == 1


@PROPERTY
@given(policies(), demands, states)
def test_a_scale_down_waits_out_the_cooldown(policy: ScalePolicy, demand: Demand, state: ScaleState) -> None:
    assume(state.desired <= policy.max)
    d = decide(policy, demand, state, NOW)
    if d.desired < state.desired:
        assert NOW - state.changed_at >= policy.cooldown_s


@st.composite
def two_levels(draw: st.DrawFn) -> tuple[Demand, Demand]:
    lo = draw(demands)
    hi = Demand(
        lag=lo.lag + draw(st.integers(0, 300)),
        pending=lo.pending + draw(st.integers(0, 100)),
        delayed=lo.delayed,
        busy_workers=lo.busy_workers + draw(st.integers(0, 6)),
    )
    return lo, hi


@settings(deadline=None, max_examples=150)
@given(
    policies(min_cooldown=1.0),
    two_levels(),
    st.lists(st.tuples(st.booleans(), st.floats(1.0, 900.0)), min_size=1, max_size=40),
    st.floats(1.0, 60.0),
    st.integers(0, 10),
)
def test_flapping_is_bounded_under_oscillating_load(
    policy: ScalePolicy, levels: tuple[Demand, Demand], phases: list[tuple[bool, float]], every: float, start: int
) -> None:
    """Load that swings between a low and a high level, for any dwell times, evaluated every ``every`` seconds:
    every scale-down waits ``cooldown`` after the previous change and each scale-down allows at most one scale-up,
    so changes <= (max - min) + 2 * (T / cooldown + 1)."""
    state = ScaleState(desired=min(start, policy.max), changed_at=NOW - 10_000)
    t, changes, last_change, downs = NOW, 0, -math.inf, 0
    for high, dwell in phases:
        end = t + dwell
        while t < end:
            d = decide(policy, levels[1] if high else levels[0], state, t)
            if d.changed:
                if d.desired < state.desired:
                    assert t - last_change >= policy.cooldown_s
                    downs += 1
                changes += 1
                last_change = t
            state = d.state
            t += every
    span = t - NOW
    assert downs <= span / policy.cooldown_s + 1
    assert changes <= 2 * (span / policy.cooldown_s + 1) + 2
    assert changes <= (policy.max - policy.min) + 2 * (span / policy.cooldown_s + 1) + 1


@settings(deadline=None, max_examples=100)
@given(policies(), demands, st.integers(0, 16), st.floats(1.0, 30.0))
def test_constant_load_settles(policy: ScalePolicy, demand: Demand, start: int, every: float) -> None:
    """Under unchanging demand the count settles (at most one change up, then at most two down) and stays."""
    state = ScaleState(desired=min(start, policy.max), changed_at=NOW - 10_000)
    t, history = NOW, []
    horizon = NOW + policy.cooldown_s * 3 + policy.zero_after_s + 10 * every
    while t < horizon:
        d = decide(policy, demand, state, t)
        if d.changed:
            history.append(d.desired)
        state, t = d.state, t + every
    assert len(history) <= 3
    assert decide(policy, demand, state, t).changed is False


def run(policy: ScalePolicy, timeline: list[tuple[float, Demand]], state: ScaleState) -> list[tuple[float, int]]:
    out = []
    for at, demand in timeline:
        d = decide(policy, demand, state, NOW + at)
        state = d.state
        out.append((at, d.desired))
    return out


def test_scale_down_happens_once_the_calm_window_is_over() -> None:
    policy = ScalePolicy(max=8, target_per_worker=8, cooldown_s=120)
    state = ScaleState(desired=4, changed_at=NOW - 600)
    timeline = [(t, Demand(pending=8, busy_workers=1)) for t in range(0, 200, 5)]
    seen = dict(run(policy, timeline, state))
    assert all(seen[t] == 4 for t in range(0, 120, 5))
    assert seen[120] == 1


def test_a_dip_in_the_calm_window_does_not_break_it_but_its_peak_counts() -> None:
    """Demand below the count, jumping between 3 and 1 workers' worth: the count comes down to 3, not 1."""
    policy = ScalePolicy(max=8, target_per_worker=8, cooldown_s=120)
    state = ScaleState(desired=6, changed_at=NOW - 600)
    timeline = [(t, Demand(pending=24 if (t // 10) % 2 else 8)) for t in range(0, 130, 5)]
    assert run(policy, timeline, state)[-1] == (125, 3)


def test_demand_back_at_the_count_restarts_the_calm_window() -> None:
    policy = ScalePolicy(max=8, target_per_worker=8, cooldown_s=120)
    state = ScaleState(desired=2, changed_at=NOW - 600)
    timeline = [(t, Demand(pending=8)) for t in range(0, 100, 5)]
    timeline += [(100, Demand(pending=16))]
    timeline += [(t, Demand(pending=8)) for t in range(105, 330, 5)]
    seen = dict(run(policy, timeline, state))
    assert seen[215] == 2 and seen[225] == 1  # 120 s after 105, not after 0


def test_a_busy_worker_holds_the_count_until_it_is_idle() -> None:
    policy = ScalePolicy(max=8, target_per_worker=8, cooldown_s=60)
    state = ScaleState(desired=3, changed_at=NOW - 600)
    timeline = [(t, Demand(pending=3, busy_workers=3)) for t in range(0, 100, 10)]
    timeline += [(100, Demand(pending=2, busy_workers=2))]
    assert run(policy, timeline, state)[-1] == (100, 2)  # the calm window ran all along; busy workers held it


def test_to_zero_only_after_the_idle_window_keeping_one_warm_meanwhile() -> None:
    policy = ScalePolicy(max=8, target_per_worker=8, cooldown_s=120, zero_after_s=300)
    state = ScaleState(desired=3, changed_at=NOW - 600)
    timeline = [(0, Demand(pending=1, busy_workers=1))] + [(t, Demand()) for t in range(5, 400, 5)]
    seen = dict(run(policy, timeline, state))
    assert seen[115] == 3 and seen[120] == 1  # the calm window (from 0 s) is over; one stays warm
    assert seen[300] == 1 and seen[305] == 0  # idle since 5 s: 300 s later, to zero
    assert seen[395] == 0


def test_work_arriving_during_the_idle_window_restarts_it() -> None:
    policy = ScalePolicy(zero_after_s=300, cooldown_s=120)
    state = ScaleState(desired=1, changed_at=NOW - 600)
    timeline = [(t, Demand()) for t in range(0, 250, 10)] + [(250, Demand(delayed=1))]
    timeline += [(t, Demand()) for t in range(260, 600, 10)]
    seen = dict(run(policy, timeline, state))
    assert seen[550] == 1 and seen[560] == 0


def test_a_busy_worker_with_nothing_waiting_is_never_scaled_away() -> None:
    """Its job is pending until acknowledged, but a worker's heartbeat can say busy first: either keeps it."""
    policy = ScalePolicy(cooldown_s=0, zero_after_s=0)
    state = ScaleState(desired=2, changed_at=NOW - 600, idle_since=NOW - 600)
    assert [d for _, d in run(policy, [(t, Demand(busy_workers=1)) for t in range(0, 50, 10)], state)] == [1] * 5


def test_min_workers_stay_up_when_idle() -> None:
    policy = ScalePolicy(min=2, max=4, cooldown_s=0, zero_after_s=0)
    state = ScaleState(desired=4, changed_at=NOW - 600)
    assert [d for _, d in run(policy, [(t, Demand()) for t in range(0, 50, 10)], state)][-1] == 2


def test_above_max_comes_down_at_once() -> None:
    d = decide(ScalePolicy(max=3), Demand(lag=1000), ScaleState(desired=7, changed_at=NOW), NOW)
    assert (d.desired, d.action) == (3, Action.SCALE_DOWN)


def test_a_count_changed_by_someone_else_is_adopted_and_kept_for_a_cooldown() -> None:
    policy = ScalePolicy(max=8, cooldown_s=120)
    ours = ScaleState(desired=1, changed_at=NOW - 600, below_since=NOW - 500, window_peak=1)
    adopted = ours.adopt(5, NOW)
    assert (adopted.desired, adopted.changed_at, adopted.below_since) == (5, NOW, None)
    assert decide(policy, Demand(pending=3), adopted, NOW + 60).desired == 5
    assert decide(policy, Demand(pending=3), decide(policy, Demand(pending=3), adopted, NOW + 60).state,
                  NOW + 180).desired == 1
    assert ours.adopt(1, NOW) is ours


@PROPERTY
@given(states)
def test_state_round_trips_through_the_scale_hash(state: ScaleState) -> None:
    fields = {"desired": str(state.desired), "reason": "x", "at": "1", **state.to_fields()}
    assert all(isinstance(v, str) for v in fields.values())
    assert ScaleState.from_fields(fields) == state


def test_an_empty_or_damaged_scale_hash_reads_as_the_initial_state() -> None:
    assert ScaleState.from_fields({}) == ScaleState()
    assert ScaleState.from_fields({"desired": "3", "changed_at": "soon"}) == ScaleState(desired=3)
    assert ScaleState.from_fields({"desired": "many"}) == ScaleState()


def test_policy_from_settings_uses_the_window_as_the_default_target() -> None:
    s = Settings(scale_min=1, scale_max=6, window=4, scale_down_cooldown_s=30, scale_to_zero_after_s=90)
    assert ScalePolicy.from_settings(s) == ScalePolicy(min=1, max=6, target_per_worker=4, cooldown_s=30,
                                                      zero_after_s=90)
    assert ScalePolicy.from_settings(s.replace(scale_target_per_worker=2)).target_per_worker == 2


@pytest.mark.parametrize(
    "kwargs", [{"min": 3, "max": 2}, {"min": -1}, {"target_per_worker": 0}, {"cooldown_s": -1.0}]
)
def test_an_impossible_policy_is_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ScalePolicy(**kwargs)


def test_demand_from_an_observation() -> None:
    o = Observation(lag=5, pending=2, delayed=1, delayed_due=0, unfinished=8, workers=2, busy_workers=1,
                    in_flight=2, oldest_entry_ms=0, group_missing=False, dlq=0, desired=None, reason="",
                    decided_at=None)
    assert Demand.from_observation(o) == Demand(lag=5, pending=2, delayed=1, busy_workers=1)
    assert Demand.from_observation(o).backlog == o.backlog == 8


# ---------------------------------------------------------------------------------------------- issue 41: cost


def test_a_lone_job_at_zero_is_gathered_for_gather_s_then_gets_a_worker() -> None:
    policy = ScalePolicy(gather_s=30)
    young, old = Demand(lag=2, oldest_wait_s=12.0), Demand(lag=2, oldest_wait_s=30.0)
    held = decide(policy, young, ScaleState(), NOW)
    assert (held.desired, held.action, held.target) == (0, Action.HOLD, 0)
    assert "gathering" in held.reason
    assert decide(policy, old, held.state, NOW + 18).desired == 1


def test_gathering_never_holds_a_full_worker_load_a_busy_fleet_or_a_min() -> None:
    policy = ScalePolicy(gather_s=30, target_per_worker=8)
    assert decide(policy, Demand(lag=8, oldest_wait_s=0.0), ScaleState(), NOW).desired == 1
    assert decide(policy, Demand(lag=1, oldest_wait_s=0.0), ScaleState(desired=1, changed_at=NOW - 9), NOW).desired == 1
    assert decide(replace(policy, min=1), Demand(lag=1, oldest_wait_s=0.0), ScaleState(), NOW).desired == 1
    assert decide(replace(policy, gather_s=0), Demand(lag=1, oldest_wait_s=0.0), ScaleState(), NOW).desired == 1


def _quiet(rate: float, idle_since: float | None = None) -> ScaleState:
    """One worker up for 10 minutes, the arrival forecast at ``rate`` per second."""
    return ScaleState(desired=1, changed_at=NOW - 600, idle_since=idle_since, enqueued=100, rate_at=NOW - 10,
                      rate=rate)


def test_boot_aware_to_zero_a_worker_not_needed_within_a_boot_goes_at_once() -> None:
    """One job every ~4 minutes and a 120 s boot: keeping the worker idle costs more than booting a new one."""
    policy = ScalePolicy(boot_s=120, zero_after_s=300, cooldown_s=120)
    d = decide(policy, Demand(enqueued=100, job_s=20.0), _quiet(1 / 240), NOW)
    assert (d.desired, d.action) == (0, Action.SCALE_TO_ZERO)
    assert "within a 120s boot" in d.reason


def test_boot_aware_to_zero_a_worker_needed_again_within_a_boot_stays_for_the_idle_window() -> None:
    """A job every ~20 s: the worker would be asked for again before a new one booted, so it stays."""
    policy = ScalePolicy(boot_s=120, zero_after_s=300, cooldown_s=120)
    kept = decide(policy, Demand(enqueued=100, job_s=20.0), _quiet(1 / 20, idle_since=NOW - 200), NOW)
    assert kept.desired == 1
    gone = decide(policy, Demand(enqueued=100, job_s=20.0), _quiet(1 / 20, idle_since=NOW - 300), NOW)
    assert gone.desired == 0  # the idle window still bounds it


def test_boot_aware_scale_in_keeps_the_workers_the_arrivals_need_and_lets_the_rest_go_early() -> None:
    """After a burst, 8 workers, the backlog wants 1: arrivals of 1 job/s at 20 s each keep 20 slots busy (3 workers
    of 8): those 3 stay through the calm window, the 5 others go now instead of 120 s later."""
    policy = ScalePolicy(max=10, target_per_worker=8, boot_s=120, cooldown_s=120)
    state = ScaleState(desired=8, changed_at=NOW - 30, enqueued=1000, rate_at=NOW - 10, rate=1.0)
    d = decide(policy, Demand(pending=5, busy_workers=1, enqueued=1010, job_s=20.0), state, NOW)
    assert (d.desired, d.action) == (3, Action.SCALE_DOWN)
    unknown = decide(policy, Demand(pending=5, busy_workers=1), state, NOW)  # no forecast: the calm window holds
    assert (unknown.desired, unknown.action) == (8, Action.HOLD)


def test_the_busy_floor_still_holds_under_boot_aware_scale_in() -> None:
    policy = ScalePolicy(max=10, target_per_worker=8, boot_s=120, cooldown_s=120)
    state = ScaleState(desired=8, changed_at=NOW - 30, enqueued=1000, rate_at=NOW - 10, rate=0.0)
    d = decide(policy, Demand(pending=6, busy_workers=6, enqueued=1000, job_s=20.0), state, NOW)
    assert d.desired == 6 and d.target == 1  # six still finish their jobs; only one takes new ones


def test_work_based_forecast_scales_with_the_measured_job_time() -> None:
    """The same arrivals with jobs twice as long keep twice the workers: sizing by work, not by job counts."""
    policy = ScalePolicy(max=20, target_per_worker=8, boot_s=120, cooldown_s=120)
    state = ScaleState(desired=12, changed_at=NOW - 30, enqueued=1000, rate_at=NOW - 10, rate=1.6)
    short = decide(policy, Demand(lag=1, enqueued=1016, job_s=10.0), state, NOW)
    long = decide(policy, Demand(lag=1, enqueued=1016, job_s=20.0), state, NOW)
    assert (short.desired, long.desired) == (2, 4)


def test_the_drain_target_is_what_the_backlog_needs_and_never_above_desired() -> None:
    policy = ScalePolicy(max=10, target_per_worker=8, cooldown_s=120)
    state = ScaleState(desired=6, changed_at=NOW - 30)
    d = decide(policy, Demand(pending=20, busy_workers=6), state, NOW)  # 20 jobs spread thin over 6 workers
    assert (d.desired, d.target) == (6, 3)  # three workers take new jobs; the other three drain
    up = decide(policy, Demand(lag=100), state, NOW)
    assert up.target == up.desired == 10
    idle = decide(policy, Demand(), ScaleState(desired=1, changed_at=NOW - 10), NOW)
    assert (idle.desired, idle.target) == (1, 1)  # the warm worker takes the next job


def test_without_drain_no_target_is_set_and_the_count_is_the_same() -> None:
    """INFERQ_SCALE_DRAIN=false (compose's fixed workers): the same desired count, and no target, so every worker
    pulls."""
    state = ScaleState(desired=6, changed_at=NOW - 30)
    demand = Demand(pending=20, busy_workers=6)
    with_drain = decide(ScalePolicy(max=10, cooldown_s=120), demand, state, NOW)
    without = decide(ScalePolicy(max=10, cooldown_s=120, drain=False), demand, state, NOW)
    assert (with_drain.desired, with_drain.target) == (6, 3)
    assert (without.desired, without.target) == (6, None)
    assert ScalePolicy.from_settings(Settings(scale_drain=False)).drain is False
    assert ScalePolicy.from_settings(Settings()).drain is True


def test_the_arrival_rate_follows_the_enqueued_counter() -> None:
    policy = ScalePolicy(boot_s=120)
    first = decide(policy, Demand(enqueued=50), ScaleState(), NOW).state
    assert (first.enqueued, first.rate_at, first.rate) == (50, NOW, 0.0)
    later = decide(policy, Demand(enqueued=50 + 120), first, NOW + 120).state
    assert later.rate == pytest.approx(1.0 * (1 - math.exp(-1)))
    reset = decide(policy, Demand(enqueued=3), later, NOW + 130).state
    assert (reset.enqueued, reset.rate) == (3, later.rate)  # a counter that went back restarts the count only


def test_the_new_memory_round_trips_through_the_scale_hash() -> None:
    state = ScaleState(desired=2, changed_at=NOW, enqueued=77, rate_at=NOW - 1, rate=0.25)
    fields = {"desired": "2", **state.to_fields()}
    assert ScaleState.from_fields(fields) == state


def test_policy_from_settings_carries_boot_and_gather() -> None:
    s = Settings(scale_boot_s=75.0, scale_gather_s=10.0)
    policy = ScalePolicy.from_settings(s)
    assert (policy.boot_s, policy.gather_s) == (75.0, 10.0)
