"""GPU dollars in the elasticity simulation: the rows ``python -m bench.simulate`` prints and the goals they are
held to (docs/benchmarks.md, "GPU dollars"), on the fleet and markets of :mod:`bench.sim_market`.

Rows in dollars per day: always-on on on-demand, inferq's default policy on on-demand, and inferq on the Spot mix
the stack deploys (no on-demand base, on-demand stand-ins after 180 s), at the Spot Instance Advisor's interruption
rates and a stress rate, with and without continuation, in Spot shortages with and without stand-ins and with a 1:1
strategy instead, and with an on-demand base; the same on a day of long generations; the default mix's share at
other Spot prices; and where inferq's GPU-minutes go, against the work floor.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from inferq.scaling.capacity import Fallback

from .sim_fleet import Scenario, Trace, peak_fleet
from .sim_market import SpotPolicy, breakdown, run_market
from .sim_strategies import InferqPolicy
from .sim_terms import (
    ADVISOR_MONTHLY,
    DRAIN_S,
    FALLBACK_AFTER_S,
    NOTICE_S,
    ON_DEMAND_PER_H,
    PRICE_SWEEP,
    SPOT_PER_H,
    STRESS_PER_H,
    Market,
    per_hour,
    price,
    shortage_windows,
)
from .sim_work import summarize_trace

FLOOR_GATHER_S = 300.0
"""The gathering the floor analysis tries: jobs at an empty fleet wait up to 5 minutes for company."""
LONG_FACTOR = 4.0
"""The long-generation day's jobs are this many times the two-model day's ``summarize`` jobs."""

def long_trace(sc: Scenario) -> Trace:
    """Long generations: the two-model day's ``summarize`` arrivals (a trickle and six batch bursts of 100-600
    jobs), each job four times as long (mean 180 s, ~4,500 tokens at 25 tokens/s): where an interruption finds
    jobs that cannot end within the notice."""
    trace = summarize_trace(sc)
    return replace(trace, service=[LONG_FACTOR * s for s in trace.service])


def spot_markets(sc: Scenario, spot_per_h: float = SPOT_PER_H) -> dict[str, tuple[str, Market]]:
    """The Spot rows: key -> (label, market). The first is the stack's defaults at the top GPU bucket's rate."""
    top = per_hour(ADVISOR_MONTHLY["15-20%"])
    low = per_hour(ADVISOR_MONTHLY["<5%"])
    base = Market(spot=True, fallback_after_s=FALLBACK_AFTER_S, interruptions_per_h=top, spot_per_h=spot_per_h)
    short = shortage_windows(sc)
    return {
        "spot": ("inferq, Spot mix (defaults), interruptions 20%/month", base),
        "spot_low": ("inferq, Spot mix, interruptions 5%/month", replace(base, interruptions_per_h=low)),
        "spot_stress": ("inferq, Spot mix, 1 interruption per instance-hour",
                        replace(base, interruptions_per_h=STRESS_PER_H)),
        "spot_stress_restart": ("  the same, no continuation (jobs start over)",
                                replace(base, interruptions_per_h=STRESS_PER_H, continuation=False)),
        "spot_stress_before": ("  the same, every job kept for the drain, then released to start over (before)",
                               replace(base, interruptions_per_h=STRESS_PER_H, continuation=False,
                                       hand_back="at_deadline")),
        "spot_shortage": ("inferq, Spot mix, 2 x 1 h Spot shortage, on-demand stand-ins after 180 s",
                          replace(base, shortages=short)),
        "spot_shortage_wait": ("  the same shortage, no stand-ins (Spot tasks wait)",
                               replace(base, shortages=short, fallback_after_s=0.0)),
        "spot_shortage_weights": ("  the same shortage, strategy Spot 1 : on-demand 1, no stand-ins",
                                  replace(base, shortages=short, fallback_after_s=0.0, on_demand_weight=1)),
        "spot_base1": ("inferq, Spot mix with an on-demand base of 1 task",
                       replace(base, on_demand_base=1)),
    }


def market_rows(trace: Any, sc: Scenario, policy: Any, peak: int, spot_per_h: float = SPOT_PER_H,
                keys: tuple[str, ...] | None = None) -> dict[str, dict[str, Any]]:
    """Always-on and inferq on on-demand, then every Spot row, each with its dollars."""
    from .sim_strategies import AlwaysOn

    rows: dict[str, dict[str, Any]] = {}
    on_demand = Market(spot_per_h=spot_per_h)
    result, _ = run_market(trace, sc, AlwaysOn(peak), on_demand)
    rows["always_on"] = {**result, "name": f"always-on, on-demand ({peak} workers)"}
    result, _ = run_market(trace, sc, InferqPolicy(policy, every_s=10.0), on_demand)
    rows["inferq"] = {**result, "name": "inferq (defaults), on-demand"}
    for key, (label, market) in spot_markets(sc, spot_per_h).items():
        if keys is not None and key not in keys:
            continue
        controller = SpotPolicy(policy, every_s=10.0, fallback=Fallback(market.fallback_after_s))
        result, _ = run_market(trace, sc, controller, market)
        rows[key] = {**result, "name": label}
    return rows


def goals(rows: dict[str, dict[str, Any]], floor_minutes: float) -> dict[str, Any]:
    """Issue 50's goals for the default Spot mix: at most 40% of inferq on-demand's dollars at a p95 wait no worse
    than always-on's, and GPU-minutes at most 3.0x the work floor (the moonshot 2.5x)."""
    spot, od, always = rows["spot"], rows["inferq"], rows["always_on"]
    share = spot["dollars"] / od["dollars"] if od["dollars"] else math.inf
    floor_ratio = spot["gpu_minutes"] / floor_minutes if floor_minutes else math.inf
    return {
        "dollars_vs_on_demand": round(share, 4),
        "p95_vs_always_on": round(spot["p95_wait_s"] / always["p95_wait_s"], 3) if always["p95_wait_s"] else math.inf,
        "gpu_minutes_vs_floor": round(floor_ratio, 3),
        "dollars_met": share <= 0.40 and spot["p95_wait_s"] <= always["p95_wait_s"],
        "floor_met": floor_ratio <= 3.0,
        "moonshot_met": floor_ratio <= 2.5,
    }


