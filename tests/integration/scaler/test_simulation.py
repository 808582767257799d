"""The elasticity simulation behind ``make bench`` runs the real policy and reports what it claims to."""

from __future__ import annotations

import json
from pathlib import Path

from bench import sim_fleet, sim_strategies, sim_work, simulate
from inferq.scaling.policy import ScalePolicy


def test_the_quick_simulation_reports_every_strategy_and_plots(tmp_path: Path) -> None:
    report: dict = {}
    section = simulate.run(report, tmp_path, quick=True)
    assert report["elasticity"] is section
    assert (tmp_path / "elasticity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "elasticity.json").read_text())["results"] == section["results"]
    results = section["results"]
    assert set(results) == {"always_on", "keda_like", "inferq_60s", "inferq_10s", "inferq_10s_jobs_only",
                            "inferq_10s_gather", "inferq_10s_work", "keda_like_peak_max", "inferq_10s_peak_max",
                            "inferq_10s_warm_pool"}
    jobs = section["scenario"]["jobs"]
    for r in results.values():
        assert r["jobs"] == jobs  # every job served, by every strategy
        assert 0 <= r["p50_wait_s"] <= r["p95_wait_s"] <= r["max_wait_s"]
    assert results["always_on"]["scale_changes"] == 0
    assert results["inferq_10s"]["gpu_minutes"] < 0.5 * results["always_on"]["gpu_minutes"]
    assert set(section["targets"]) == set(simulate.COMPARISONS)
    assert set(section["traces"]) == {"bursty_day", "business_hours", "trickle", "spike_storm"}
    for trace in section["traces"].values():
        assert {r["jobs"] for r in trace["results"].values()} == {trace["jobs"]}
        assert "inferq_10s_work" in trace["results"]
    two = section["two_models"]  # a fleet per model, each model's rows and the two together
    assert set(two["models"]) == {"chat", "summarize"}
    for key, both in two["both"].items():
        per_model = [m["results"][key] for m in two["models"].values()]
        assert both["jobs"] == sum(m["jobs"] for m in two["models"].values()) == sum(r["jobs"] for r in per_model)
        assert abs(both["gpu_minutes"] - sum(r["gpu_minutes"] for r in per_model)) < 1e-6
    assert "two models, a fleet each" in simulate.render(section)


def test_the_seeded_day_meets_the_issue_41_targets() -> None:
    """The reference day (seed 20240601, 120 s boot): the default policy at <= 25% of always-on's GPU-minutes at a
    p95 no worse than always-on's, and >= 20% fewer than KEDA-like at a p95 no worse than KEDA-like's."""
    _, _, rows = simulate.simulate(sim_fleet.Scenario())
    results = {key: result for key, result, _ in rows}
    assert results["always_on"]["jobs"] == 10860
    assert simulate.targets(results, "inferq_10s", "keda_like")["met"]
    # the drain target and forecast are what moved it: the job-count policy alone uses more
    assert results["inferq_10s"]["gpu_minutes"] < results["inferq_10s_jobs_only"]["gpu_minutes"]
    # sized by work, beside it on the same day: fewer GPU-minutes, the same jobs
    assert results["inferq_10s_work"]["jobs"] == 10860
    assert results["inferq_10s_work"]["gpu_minutes"] < results["inferq_10s"]["gpu_minutes"]


def test_tokens_leave_the_seeded_day_as_it_is() -> None:
    """The tokens come from a generator of their own: the day's arrivals and service times are make_trace's."""
    sc = sim_fleet.Scenario()
    plain = sim_fleet.make_trace(sc)
    tokens = sim_work.with_tokens(plain, sc.seed)
    assert (tokens.arrivals, tokens.service) == (plain.arrivals, plain.service)
    assert tokens.max_tokens is not None and tokens.out_tokens is not None
    assert all(m >= o for m, o in zip(tokens.max_tokens, tokens.out_tokens, strict=True))


def test_the_sims_backlog_tokens_follow_its_unfinished_jobs() -> None:
    """Three jobs at once, one worker of window 1: the backlog's tokens fall by each job's max_tokens as it ends,
    and the measured throughput is its output over its service time."""
    sc = sim_fleet.Scenario(seed=1, day_s=100.0, window=1, bursts=0)
    trace = sim_fleet.Trace([0.0, 0.0, 0.0], [10.0, 10.0, 10.0], [], max_tokens=[512, 256, 64],
                            out_tokens=[250, 250, 50])
    seen = []

    class One(sim_fleet.Controller):
        def start(self, sim: sim_fleet.Sim) -> None:
            sim.workers = [sim_fleet.Worker(asked_at=0.0, ready_at=0.0)]
            sim.desired = 1
            for t in (5.0, 15.0, 25.0, 35.0):
                sim.at(t, sim_fleet.TICK)

        def on_tick(self, sim: sim_fleet.Sim, now: float, tag: object) -> None:
            o = sim.observe(now)
            seen.append((o.backlog_tokens, o.slot_tokens_per_s))

    sim_fleet.Sim(trace, sc).run(One())
    assert seen == [(832, None), (320, 25.0), (64, 25.0), (0, 550 / 30)]


def test_a_surplus_worker_stops_pulling_and_stops_once_empty() -> None:
    """The sim's drain target: with target 1, the newer worker takes nothing new and ECS stops it once empty."""
    sc = sim_fleet.Scenario(seed=1, day_s=600.0, base_night_per_s=1e-9, base_day_per_s=1e-9, bursts=0)
    trace = sim_fleet.Trace(arrivals=[float(t) for t in range(0, 300, 5)], service=[20.0] * 60, bursts=[])

    class TwoThenOne(sim_strategies.Controller):
        def start(self, sim: sim_fleet.Sim) -> None:
            sim.workers = [sim_fleet.Worker(asked_at=0.0, ready_at=0.0) for _ in range(2)]
            sim.desired = 2
            sim.at(60.0, sim_fleet.TICK, "drain")

        def on_tick(self, sim: sim_fleet.Sim, now: float, tag: object) -> None:
            sim.set_target(1, now)
            sim.set_desired(1, now)

    sim = sim_fleet.Sim(trace, sc)
    result = sim.run(TwoThenOne())
    assert result["jobs"] == 60
    newer = sim.workers[1]
    assert newer.stopped_at is not None and newer.stopped_at <= 60.0 + 20.0 + 1e-9


def test_the_simulation_is_deterministic_per_seed() -> None:
    sc = sim_fleet.Scenario(seed=5).quick()
    first = [r for _, r, _ in simulate.simulate(sc)[2]]
    again = [r for _, r, _ in simulate.simulate(sc)[2]]
    assert first == again


def test_a_fleet_that_never_scales_waits_forever_and_the_sim_says_so() -> None:
    """A controller that keeps zero workers serves nothing: the sim must not report jobs it never ran."""
    sc = sim_fleet.Scenario(seed=3, day_s=3600.0, bursts=0)
    trace = sim_fleet.make_trace(sc)

    class Never(sim_strategies.Controller):
        pass

    result = sim_fleet.Sim(trace, sc).run(Never())
    assert result["jobs"] == 0 and result["gpu_minutes"] == 0


def test_the_policy_row_reacts_to_a_lone_job_at_zero_within_the_wake_latency() -> None:
    """One job on an idle day: the gateway's wake gets it a worker at once (boot time aside)."""
    sc = sim_fleet.Scenario(seed=1, day_s=3600.0, base_night_per_s=1e-9, base_day_per_s=1e-9, bursts=0)
    trace = sim_fleet.Trace(arrivals=[600.0], service=[10.0], bursts=[])
    result = sim_fleet.Sim(trace, sc).run(sim_strategies.InferqPolicy(ScalePolicy(gather_s=0), every_s=60.0))
    assert result["jobs"] == 1
    assert sc.boot_s <= result["max_wait_s"] <= sc.boot_s + 1.0 + 1e-6
    # gathering: the lone job waits up to gather_s (to the next evaluation after it) for company, then boots
    gathered = sim_fleet.Sim(trace, sc).run(sim_strategies.InferqPolicy(ScalePolicy(gather_s=30), every_s=10.0))
    assert sc.boot_s + 30.0 <= gathered["max_wait_s"] <= sc.boot_s + 30.0 + 10.0 + 1e-6
