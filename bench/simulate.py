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
import heapq
import json
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from inferq.policy import Demand, ScalePolicy, ScaleState, decide


@dataclass(frozen=True)
class Scenario:
    seed: int = 20240601
    day_s: float = 86400.0
    base_night_per_s: float = 0.004  # about one job every four minutes at 04:00
    base_day_per_s: float = 0.12  # about seven jobs a minute at 16:00
    bursts: int = 8  # batch submissions between 08:00 and 20:00
    burst_jobs: tuple[int, int] = (200, 1200)
    burst_spread_s: tuple[float, float] = (30.0, 300.0)
    service_mean_s: float = 20.0  # one job's generation time, lognormal
    service_sigma: float = 0.6
    window: int = 8  # jobs one worker runs at once (INFERQ_WINDOW)
    boot_s: float = 120.0  # GPU instance + container + model load

    def quick(self) -> Scenario:
        """Six hours (08:00-14:00 squeezed into the clock) with three bursts: the same shapes, a quarter of the work."""
        return Scenario(**{**asdict(self), "day_s": 21600.0, "bursts": 3})


@dataclass
class Trace:
    arrivals: list[float]
    service: list[float]
    bursts: list[tuple[float, int]]


def make_trace(sc: Scenario) -> Trace:
    rng = random.Random(sc.seed)
    times: list[float] = []
    # Poisson base by thinning: the rate peaks at 16:00 and bottoms out at 04:00 (the quick day keeps the shape)
    top = max(sc.base_day_per_s, sc.base_night_per_s)
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= sc.day_s:
            break
        phase = 2 * math.pi * (t / sc.day_s - 16 / 24)
        rate = sc.base_night_per_s + (sc.base_day_per_s - sc.base_night_per_s) * (0.5 + 0.5 * math.cos(phase))
        if rng.random() < rate / top:
            times.append(t)
    bursts: list[tuple[float, int]] = []
    for _ in range(sc.bursts):
        start = rng.uniform(sc.day_s * 8 / 24, sc.day_s * 20 / 24)
        count = rng.randint(*sc.burst_jobs)
        spread = rng.uniform(*sc.burst_spread_s)
        bursts.append((start, count))
        times.extend(start + rng.uniform(0.0, spread) for _ in range(count))
    times.sort()
    mu = math.log(sc.service_mean_s) - sc.service_sigma**2 / 2
    service = [rng.lognormvariate(mu, sc.service_sigma) for _ in times]
    return Trace(times, service, sorted(bursts))


def peak_fleet(trace: Trace, sc: Scenario, span_s: float = 600.0) -> int:
    """Workers whose throughput serves the busiest ``span_s`` of the day: capacity planning for the peak."""
    arrivals, best, lo = trace.arrivals, 0, 0
    for hi in range(len(arrivals)):
        while arrivals[hi] - arrivals[lo] > span_s:
            lo += 1
        best = max(best, hi - lo + 1)
    mean_service = sum(trace.service) / len(trace.service)
    return max(1, math.ceil(best * mean_service / (span_s * sc.window)))


# ---------------------------------------------------------------------------------------------- the fleet


@dataclass
class Worker:
    asked_at: float
    ready_at: float
    in_flight: int = 0
    stopped_at: float | None = None
    last_served: float = -math.inf

    def ready(self, now: float) -> bool:
        return self.stopped_at is None and self.ready_at <= now


@dataclass
class Observed:
    lag: int
    pending: int
    busy_workers: int
    desired: int


ARRIVE, DONE, READY, TICK = 0, 1, 2, 3


