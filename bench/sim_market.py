"""The fleet on a market (:mod:`bench.sim_spot` reports it): on-demand and Spot prices, Spot interruptions and
shortages, on-demand stand-ins, and what an interruption throws away with and without continuation.

The fleet of :class:`bench.sim_fleet.Sim` on the market of :mod:`bench.sim_terms`, with what Spot adds
(infra/gpu.yaml, ``inferq.scaling.capacity``):

- **Two services.** The *primary* service's tasks run on Spot, its first ``on_demand_base`` on on-demand (its
  capacity provider strategy's base; ``on_demand_weight`` > 0 splits the rest between the providers by weight, the
  other way ECS offers to hedge). The scaling policy's count is asked of it. The *fallback* service runs on on-demand
  alone; the scaler sizes it with :func:`inferq.scaling.capacity.stand_ins` when Spot tasks have waited
  ``fallback_after_s`` for an instance.
- **Prices.** A worker costs its instance's price from the launch to its stop: on-demand
  :data:`~bench.sim_terms.ON_DEMAND_PER_H`, Spot :data:`~bench.sim_terms.SPOT_PER_H` per GPU-hour. A Spot task that
  waits for capacity has no instance yet and costs nothing.
- **Shortages.** Windows of the day when no Spot pool has capacity: a Spot task asked for then waits for an instance
  (``PROVISIONING``) until the window ends or the scaler gives it an on-demand stand-in.
- **Interruptions.** Each Spot instance is interrupted at a rate per instance-hour (exponential: the Spot Instance
  Advisor's monthly buckets converted by :func:`bench.sim_terms.per_hour`, or the stress rate of one per
  instance-hour). ECS drains the instance and SIGTERMs the task (``ECS_ENABLE_SPOT_INSTANCE_DRAINING``); the service
  starts a replacement at once (``MaximumPercent`` 200) on a new instance, which boots. The instance is reclaimed,
  and billed until then, :data:`~bench.sim_terms.NOTICE_S` after the notice. The worker takes no new job; a job that
  will end within ``drain_s`` (``INFERQ_DRAIN_S``) finishes there, the others are handed back at once, without
  spending an attempt, to the tail of the queue. With **continuation** (the job's output so far is kept) the next
  attempt runs only the rest, plus :data:`~bench.sim_terms.CONTINUE_OVERHEAD_S` to read the prompt and the kept text
  again; without, it starts over, and the time the interrupted attempt ran is thrown away.
  ``hand_back="at_deadline"`` is the worker as it was before (every job kept until ``drain_s``, then released to
  start over).

Queue wait is still arrival to the first attempt's start; the turnaround (arrival to the job's end) is what an
interruption adds to. GPU-seconds thrown away are the interrupted attempts' run time over the window (one job's share
of its worker, as the work floor counts it).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from inferq.scaling.capacity import Fallback, stand_ins

from .sim_fleet import DONE, READY, Controller, Scenario, Sim, Worker, percentile
from .sim_strategies import InferqPolicy
from .sim_terms import CONTINUE_OVERHEAD_S, Market, price


@dataclass
class Instance(Worker):
    """A worker with the capacity under it."""

    market: str = "od"
    service: str = "primary"
    billed_from: float | None = None  # None while a Spot task waits for an instance
    draining: bool = False
    reclaimed_at: float | None = None
    jobs: dict[int, tuple[float, float, int]] = field(default_factory=dict)  # job -> (start, end, attempt token)


INTERRUPT, CAPACITY, RECLAIM, DEADLINE = 10, 11, 12, 13


@dataclass
class MarketSim(Sim):
    market: Market = field(default_factory=Market)
    fallback_desired: int = 0
    tokens: int = 0
    remaining: dict[int, float] = field(default_factory=dict)  # job -> service left after an interruption
    started: set[int] = field(default_factory=set)
    turnaround: list[float] = field(default_factory=list)
    interruptions: int = 0
    handed_back: int = 0
    continued: int = 0
    thrown_s: float = 0.0  # run time of interrupted attempts that started over
    runs: list[tuple[Instance, float, float]] = field(default_factory=list)  # (worker, start, planned end)
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.sc.seed + 700 + self.market.seed)
        for _, end in self.market.shortages:
            self.at(end, CAPACITY)

    # --- capacity ---

    def alive(self) -> list[Worker]:
        return [w for w in self.workers if w.stopped_at is None and not getattr(w, "draining", False)]

    def _service(self, name: str) -> list[Instance]:
        return [w for w in self.alive() if isinstance(w, Instance) and w.service == name]

    def short(self, now: float) -> bool:
        return any(start <= now < end for start, end in self.market.shortages)

    def _market_for(self, service: str) -> str:
        m = self.market
        if service == "fallback" or not m.spot:
            return "od"
        primary = self._service("primary")
        on_demand = sum(1 for w in primary if w.market == "od")
        if on_demand < m.on_demand_base:
            return "od"
        if m.on_demand_weight > 0:
            spot = len(primary) - on_demand
            extra = on_demand - m.on_demand_base
            return "od" if extra * 1 < spot * m.on_demand_weight else "spot"  # Spot's weight is 1
        return "spot"

    def _start(self, service: str, now: float) -> Instance:
        market = self._market_for(service)
        w = Instance(asked_at=now, ready_at=math.inf, market=market, service=service)
        self.workers.append(w)
        if market == "spot" and self.short(now):
            return w  # PROVISIONING: no instance, no bill, until the shortage ends (CAPACITY) or it is stopped
        self._launch(w, now)
        return w

    def _launch(self, w: Instance, now: float) -> None:
        w.billed_from = now
        w.ready_at = now + self.sc.boot_s
        self.at(w.ready_at, READY, w)
        if w.market == "spot" and self.market.interruptions_per_h > 0:
            self.at(now + self.rng.expovariate(self.market.interruptions_per_h) * 3600.0, INTERRUPT, w)

    def _resize(self, service: str, n: int, now: float) -> None:
        alive = self._service(service)
        if len(alive) < n:
            for _ in range(n - len(alive)):
                self._start(service, now)
            return
        surplus = len(alive) - n
        # ECS stops tasks still starting first (no instance yet before booting), then running ones without
        # scale-in protection (nothing in flight); a protected task stops when its last job ends (_maybe_stop)
        for w in sorted(alive, key=lambda w: (w.billed_from is not None, w.ready_at <= now, w.in_flight, -w.asked_at)):
            if surplus == 0:
                break
            if w.ready_at > now or w.in_flight == 0:
                w.stopped_at = now
                surplus -= 1

    def set_desired(self, n: int, now: float) -> None:
        if n == self.desired:
            return
        self.changes += 1
        self.desired = n
        self._resize("primary", n, now)

    def set_fallback(self, n: int, now: float) -> None:
        if n != self.fallback_desired:
            self.fallback_desired = n
            self._resize("fallback", n, now)

    def fixed_fleet(self, size: int) -> None:
        self.workers = [Instance(asked_at=0.0, ready_at=0.0, billed_from=0.0) for _ in range(size)]
        self.desired = size

    def waiting_for_capacity(self, now: float) -> list[float]:
        """How long each primary task has waited for an instance (ECS's ``PROVISIONING`` tasks)."""
        return [now - w.asked_at for w in self._service("primary") if w.billed_from is None]

    def running(self, service: str, now: float) -> int:
        return sum(1 for w in self._service(service) if w.ready(now))

    def _maybe_stop(self, w: Worker, now: float) -> None:
        if not isinstance(w, Instance) or w.in_flight or w.draining:
            return
        wanted = self.desired if w.service == "primary" else self.fallback_desired
        if len(self._service(w.service)) > wanted:
            w.stopped_at = now

    # --- jobs ---

    def dispatch(self, now: float) -> None:
        while self.waiting:
            free = [w for w in self.pulling(now) if w.in_flight < self.sc.window]
            if not free:
                return
            w = min(free, key=lambda w: w.last_served)
            assert isinstance(w, Instance)
            job = self.waiting.popleft()
            if job not in self.started:
                self.started.add(job)
                self.waits.append(now - self.trace.arrivals[job])
            w.in_flight += 1
            w.last_served = now
            self.tokens += 1
            end = now + self.remaining.get(job, self.trace.service[job])
            w.jobs[job] = (now, end, self.tokens)
            self.runs.append((w, now, end))
            self.at(end, DONE, (w, job, self.tokens))

    def handle(self, controller: Controller, t: float, kind: int, payload: Any) -> None:
        if kind == DONE:  # current attempts only (a handed-back attempt's end is stale)
            w, job, token = payload
            if w.jobs.get(job, (0.0, 0.0, -1))[2] != token:
                return
            del w.jobs[job]
            self.remaining.pop(job, None)
            self.turnaround.append(t - self.trace.arrivals[job])
            self.finish(w, job, t)
        elif kind == CAPACITY:
            for w in self.workers:
                if isinstance(w, Instance) and w.billed_from is None and w.stopped_at is None and not self.short(t):
                    self._launch(w, t)
        elif kind == INTERRUPT:
            if payload.stopped_at is None and not payload.draining:
                self._interrupt(payload, t)
        elif kind == DEADLINE:
            for job in list(payload.jobs):
                self._hand_back(payload, job, t)
        elif kind == RECLAIM:
            for job in list(payload.jobs):  # nothing should be left: the deadline came first
                self._hand_back(payload, job, t)
            payload.stopped_at = t
        else:
            super().handle(controller, t, kind, payload)

    def _interrupt(self, w: Instance, t: float) -> None:
        """The two-minute notice: ECS drains the instance, the worker hands back what will not end in time, the
        service starts a replacement at once, and EC2 reclaims the instance at the end of the notice."""
        self.interruptions += 1
        w.draining = True
        w.reclaimed_at = t + self.market.notice_s
        self.at(w.reclaimed_at, RECLAIM, w)
        if self.market.hand_back == "at_deadline":
            self.at(t + self.market.drain_s, DEADLINE, w)
        else:
            for job, (_start, end, _token) in list(w.jobs.items()):
                if end - t > self.market.drain_s:
                    self._hand_back(w, job, t)
        wanted = self.desired if w.service == "primary" else self.fallback_desired
        if len(self._service(w.service)) < wanted:
            self._start(w.service, t)

    def _hand_back(self, w: Instance, job: int, t: float) -> None:
        start, end, _token = w.jobs.pop(job)
        w.in_flight -= 1
        self.handed_back += 1
        if self.market.continuation:
            self.continued += 1
            self.remaining[job] = (end - t) + CONTINUE_OVERHEAD_S
        else:
            self.thrown_s += t - start
            self.remaining.pop(job, None)
        self.waiting.append(job)  # a released entry is added again at the tail of its stream

    # --- figures ---

    def worker_seconds(self, end: float) -> float:
        return sum(self._billed(w, end) for w in self.workers)

    def _billed(self, w: Worker, end: float) -> float:
        start = w.billed_from if isinstance(w, Instance) else w.asked_at
        if start is None:
            return 0.0
        stop = w.reclaimed_at if isinstance(w, Instance) and w.reclaimed_at is not None else w.stopped_at
        return (stop if stop is not None else end) - start

    def result(self, end: float) -> dict[str, Any]:
        out = super().result(end)
        spot_s = on_demand_s = 0.0
        for w in self.workers:
            if isinstance(w, Instance) and w.market == "spot":
                spot_s += self._billed(w, end)
            else:
                on_demand_s += self._billed(w, end)
        turnaround = sorted(self.turnaround)
        out.update({
            "spot_hours": spot_s / 3600.0,
            "on_demand_hours": on_demand_s / 3600.0,
            "dollars": price(spot_s / 3600.0, on_demand_s / 3600.0, self.market.spot_per_h,
                             self.market.on_demand_per_h),
            "on_demand_share": on_demand_s / (spot_s + on_demand_s) if spot_s + on_demand_s else 0.0,
            "p95_turnaround_s": percentile(turnaround, 95),
            "interruptions": self.interruptions,
            "handed_back": self.handed_back,
            "continued": self.continued,
            "thrown_gpu_s": self.thrown_s / self.sc.window,
        })
        return out


def breakdown(sim: MarketSim, end: float) -> dict[str, float]:
    """Where a fleet's GPU-minutes go: ``boot`` (launch to ready), ``alone`` (the minutes when one worker was
    ready) and ``several`` (when more were), each of the last two with ``_work`` (its slots' busy time over the
    window: its share of the work floor). Interrupted attempts are counted as planned (use it without them)."""
    points: list[tuple[float, int, int]] = []  # (time, +1/-1 ready workers, +1/-1 busy slots)
    boot = 0.0
    for w in sim.workers:
        start = w.billed_from if isinstance(w, Instance) else w.asked_at
        if start is None:
            continue
        stop = w.stopped_at if w.stopped_at is not None else end
        boot += max(min(stop, w.ready_at) - start, 0.0)
        if w.ready_at < stop:
            points += [(w.ready_at, 1, 0), (stop, -1, 0)]
    for _w, start, finish in sim.runs:
        points += [(start, 0, 1), (finish, 0, -1)]
    points.sort(key=lambda p: p[0])
    out = {"boot": boot, "alone": 0.0, "alone_work": 0.0, "several": 0.0, "several_work": 0.0}
    ready = slots = 0
    last = 0.0
    for t, d_ready, d_slots in points:
        span = t - last
        if span > 0 and ready:
            key = "alone" if ready == 1 else "several"
            out[key] += span * ready
            out[key + "_work"] += span * slots / sim.sc.window
        ready, slots, last = ready + d_ready, slots + d_slots, t
    return {k: v / 60.0 for k, v in out.items()}


class SpotPolicy(InferqPolicy):
    """The real scaler on a market: ``decide`` sizes the primary service, then, with a fallback delay, the
    on-demand stand-ins of :func:`inferq.scaling.capacity.stand_ins` size the fallback service."""

    def __init__(self, *args: Any, fallback: Fallback | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fallback = fallback or Fallback(0.0)
        self.short_at: float | None = None

    def on_tick(self, sim: Sim, now: float, tag: Any) -> None:
        super().on_tick(sim, now, tag)
        if not isinstance(sim, MarketSim) or not self.fallback.enabled:
            return
        short, self.short_at = self.fallback.short(sim.waiting_for_capacity(now), self.short_at, now)
        sim.set_fallback(stand_ins(sim.desired, sim.running("primary", now), short, sim.fallback_desired), now)


def run_market(trace: Any, sc: Scenario, controller: Controller, market: Market) -> tuple[dict[str, Any], MarketSim]:
    sim = MarketSim(trace, sc, market=market)
    result = sim.run(controller)
    return result, sim

