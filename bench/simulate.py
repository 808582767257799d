"""Elasticity simulation: a bursty day of jobs replayed against the real scaling policy and two baselines.

A discrete-event simulation of the GPU fleet. Every strategy sees the same seeded day: a Poisson base that
follows the clock (quiet nights, busy afternoons) plus batch bursts (hundreds of jobs submitted within a few
minutes), each job with its own service time. Workers take ``window`` jobs at once and pull the oldest waiting
job as soon as they have a free slot (waiting workers are served in turn, as Redis serves blocked XREADGROUP
clients). A new worker costs GPU time from the moment it is asked for and serves only after ``boot_s``. A worker
that ECS should stop is stopped once it has nothing in flight (ECS task scale-in protection).

Strategies:

- **always-on**: a fixed fleet sized for the peak: the throughput that serves the busiest 10 minutes of the day.
- **KEDA-like**: KEDA's Redis Streams scaler driving an HPA, with the usual defaults: polled every 30 s,
  activation when the backlog (lag + pending) exceeds 0, which takes 0 -> 1 only; the HPA (15 s sync) then
  asks for ``ceil(backlog / 5)`` replicas, with its 10% tolerance, its scale-up rate limit (double or +4 per
  15 s) and a 300 s scale-down stabilisation window; back to zero 300 s after the last active poll.
- **inferq**: ``inferq.policy.decide`` itself, with the default settings (target = window, cooldown 120 s,
  zero after 300 s), evaluated every 60 s (the EventBridge schedule alone) and every 10 s (the scaler's
  evaluations within its one-minute invocation); both with the gateway's wake-up call when the fleet is at zero.

Both autoscalers may grow to ``HEADROOM`` (2) times the always-on fleet; the ``max = peak`` rows give them the
always-on fleet's size as their ceiling instead. GPU time counts from the request for a worker to its stop, boot
included. Queue wait is from arrival to the start of the job's first attempt.

Run: ``python -m bench.simulate [--out DIR] [--quick] [--seed N] [--seeds N]``; ``make bench`` calls :func:`run`.
``--seeds N`` replays N other seeded days and counts those that meet the targets.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from inferq.policy import ScalePolicy

from .sim_fleet import Scenario, Sim, Trace, make_trace, peak_fleet
from .sim_strategies import AlwaysOn, Controller, InferqPolicy, KedaLike

HEADROOM = 2
"""The autoscalers' ceiling (INFERQ_SCALE_MAX) as a multiple of the always-on peak fleet. A scaled fleet pays for
its ceiling only while it uses it, and a higher one wins back the work lost while GPU instances boot. The rows
with ``max = peak`` show the same rules under the always-on fleet's own ceiling."""


def simulate(sc: Scenario) -> tuple[Trace, int, list[tuple[str, dict[str, Any], Sim]]]:
    trace = make_trace(sc)
    peak = peak_fleet(trace, sc)

    def policy(ceiling: int) -> ScalePolicy:  # the settings' defaults, ceiling aside
        return ScalePolicy(min=0, max=ceiling, target_per_worker=sc.window, cooldown_s=120.0, zero_after_s=300.0)

    top = HEADROOM * peak
    strategies: list[tuple[str, Callable[[], Controller], str]] = [
        ("always_on", lambda: AlwaysOn(peak), ""),
        ("keda_like", lambda: KedaLike(max_replicas=top), f"max {top}"),
        ("inferq_60s", lambda: InferqPolicy(policy(top), every_s=60.0), f"max {top}"),
        ("inferq_10s", lambda: InferqPolicy(policy(top), every_s=10.0), f"max {top}"),
        ("keda_like_peak_max", lambda: KedaLike(max_replicas=peak), f"max {peak}"),
        ("inferq_10s_peak_max", lambda: InferqPolicy(policy(peak), every_s=10.0), f"max {peak}"),
    ]
    rows = []
    for key, make, ceiling in strategies:
        controller = make()
        sim = Sim(trace, sc)
        result = sim.run(controller)
        result["name"] = controller.name + (f", {ceiling}" if ceiling else "")
        rows.append((key, result, sim))
    return trace, peak, rows


COMPARISONS = {
    "inferq_60s": "keda_like",
    "inferq_10s": "keda_like",
    "inferq_10s_peak_max": "keda_like_peak_max",
}


def targets(results: dict[str, dict[str, Any]], key: str, keda_key: str) -> dict[str, Any]:
    ours, always, keda = results[key], results["always_on"], results[keda_key]
    saving = 1.0 - ours["gpu_minutes"] / always["gpu_minutes"]
    p95_ratio = ours["p95_wait_s"] / always["p95_wait_s"] if always["p95_wait_s"] > 0 else math.inf
    fewer = ours["gpu_minutes"] < keda["gpu_minutes"]
    not_worse = ours["p95_wait_s"] <= keda["p95_wait_s"]
    return {
        "against": keda_key,
        "gpu_saving_vs_always_on": round(saving, 4),
        "p95_ratio_vs_always_on": round(p95_ratio, 3),
        "fewer_gpu_minutes_than_keda": fewer,
        "p95_not_worse_than_keda": not_worse,
        "met": saving >= 0.5 and p95_ratio <= 1.5 and fewer and not_worse,
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'strategy':56} {'GPU-min':>9} {'p50 wait':>9} {'p95 wait':>9} {'max wait':>9} {'changes':>8}"]
    for r in results.values():
        lines.append(f"{r['name']:56} {r['gpu_minutes']:9.0f} {r['p50_wait_s']:8.1f}s {r['p95_wait_s']:8.1f}s "
                     f"{r['max_wait_s']:8.0f}s {r['scale_changes']:8d}")
    return "\n".join(lines)