def work_floor_minutes(trace: Any, sc: Scenario) -> float:
    """The work itself: every job's service time over the window (each worker full all the time it runs)."""
    return sum(trace.service) / sc.window / 60.0


def dollars_table(rows: dict[str, dict[str, Any]]) -> str:
    od = rows["inferq"]["dollars"]
    lines = [f"{'fleet':80} {'$/day':>7} {'% inferq OD':>11} {'GPU-min':>8} {'OD %':>5} {'p95 wait':>9} "
             f"{'p95 end':>8} {'interr.':>7} {'thrown GPU-s':>12}"]
    for r in rows.values():
        lines.append(f"{r['name']:80} {r['dollars']:7.2f} {100 * r['dollars'] / od:10.1f}% {r['gpu_minutes']:8.0f} "
                     f"{100 * r['on_demand_share']:4.0f}% {r['p95_wait_s']:8.1f}s {r['p95_turnaround_s']:7.1f}s "
                     f"{r['interruptions']:7d} {r['thrown_gpu_s']:12.0f}")
    return "\n".join(lines)




LONG_KEYS = ("spot", "spot_stress", "spot_stress_restart", "spot_stress_before")
"""The long-generation rows: the default mix, and the stress rate with and without continuation."""


def dollars_section(sc: Scenario, trace: Trace, peak: int, policy: Any, spot_per_h: float = SPOT_PER_H,
                    long_policy: Any = None) -> dict[str, Any]:
    """The seeded day's dollar rows and the goals, the long-generation day's interruption rows, and the goal's
    share of inferq on-demand's dollars repriced at each Spot price of :data:`PRICE_SWEEP`."""
    rows = market_rows(trace, sc, policy, peak, spot_per_h)
    floor = work_floor_minutes(trace, sc)
    _, on_demand = run_market(trace, sc, InferqPolicy(policy, every_s=10.0), Market())
    gathered, _ = run_market(trace, sc, InferqPolicy(replace(policy, gather_s=FLOOR_GATHER_S), every_s=10.0),
                             Market())
    long = long_trace(sc)
    long_peak = peak_fleet(long, sc)
    long_rows = market_rows(long, sc, long_policy(long_peak) if long_policy else policy, long_peak, spot_per_h,
                            keys=LONG_KEYS)
    od = rows["inferq"]["dollars"]
    sweep = {f"{p:.2f}": round(price(rows["spot"]["spot_hours"], rows["spot"]["on_demand_hours"], p) / od, 4)
             for p in PRICE_SWEEP}
    return {
        "prices": {"on_demand_per_h": ON_DEMAND_PER_H, "spot_per_h": spot_per_h, "fallback_after_s": FALLBACK_AFTER_S,
                   "drain_s": DRAIN_S, "notice_s": NOTICE_S},
        "work_floor_minutes": floor,
        "rows": rows,
        "goals": goals(rows, floor),
        "floor": {"breakdown": breakdown(on_demand, sc.day_s),
                  "gather": {k: gathered[k] for k in ("gpu_minutes", "p50_wait_s", "p95_wait_s")}},
        "spot_share_at_price": sweep,
        "long": {"jobs": len(long.arrivals), "peak_fleet": long_peak,
                 "work_floor_minutes": work_floor_minutes(long, sc), "rows": long_rows},
    }