@dataclass
class Sim:
    """One strategy over one trace."""

    trace: Trace
    sc: Scenario
    desired: int = 0
    workers: list[Worker] = field(default_factory=list)
    waiting: deque[int] = field(default_factory=deque)
    waits: list[float] = field(default_factory=list)
    changes: int = 0
    events: list[tuple[float, int, int, Any]] = field(default_factory=list)
    seq: int = 0
    series: list[tuple[float, int, int, int, int]] = field(default_factory=list)  # t, lag, pending, alive, ready

    def at(self, t: float, kind: int, payload: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, payload))

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.stopped_at is None]

    def observe(self, now: float) -> Observed:
        ready = [w for w in self.workers if w.ready(now)]
        return Observed(
            lag=len(self.waiting),
            pending=sum(w.in_flight for w in ready),
            busy_workers=sum(1 for w in ready if w.in_flight > 0),
            desired=self.desired,
        )

    def set_desired(self, n: int, now: float) -> None:
        if n == self.desired:
            return
        self.changes += 1
        self.desired = n
        alive = self.alive()
        if len(alive) < n:
            for _ in range(n - len(alive)):
                w = Worker(asked_at=now, ready_at=now + self.sc.boot_s)
                self.workers.append(w)
                self.at(w.ready_at, READY, w)
            return
        surplus = len(alive) - n
        # ECS stops tasks still starting first, then running ones without scale-in protection (nothing in flight);
        # a protected task stops when its last job ends (see _maybe_stop)
        for w in sorted(alive, key=lambda w: (w.ready_at <= now, w.in_flight, -w.asked_at)):
            if surplus == 0:
                break
            if w.ready_at > now or w.in_flight == 0:
                w.stopped_at = now
                surplus -= 1

    def _maybe_stop(self, w: Worker, now: float) -> None:
        if w.in_flight == 0 and len(self.alive()) > self.desired:
            w.stopped_at = now

    def dispatch(self, now: float) -> None:
        while self.waiting:
            free = [w for w in self.workers if w.ready(now) and w.in_flight < self.sc.window]
            if not free:
                return
            w = min(free, key=lambda w: w.last_served)
            job = self.waiting.popleft()
            self.waits.append(now - self.trace.arrivals[job])
            w.in_flight += 1
            w.last_served = now
            self.at(now + self.trace.service[job], DONE, w)

    def run(self, controller: Controller) -> dict[str, Any]:
        for i, t in enumerate(self.trace.arrivals):
            self.at(t, ARRIVE, i)
        controller.start(self)
        next_sample = 0.0
        end = self.sc.day_s
        while self.events:
            t, kind, _, payload = heapq.heappop(self.events)
            if t > self.sc.day_s and not self.waiting and not any(w.in_flight for w in self.workers):
                break  # the day is over and every job is done: ticks alone would run forever
            while next_sample <= t:
                o = self.observe(next_sample)
                alive = self.alive()
                self.series.append((next_sample, o.lag, o.pending, len(alive),
                                    sum(1 for w in alive if w.ready_at <= next_sample)))
                next_sample += 60.0
            if kind == ARRIVE:
                self.waiting.append(payload)
                controller.on_arrival(self, t)
            elif kind == DONE:
                payload.in_flight -= 1
                self._maybe_stop(payload, t)
            elif kind == TICK:
                controller.on_tick(self, t, payload)
            self.dispatch(t)
            end = max(end, t)
        gpu_s = sum((w.stopped_at if w.stopped_at is not None else end) - w.asked_at for w in self.workers)
        waits = sorted(self.waits)
        return {
            "gpu_minutes": gpu_s / 60.0,
            "p50_wait_s": percentile(waits, 50),
            "p95_wait_s": percentile(waits, 95),
            "max_wait_s": waits[-1] if waits else 0.0,
            "scale_changes": self.changes,
            "jobs": len(waits),
        }


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


# ---------------------------------------------------------------------------------------------- strategies


class Controller:
    name = "controller"

    def start(self, sim: Sim) -> None:
        pass

    def on_arrival(self, sim: Sim, now: float) -> None:
        pass

    def on_tick(self, sim: Sim, now: float, tag: Any) -> None:
        pass


