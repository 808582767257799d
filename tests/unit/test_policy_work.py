"""Work-based sizing (inferq/scaling/policy.py): hand-made situations where the backlog's expected tokens and the
fleet's measured throughput, not the job counts, decide how many workers start, which ones keep pulling, and when
a worker that is no longer needed goes (boot-aware scale-in with work-based sizing)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferq.config.settings import Settings
from inferq.scaling.policy import Action, Demand, ScalePolicy, ScaleState, decide, worker_tokens_per_s, workers_for_work

NOW = 1_000_000.0
POLICY = ScalePolicy(max=10, target_per_worker=8, boot_s=120, cooldown_s=120, zero_after_s=300, tokens_per_s=200)
SLOT = 25.0
"""A slot's measured output tokens per second: a worker of 8 slots makes 200 tokens/s."""


def test_twenty_short_jobs_at_zero_start_one_worker_not_three() -> None:
    """20 jobs of 50 tokens: 1,000 tokens, 5 s of one worker's work. Counted by jobs they ask for 3 workers (8 per
    worker); the two beyond the first would boot for 120 s to find the work done."""
    demand = Demand(lag=20, backlog_tokens=20 * 50, slot_tokens_per_s=SLOT)
    d = decide(POLICY, demand, ScaleState(), NOW)
    assert (d.desired, d.target, d.action) == (1, 1, Action.SCALE_UP)
    by_count = decide(POLICY, replace(demand, backlog_tokens=None), ScaleState(), NOW)
    assert by_count.desired == 3


def test_twenty_long_jobs_start_as_many_workers_as_the_job_counts_allow() -> None:
    """20 jobs of 4,000 tokens: 80,000 tokens, 400 s of one worker's work = 4 workers within a boot; the jobs' count
    (3 workers of 8 slots) stays the ceiling: a fourth worker would have no job to take."""
    d = decide(POLICY, Demand(lag=20, backlog_tokens=20 * 4000, slot_tokens_per_s=SLOT), ScaleState(), NOW)
    assert d.desired == 3


def test_the_same_backlog_sizes_by_the_fleets_measured_throughput() -> None:
    """80 jobs, 96,000 tokens: a fleet measured at 25 tokens/s per slot (200 per worker) needs 4 workers, one twice
    as fast 2; before any measurement the assumed INFERQ_SCALE_TOKENS_PER_S decides."""
    demand = Demand(lag=80, backlog_tokens=96_000)
    assert decide(POLICY, replace(demand, slot_tokens_per_s=SLOT), ScaleState(), NOW).desired == 4
    assert decide(POLICY, replace(demand, slot_tokens_per_s=2 * SLOT), ScaleState(), NOW).desired == 2
    assert decide(POLICY, demand, ScaleState(), NOW).desired == 4  # assumed 200 tokens/s per worker
    assert decide(replace(POLICY, tokens_per_s=800), demand, ScaleState(), NOW).desired == 1
    off = replace(POLICY, tokens_per_s=0)  # the default: job counts alone, measured or not
    assert decide(off, demand, ScaleState(), NOW).desired == 10
    assert decide(off, replace(demand, slot_tokens_per_s=SLOT), ScaleState(), NOW).desired == 10


def test_without_the_backlogs_tokens_or_a_boot_time_the_job_counts_decide() -> None:
    demand = Demand(lag=20, slot_tokens_per_s=SLOT)
    assert workers_for_work(POLICY, demand) is None
    assert decide(POLICY, demand, ScaleState(), NOW).desired == 3
    no_boot = replace(POLICY, boot_s=0)
    assert decide(no_boot, replace(demand, backlog_tokens=1000), ScaleState(), NOW).desired == 3


def test_work_based_sizing_never_goes_below_one_worker_for_a_backlog_nor_below_the_busy_ones() -> None:
    assert workers_for_work(POLICY, Demand(lag=1, backlog_tokens=0, slot_tokens_per_s=SLOT)) == 1
    d = decide(POLICY, Demand(pending=10, busy_workers=5, backlog_tokens=500, slot_tokens_per_s=SLOT),
               ScaleState(desired=5, changed_at=NOW - 600), NOW)
    assert d.desired == 5  # the five busy workers hold the count until they are idle
    assert d.target == 1  # but only the oldest takes new jobs: new work packs onto it


