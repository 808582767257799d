"""The strategies the elasticity simulation compares (:mod:`bench.simulate`'s docstring says what each does):
always-on, KEDA-like, and ``inferq.scaling.policy.decide`` itself."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from inferq.scaling.policy import Demand, ScalePolicy, ScaleState, decide

from .sim_fleet import TICK, Controller, Sim

__all__ = ["AlwaysOn", "Controller", "InferqPolicy", "KedaLike"]


class AlwaysOn(Controller):
    def __init__(self, size: int) -> None:
        self.size = size
        self.name = f"always-on ({size} workers)"

    def start(self, sim: Sim) -> None:
        sim.fixed_fleet(self.size)


class InferqPolicy(Controller):
    """The real ``decide`` on a fixed cadence, plus the gateway's wake-up call (rate-limited) at zero."""

    def __init__(self, policy: ScalePolicy, every_s: float, wake: bool = True, wake_gap_s: float = 10.0,
                 wake_latency_s: float = 1.0, observe_all: bool = True, label: str = "") -> None:
        self.policy, self.every_s, self.wake, self.observe_all = policy, every_s, wake, observe_all
        self.wake_gap_s, self.wake_latency_s = wake_gap_s, wake_latency_s
        self.state = ScaleState()
        self.last_wake = -math.inf
        self.name = label or f"inferq policy, every {every_s:.0f} s" + (" + wake" if wake else "")

    def start(self, sim: Sim) -> None:
        sim.at(0.0, TICK, "schedule")

    def on_arrival(self, sim: Sim, now: float) -> None:
        if self.wake and sim.desired == 0 and now - self.last_wake >= self.wake_gap_s:
            self.last_wake = now
            sim.at(now + self.wake_latency_s, TICK, "wake")

    def on_tick(self, sim: Sim, now: float, tag: Any) -> None:
        o = sim.observe(now)
        if self.observe_all:  # what the scaler reads: the oldest job's age, the arrival counter, the run time, the
            # backlog's tokens and the measured throughput (used only with work-based sizing on: tokens_per_s > 0)
            demand = Demand(lag=o.lag, pending=o.pending, busy_workers=o.busy_workers, oldest_wait_s=o.oldest_wait_s,
                            enqueued=o.enqueued, job_s=o.job_s, backlog_tokens=o.backlog_tokens,
                            slot_tokens_per_s=o.slot_tokens_per_s)
        else:  # the job counts alone: the policy as it was before gathering, the forecast and the drain target
            demand = Demand(lag=o.lag, pending=o.pending, busy_workers=o.busy_workers)
        decision = decide(self.policy, demand, self.state.adopt(sim.desired, now), now)
        self.state = decision.state
        sim.set_desired(decision.desired, now)
        if self.observe_all:
            sim.set_target(decision.target, now)
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
