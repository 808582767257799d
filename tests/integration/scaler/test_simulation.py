"""The elasticity simulation behind ``make bench`` runs the real policy and reports what it claims to."""

from __future__ import annotations

import json
from pathlib import Path

from bench import sim_fleet, sim_strategies, simulate
from inferq.policy import ScalePolicy


def test_the_quick_simulation_reports_every_strategy_and_plots(tmp_path: Path) -> None:
    report: dict = {}
    section = simulate.run(report, tmp_path, quick=True)
    assert report["elasticity"] is section
    assert (tmp_path / "elasticity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "elasticity.json").read_text())["results"] == section["results"]
    results = section["results"]
    assert set(results) == {"always_on", "keda_like", "inferq_60s", "inferq_10s", "keda_like_peak_max",
                            "inferq_10s_peak_max"}
    jobs = section["scenario"]["jobs"]
    for r in results.values():
        assert r["jobs"] == jobs  # every job served, by every strategy
        assert 0 <= r["p50_wait_s"] <= r["p95_wait_s"] <= r["max_wait_s"]
    assert results["always_on"]["scale_changes"] == 0
    assert results["inferq_10s"]["gpu_minutes"] < 0.5 * results["always_on"]["gpu_minutes"]
    assert set(section["targets"]) == set(simulate.COMPARISONS)


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
    result = sim_fleet.Sim(trace, sc).run(sim_strategies.InferqPolicy(ScalePolicy(), every_s=60.0))
    assert result["jobs"] == 1
    assert sc.boot_s <= result["max_wait_s"] <= sc.boot_s + 1.0 + 1e-6