def test_under_load_a_fleet_sized_by_work_drains_the_workers_its_work_does_not_need() -> None:
    """After a burst of long jobs, 6 workers; what is left is short work: 48 jobs in flight and waiting but only
    12,000 tokens, 60 s of one worker's work. The drain target packs new work onto one worker; the count holds
    while the others finish their jobs, then comes down after the calm window, to the busy ones."""
    state = ScaleState(desired=6, changed_at=NOW - 600)
    demand = Demand(lag=8, pending=40, busy_workers=6, backlog_tokens=12_000, slot_tokens_per_s=SLOT)
    d = decide(POLICY, demand, state, NOW)
    assert (d.desired, d.target) == (6, 1)
    later = decide(POLICY, replace(demand, lag=0, pending=10, busy_workers=2, backlog_tokens=2_000), d.state,
                   NOW + POLICY.cooldown_s)
    assert (later.desired, later.action) == (2, Action.SCALE_DOWN)


def test_boot_aware_scale_in_with_work_sizing_keeps_a_worker_the_arrivals_need() -> None:
    """After a burst, 8 workers and little left: arrivals of 1 job/s at 20 s each keep 3 workers' slots busy, so
    3 stay (boot-aware); the backlog's small work alone would have kept 1."""
    state = ScaleState(desired=8, changed_at=NOW - 30, enqueued=1000, rate_at=NOW - 10, rate=1.0)
    demand = Demand(pending=5, busy_workers=1, enqueued=1010, job_s=20.0, backlog_tokens=2500,
                    slot_tokens_per_s=SLOT)
    d = decide(POLICY, demand, state, NOW)
    assert (d.desired, d.action, d.target) == (3, Action.SCALE_DOWN, 1)
    quiet = replace(state, rate=0.0)  # nothing arriving: down to the workers with jobs in flight
    assert decide(POLICY, replace(demand, enqueued=1000), quiet, NOW).desired == 1


def test_a_worker_idle_with_no_work_due_within_a_boot_goes_whatever_the_backlog_tokens_said() -> None:
    state = ScaleState(desired=1, changed_at=NOW - 600, idle_since=NOW - 30, enqueued=100, rate_at=NOW - 10,
                       rate=1 / 600)
    d = decide(POLICY, Demand(enqueued=100, job_s=20.0, backlog_tokens=0, slot_tokens_per_s=SLOT), state, NOW)
    assert (d.desired, d.action) == (0, Action.SCALE_TO_ZERO)


def test_one_workers_throughput_is_measured_per_slot_times_its_slots() -> None:
    assert worker_tokens_per_s(POLICY, Demand(slot_tokens_per_s=SLOT)) == pytest.approx(200.0)
    assert worker_tokens_per_s(POLICY, Demand()) == 200.0
    assert worker_tokens_per_s(POLICY, Demand(slot_tokens_per_s=0.0)) == 200.0  # no tokens measured yet
    assert worker_tokens_per_s(replace(POLICY, tokens_per_s=0), Demand(slot_tokens_per_s=SLOT)) == 0.0  # off


def test_work_based_sizing_is_a_setting_off_by_default() -> None:
    """Off by default: the desired count is the job-count formula (docs/operations.md) unless a throughput is
    set."""
    assert ScalePolicy.from_settings(Settings()).tokens_per_s == 0.0
    assert decide(ScalePolicy.from_settings(Settings()),
                  Demand(lag=20, backlog_tokens=1000, slot_tokens_per_s=SLOT), ScaleState(), NOW).desired == 3
    assert ScalePolicy.from_settings(Settings(scale_tokens_per_s=1500)).tokens_per_s == 1500.0
    with pytest.raises(ValueError):
        ScalePolicy(tokens_per_s=-1)
