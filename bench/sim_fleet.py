"""The elasticity simulation's world (:mod:`bench.simulate`): the seeded day of jobs and the discrete-event
fleet that serves it, with boot time, windows, scale-in protection and the drain target. Strategies
(:mod:`bench.sim_strategies`) drive it through :class:`Controller`, defined here so that this module imports
nothing of theirs.

What the fleet copies from the real code (gpu_worker/fleet.py, gpu_worker/protection.py, the ECS service):
- a worker takes up to ``window`` jobs and pulls the oldest waiting job as soon as it has a free slot; idle
  workers are served in turn, as Redis serves blocked ``XREADGROUP`` clients;
- a worker beyond the scaler's drain target (``target``: the oldest ``target`` running workers pull, the newer
  ones do not) takes no new job, finishes what it holds and then holds no scale-in protection;
- ECS stops a surplus task only when it is unprotected (nothing in flight), tasks still starting first;
- a new worker costs GPU time from the moment it is asked for and serves after its boot: ``warm_boot_s`` for the
  first ``warm_pool`` workers started at once (instances from the Auto Scaling warm pool), ``boot_s`` beyond."""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any


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
    warm_pool: int = 0  # stopped instances kept ready (an Auto Scaling warm pool): they boot in warm_boot_s
    warm_boot_s: float = 120.0

    def quick(self) -> Scenario:
        """Six hours (08:00-14:00 squeezed into the clock) with three bursts: the same shapes, a quarter of the work."""
        return Scenario(**{**asdict(self), "day_s": 21600.0, "bursts": 3})


@dataclass
class Trace:
    arrivals: list[float]
    service: list[float]
    bursts: list[tuple[float, int]]
    max_tokens: list[int] | None = None
    """Each job's ``max_tokens``: its expected work, what the queue's ``backlog_tokens`` sums (bench.sim_work)."""
    out_tokens: list[int] | None = None
    """The tokens each job produced: with its service time, the throughput the workers measure."""


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


def _poisson(rng: random.Random, rate_at: Any, top: float, start: float, end: float) -> list[float]:
    """Arrivals of a Poisson process whose rate ``rate_at(t)`` never exceeds ``top``, by thinning."""
    times, t = [], start
    while True:
        t += rng.expovariate(top)
        if t >= end:
            return times
        if rng.random() < rate_at(t) / top:
            times.append(t)


def _services(rng: random.Random, sc: Scenario, n: int) -> list[float]:
    mu = math.log(sc.service_mean_s) - sc.service_sigma**2 / 2
    return [rng.lognormvariate(mu, sc.service_sigma) for _ in range(n)]


def business_hours_trace(sc: Scenario) -> Trace:
    """A working day: next to nothing at night, a ramp from 08:00, a lunch dip, a fall after 18:00; no batches."""
    rng = random.Random(sc.seed + 1)

    def rate(t: float) -> float:
        hour = 24.0 * t / sc.day_s
        if hour < 7.5 or hour > 19.0:
            return 0.0005
        shape = math.sin(math.pi * (hour - 7.5) / 11.5) ** 2
        lunch = 0.6 if 12.0 <= hour < 13.0 else 1.0
        return 0.0005 + 0.35 * shape * lunch

    times = _poisson(rng, rate, 0.36, 0.0, sc.day_s)
    return Trace(times, _services(rng, sc, len(times)), [])


def trickle_trace(sc: Scenario, every_s: float = 240.0) -> Trace:
    """A sparse trickle: one job every few minutes (Poisson, mean gap ``every_s``), all day."""
    rng = random.Random(sc.seed + 2)
    times = _poisson(rng, lambda _t: 1.0 / every_s, 1.0 / every_s, 0.0, sc.day_s)
    return Trace(times, _services(rng, sc, len(times)), [])


def spike_storm_trace(sc: Scenario, spikes: int = 40) -> Trace:
    """A spike storm: a trickle, and ``spikes`` short storms of 20-300 jobs within 5-30 s at random times."""
    rng = random.Random(sc.seed + 3)
    times = _poisson(rng, lambda _t: 0.01, 0.01, 0.0, sc.day_s)
    bursts = []
    for _ in range(spikes):
        start, count, spread = rng.uniform(0.0, sc.day_s * 0.95), rng.randint(20, 300), rng.uniform(5.0, 30.0)
        bursts.append((start, count))
        times.extend(start + rng.uniform(0.0, spread) for _ in range(count))
    times.sort()
    return Trace(times, _services(rng, sc, len(times)), sorted(bursts))


TRACES = {
    "bursty_day": make_trace,
    "business_hours": business_hours_trace,
    "trickle": trickle_trace,
    "spike_storm": spike_storm_trace,
}
"""Every trace the simulation reports: the seeded bursty day (the reference, unchanged) and three shapes beside it."""


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


class Controller:
    """What drives the fleet: told of the start, of each arrival and of its own ticks (``Sim.at(t, TICK, tag)``)."""

    name = "controller"

    def start(self, sim: Sim) -> None:
        pass

    def on_arrival(self, sim: Sim, now: float) -> None:
        pass

    def on_tick(self, sim: Sim, now: float, tag: Any) -> None:
        pass


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
    oldest_wait_s: float = 0.0
    enqueued: int = 0
    job_s: float | None = None  # the mean service time of the jobs done so far (the workers' run-time metric)
    backlog_tokens: int | None = None  # the unfinished jobs' max_tokens (None: the trace has no tokens)
    slot_tokens_per_s: float | None = None  # output tokens per service second of the jobs done so far