class AlwaysOn(Controller):
    def __init__(self, size: int) -> None:
        self.size = size
        self.name = f"always-on ({size} workers)"

    def start(self, sim: Sim) -> None:
        sim.workers = [Worker(asked_at=0.0, ready_at=0.0) for _ in range(self.size)]
        sim.desired = self.size


class InferqPolicy(Controller):
    """The real ``decide`` on a fixed cadence, plus the gateway's wake-up call (rate-limited) at zero."""

    def __init__(self, policy: ScalePolicy, every_s: float, wake: bool = True, wake_gap_s: float = 10.0,
                 wake_latency_s: float = 1.0) -> None:
        self.policy, self.every_s, self.wake = policy, every_s, wake
        self.wake_gap_s, self.wake_latency_s = wake_gap_s, wake_latency_s
        self.state = ScaleState()
        self.last_wake = -math.inf
        self.name = f"inferq policy, every {every_s:.0f} s" + (" + wake" if wake else "")

    def start(self, sim: Sim) -> None:
        sim.at(0.0, TICK, "schedule")

    def on_arrival(self, sim: Sim, now: float) -> None:
        if self.wake and sim.desired == 0 and now - self.last_wake >= self.wake_gap_s:
            self.last_wake = now
            sim.at(now + self.wake_latency_s, TICK, "wake")

    def on_tick(self, sim: Sim, now: float, tag: Any) -> None:
        o = sim.observe(now)
        demand = Demand(lag=o.lag, pending=o.pending, busy_workers=o.busy_workers)
        decision = decide(self.policy, demand, self.state.adopt(sim.desired, now), now)
        self.state = decision.state
        sim.set_desired(decision.desired, now)
        if tag == "schedule":
            sim.at(now + self.every_s, TICK, "schedule")


class KedaLike(Controller):
    def __init__(self, max_replicas: int, threshold: float = 5.0, polling_s: float = 30.0, sync_s: float = 15.0,
                 cooldown_s: float = 300.0, stabilization_s: float = 300.0, tolerance: float = 0.1) -> None:
        self.max, self.threshold, self.polling_s, self.sync_s = max_replicas, threshold, polling_s, sync_s
        self.cooldown_s, self.stabilization_s, self.tolerance = cooldown_s, stabilization_s, tolerance
        self.last_active = -math.inf
        self.recommendations: deque[tuple[float, int]] = deque()
        self.name = f"KEDA-like (threshold {threshold:g}, cooldown {cooldown_s:.0f} s)"

    def start(self, sim: Sim) -> None:
        sim.at(0.0, TICK, "poll")
        sim.at(0.0, TICK, "hpa")

    def on_tick(self, sim: Sim, now: float, tag: Any) -> None:
        o = sim.observe(now)
        backlog = o.lag + o.pending
        current = sim.desired
        if tag == "poll":
            sim.at(now + self.polling_s, TICK, "poll")
            if backlog > 0:  # activation: metric > activationThreshold (0)
                self.last_active = now
                if current == 0:
                    sim.set_desired(1, now)  # KEDA itself only takes 0 -> 1; the HPA does the rest
            elif current > 0 and now - self.last_active >= self.cooldown_s:
                self.recommendations.clear()
                sim.set_desired(0, now)
            return
        sim.at(now + self.sync_s, TICK, "hpa")
        if current == 0:
            return  # the HPA is idle while KEDA holds the deployment at zero
        ratio = backlog / (self.threshold * current)
        recommended = current if abs(ratio - 1.0) <= self.tolerance else math.ceil(backlog / self.threshold)
        recommended = min(max(recommended, 1), self.max)
        self.recommendations.append((now, recommended))
        while self.recommendations and self.recommendations[0][0] < now - self.stabilization_s:
            self.recommendations.popleft()
        if recommended > current:
            new = min(recommended, max(2 * current, current + 4))  # default scale-up policies, per 15 s
        else:
            new = max(r for _, r in self.recommendations)  # scale-down stabilisation: the window's highest
            new = min(new, current)
        sim.set_desired(new, now)


# ---------------------------------------------------------------------------------------------- report


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