def render_dollars(section: dict[str, Any]) -> str:
    p, g, gather = section["prices"], section["goals"], section["floor"]["gather"]
    lines = [
        f"GPU dollars (on-demand ${p['on_demand_per_h']:.3f}/h, Spot ${p['spot_per_h']:.3f}/h per GPU-hour; "
        f"work floor {section['work_floor_minutes']:.0f} GPU-min):",
        dollars_table(section["rows"]),
        f"Spot mix: {g['dollars_vs_on_demand']:.1%} of inferq on-demand's dollars (goal <= 40%), p95 "
        f"{g['p95_vs_always_on']:.2f}x always-on's: {'met' if g['dollars_met'] else 'MISSED'}; "
        f"GPU-minutes {g['gpu_minutes_vs_floor']:.2f}x the work floor (goal <= 3.0x: "
        f"{'met' if g['floor_met'] else 'MISSED'}; moonshot 2.5x: {'met' if g['moonshot_met'] else 'missed'})",
        "where inferq's GPU-minutes go: " + ", ".join(
            f"{k.replace('_', ' ')} {v:.0f}" for k, v in section["floor"]["breakdown"].items())
        + f"; gathering {FLOOR_GATHER_S:.0f} s (INFERQ_SCALE_GATHER_S): {gather['gpu_minutes']:.0f} GPU-min, "
        f"p50 {gather['p50_wait_s']:.1f}s, p95 {gather['p95_wait_s']:.1f}s",
        "Spot mix's share of inferq on-demand's dollars at other Spot prices: "
        + ", ".join(f"${k}/h {v:.1%}" for k, v in section["spot_share_at_price"].items()),
        f"long generations ({section['long']['jobs']} jobs, mean {LONG_FACTOR * 45:.0f} s; work floor "
        f"{section['long']['work_floor_minutes']:.0f} GPU-min):",
        dollars_table(section["long"]["rows"]),
    ]
    return "\n".join(lines)


def goals_for_seed(sc: Scenario, trace: Trace, peak: int, policy: Any) -> dict[str, Any]:
    """The goals on another seeded day (the rows they need only)."""
    rows = market_rows(trace, sc, policy, peak, keys=("spot",))
    return goals(rows, work_floor_minutes(trace, sc))