ARRIVE, DONE, READY, TICK = 0, 1, 2, 3


@dataclass
class Sim:
    """One strategy over one trace."""

    trace: Trace
    sc: Scenario
    desired: int = 0
    target: int | None = None  # the drain target: None, every worker pulls
    workers: list[Worker] = field(default_factory=list)
    waiting: deque[int] = field(default_factory=deque)
    waits: list[float] = field(default_factory=list)
    changes: int = 0
    events: list[tuple[float, int, int, Any]] = field(default_factory=list)
    seq: int = 0
    series: list[tuple[float, int, int, int, int]] = field(default_factory=list)  # t, lag, pending, alive, ready
    enqueued: int = 0
    served_s: float = 0.0
    served: int = 0
    backlog_tokens: int = 0
    produced: int = 0

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
            oldest_wait_s=now - self.trace.arrivals[self.waiting[0]] if self.waiting else 0.0,
            enqueued=self.enqueued,
            job_s=self.served_s / self.served if self.served else None,
            backlog_tokens=self.backlog_tokens if self.trace.max_tokens is not None else None,
            slot_tokens_per_s=self.produced / self.served_s if self.produced and self.served_s else None,
        )

    def fixed_fleet(self, size: int) -> None:
        """``size`` workers serving from the start, never stopped (the always-on fleet)."""
        self.workers = [Worker(asked_at=0.0, ready_at=0.0) for _ in range(size)]
        self.desired = size

    def set_target(self, target: int | None, now: float) -> None:
        """The drain target the scaler records: the oldest ``target`` live workers pull, the others drain."""
        self.target = target

    def set_desired(self, n: int, now: float) -> None:
        if n == self.desired:
            return
        self.changes += 1
        self.desired = n
        alive = self.alive()
        if len(alive) < n:
            for i in range(n - len(alive)):
                warm = len(alive) + i < self.sc.warm_pool
                w = Worker(asked_at=now, ready_at=now + (self.sc.warm_boot_s if warm else self.sc.boot_s))
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

    def pulling(self, now: float) -> list[Worker]:
        """The ready workers that take new jobs: all of them, or the oldest ``target`` of them (a booting task has
        no heartbeat yet, so the real workers rank only among the running ones)."""
        ready = [w for w in self.alive() if w.ready(now)]
        return ready if self.target is None else ready[: self.target]  # in start order: the newest drain first

    def dispatch(self, now: float) -> None:
        while self.waiting:
            free = [w for w in self.pulling(now) if w.in_flight < self.sc.window]
            if not free:
                return
            w = min(free, key=lambda w: w.last_served)
            job = self.waiting.popleft()
            self.waits.append(now - self.trace.arrivals[job])
            w.in_flight += 1
            w.last_served = now
            self.at(now + self.trace.service[job], DONE, (w, job))

    def run(self, controller: Controller) -> dict[str, Any]:
        for i, t in enumerate(self.trace.arrivals):
            self.at(t, ARRIVE, i)
        controller.start(self)
        next_sample = 0.0
        end = self.sc.day_s
        while self.events:
            t, kind, _, payload = heapq.heappop(self.events)
            if t > self.sc.day_s and not self.waiting and not self.busy():
                break  # the day is over and every job is done: ticks alone would run forever
            while next_sample <= t:
                o = self.observe(next_sample)
                alive = self.alive()
                self.series.append((next_sample, o.lag, o.pending, len(alive),
                                    sum(1 for w in alive if w.ready_at <= next_sample)))
                next_sample += 60.0
            self.handle(controller, t, kind, payload)
            self.dispatch(t)
            end = max(end, t)
        return self.result(end)

    def busy(self) -> bool:
        """Whether any worker still holds a job (the day may end only once none does)."""
        return any(w.in_flight for w in self.workers)

    def handle(self, controller: Controller, t: float, kind: int, payload: Any) -> None:
        """One event: an arrival, a job's end, a worker's boot ending, or a controller's tick."""
        if kind == ARRIVE:
            self.waiting.append(payload)
            self.enqueued += 1
            if self.trace.max_tokens is not None:
                self.backlog_tokens += self.trace.max_tokens[payload]
            controller.on_arrival(self, t)
        elif kind == DONE:
            worker, job = payload
            self.finish(worker, job, t)
        elif kind == TICK:
            controller.on_tick(self, t, payload)

    def finish(self, worker: Worker, job: int, t: float) -> None:
        worker.in_flight -= 1
        self.served += 1
        self.served_s += self.trace.service[job]
        if self.trace.max_tokens is not None and self.trace.out_tokens is not None:
            self.backlog_tokens -= self.trace.max_tokens[job]
            self.produced += self.trace.out_tokens[job]
        self._maybe_stop(worker, t)

    def worker_seconds(self, end: float) -> float:
        """GPU time: each worker from its request to its stop (or the end of the run)."""
        return sum((w.stopped_at if w.stopped_at is not None else end) - w.asked_at for w in self.workers)

    def result(self, end: float) -> dict[str, Any]:
        waits = sorted(self.waits)
        return {
            "gpu_minutes": self.worker_seconds(end) / 60.0,
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
