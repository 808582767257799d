"""Work in the elasticity simulation (:mod:`bench.simulate`): each job's tokens, the policy sized by work beside
the one sized by job counts, and a day of two models, each with its own queue and fleet.

- **Tokens.** A trace's service times stay as they are (the seeded day is kept exactly); each job's output
  tokens follow from its service time at :data:`SLOT_TOKENS_PER_S` (one sequence's decode rate at a window of 8),
  and its ``max_tokens`` (what the client asked for, what ``backlog_tokens`` sums) is the next of
  :data:`MAX_TOKENS` above its output times 1 to 2: clients ask for more than they get. Drawn from a generator of
  their own, so the arrivals and service times are those of the trace.
- **Sized by work**: ``inferq.scaling.policy.decide`` with ``tokens_per_s`` set (``INFERQ_SCALE_TOKENS_PER_S``), fed the
  fleet's ``backlog_tokens`` and its measured throughput (output tokens per service second so far).
- **Two models**: ``chat`` (short answers through business hours) and ``summarize`` (long answers, a trickle and
  batch bursts), each a queue with its own fleet, peak and policy, as a model registry deploys them; one row per
  model and strategy, and the two fleets together.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .sim_fleet import Controller, Scenario, Sim, Trace, _poisson, _services, peak_fleet, percentile

SLOT_TOKENS_PER_S = 25.0
"""Output tokens per second of one job slot: a worker of 8 slots makes 200 tokens/s."""
MAX_TOKENS = (64, 128, 256, 512, 1024, 2048, 4096)
WORK_TOKENS_PER_S = 200.0
"""INFERQ_SCALE_TOKENS_PER_S of the work-sized rows: one worker's throughput before any measurement (what the
workers then measure here too)."""


def with_tokens(trace: Trace, seed: int) -> Trace:
    """The same trace with each job's output tokens and ``max_tokens`` (module docstring)."""
    rng = random.Random(seed + 100)
    out = [max(1, round(s * SLOT_TOKENS_PER_S)) for s in trace.service]
    asked = []
    for tokens in out:
        want = tokens * rng.uniform(1.0, 2.0)
        asked.append(next((m for m in MAX_TOKENS if m >= want), max(tokens, MAX_TOKENS[-1])))
    return replace(trace, max_tokens=asked, out_tokens=out)


def chat_trace(sc: Scenario) -> Trace:
    """Short answers (mean 6 s, ~150 tokens) through business hours: a ramp from 08:00, a fall after 18:00."""
    rng = random.Random(sc.seed + 10)

    def rate(t: float) -> float:
        hour = 24.0 * t / sc.day_s
        return 0.002 if hour < 8.0 or hour > 19.0 else 0.002 + 0.3 * math.sin(math.pi * (hour - 8.0) / 11.0) ** 2

    times = _poisson(rng, rate, 0.31, 0.0, sc.day_s)
    return with_tokens(Trace(times, _services(rng, replace(sc, service_mean_s=6.0, service_sigma=0.5),
                                              len(times)), []), sc.seed + 10)


def summarize_trace(sc: Scenario) -> Trace:
    """Long answers (mean 45 s, ~1,100 tokens): a trickle all day and six batch bursts of 100-600 jobs."""
    rng = random.Random(sc.seed + 11)
    times = _poisson(rng, lambda _t: 0.004, 0.004, 0.0, sc.day_s)
    bursts = []
    for _ in range(6):
        start, count, spread = rng.uniform(0.0, sc.day_s * 0.9), rng.randint(100, 600), rng.uniform(30.0, 300.0)
        bursts.append((start, count))
        times.extend(start + rng.uniform(0.0, spread) for _ in range(count))
    times.sort()
    services = _services(rng, replace(sc, service_mean_s=45.0, service_sigma=0.6), len(times))
    return with_tokens(Trace(times, services, sorted(bursts)), sc.seed + 11)


MODELS: dict[str, Callable[[Scenario], Trace]] = {"chat": chat_trace, "summarize": summarize_trace}

Strategies = Callable[[Scenario, int, int], list[tuple[str, Callable[[], Controller]]]]


def two_models(sc: Scenario, strategies: Strategies) -> dict[str, Any]:
    """Each model's trace against ``strategies(sc, peak, ceiling)`` on a fleet of its own; then, per strategy, the
    two fleets together: GPU-minutes summed, waits pooled."""
    models: dict[str, Any] = {}
    pooled: dict[str, dict[str, Any]] = {}
    for model, make in MODELS.items():
        trace = make(sc)
        peak = peak_fleet(trace, sc)
        results = {}
        for key, controller in strategies(sc, peak, 2 * peak):
            sim = Sim(trace, sc)
            result = sim.run(controller())
            results[key] = result
            total = pooled.setdefault(key, {"gpu_minutes": 0.0, "waits": [], "jobs": 0})
            total["gpu_minutes"] += result["gpu_minutes"]
            total["waits"] += sim.waits
            total["jobs"] += result["jobs"]
        models[model] = {"jobs": len(trace.arrivals), "peak_fleet": peak, "results": results,
                         "tokens": sum(trace.out_tokens or [])}
    both = {}
    for key, total in pooled.items():
        waits = sorted(total.pop("waits"))
        both[key] = {**total, "p50_wait_s": percentile(waits, 50), "p95_wait_s": percentile(waits, 95)}
    return {"models": models, "both": both}


LABELS = {"always_on": "always-on", "keda_like": "KEDA-like", "inferq_10s": "inferq (defaults: job counts)",
          "inferq_10s_work": "inferq, sized by work"}


def two_models_table(section: dict[str, Any]) -> str:
    lines = [f"{'model':10} {'jobs':>6} {'strategy':32} {'GPU-min':>8} {'% on':>6} {'p50 wait':>9} {'p95 wait':>9}"]
    rows = [(m, s["jobs"], s["results"]) for m, s in section["models"].items()]
    rows.append(("both", sum(s["jobs"] for s in section["models"].values()), section["both"]))
    for model, jobs, results in rows:
        always = results["always_on"]["gpu_minutes"]
        for key, r in results.items():
            lines.append(f"{model:10} {jobs:6d} {LABELS.get(key, key):32} {r['gpu_minutes']:8.0f} "
                         f"{100.0 * r['gpu_minutes'] / always:5.1f}% {r['p50_wait_s']:8.1f}s {r['p95_wait_s']:8.1f}s")
    return "\n".join(lines)