PLOTTED = {"always_on": "tab:grey", "keda_like": "tab:orange", "inferq_60s": "tab:green", "inferq_10s": "tab:blue"}


def plot(rows: list[tuple[str, dict[str, Any], Sim]], trace: Trace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 7), sharex=True)
    for key, result, sim in rows:
        if key not in PLOTTED:
            continue
        hours = [s[0] / 3600 for s in sim.series]
        color = PLOTTED[key]
        if key in ("keda_like", "inferq_10s"):
            top.plot(hours, [s[1] + s[2] for s in sim.series], label=result["name"], lw=0.8, color=color)
        bottom.step(hours, [s[3] for s in sim.series], where="post", label=result["name"], lw=0.9, color=color)
    for start, _ in trace.bursts:
        top.axvline(start / 3600, color="grey", lw=0.5, ls=":")
    top.set_ylabel("backlog (lag + pending)")
    top.set_yscale("symlog", linthresh=10)
    top.set_ylim(bottom=0)
    top.legend(fontsize=8)
    bottom.set_ylabel("workers (incl. booting)")
    bottom.set_xlabel("hour of the day")
    bottom.legend(fontsize=8)
    fig.suptitle("inferq elasticity: one seeded bursty day")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(report: dict, out_dir: Path, quick: bool = False, seed: int | None = None) -> dict[str, Any]:
    """Simulate, print the table, save ``elasticity.png`` (and ``elasticity.json``) in ``out_dir``, and put the
    figures under ``report["elasticity"]``."""
    sc = Scenario() if seed is None else Scenario(seed=seed)
    if quick:
        sc = sc.quick()
    trace, peak, rows = simulate(sc)
    results = {key: result for key, result, _ in rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "elasticity.png"
    plot(rows, trace, png)
    section = {
        "scenario": {**asdict(sc), "jobs": len(trace.arrivals), "burst_jobs_total": sum(c for _, c in trace.bursts),
                     "peak_fleet": peak},
        "results": results,
        "targets": {key: targets(results, key, keda) for key, keda in COMPARISONS.items()},
        "plot": str(png),
    }
    (out_dir / "elasticity.json").write_text(json.dumps(section, indent=2))
    report["elasticity"] = section
    print(render(section))
    return section


def render(section: dict[str, Any]) -> str:
    """The table and the verdicts, as printed by :func:`run`."""
    sc = section["scenario"]
    lines = [
        f"elasticity: {sc['jobs']} jobs ({sc['burst_jobs_total']} in {sc['bursts']} bursts) over "
        f"{sc['day_s'] / 3600:.0f} h, seed {sc['seed']}, boot {sc['boot_s']:.0f} s, window {sc['window']}, "
        f"peak fleet {sc['peak_fleet']}",
        table(section["results"]),
    ]
    for key, t in section["targets"].items():
        lines.append(
            f"{key}: {t['gpu_saving_vs_always_on']:.0%} fewer GPU-minutes than always-on, p95 "
            f"{t['p95_ratio_vs_always_on']:.2f}x always-on; vs {t['against']}: fewer GPU-minutes "
            f"{t['fewer_gpu_minutes_than_keda']}, p95 not worse {t['p95_not_worse_than_keda']}; "
            f"target {'met' if t['met'] else 'MISSED'}"
        )
    lines.append(f"plot: {section['plot']}")
    return "\n".join(lines)


def sweep(seeds: int, quick: bool = False) -> dict[str, int]:
    """Replay ``seeds`` other days (seeds 1..N): how many meet every target, per comparison."""
    met = dict.fromkeys(COMPARISONS, 0)
    for seed in range(1, seeds + 1):
        sc = Scenario(seed=seed)
        _, _, rows = simulate(sc.quick() if quick else sc)
        results = {key: result for key, result, _ in rows}
        for key, keda in COMPARISONS.items():
            met[key] += bool(targets(results, key, keda)["met"])
    print(f"targets met over {seeds} seeded days: " + ", ".join(f"{k} {n}/{seeds}" for k, n in met.items()))
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--seeds", type=int, default=0, help="also replay this many other seeded days")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    run(report, args.out, quick=args.quick, seed=args.seed)
    if args.seeds:
        report["elasticity"]["sweep"] = sweep(args.seeds, quick=args.quick)


if __name__ == "__main__":
    main()
