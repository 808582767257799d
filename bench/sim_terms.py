"""The market the simulated fleet buys from (:mod:`bench.sim_market` runs the fleet on it): what AWS charges for a
GPU-hour on-demand and on Spot, how often Spot takes an instance back and with what notice, the windows when Spot has
no capacity, and :class:`Market`, how a fleet buys (all on-demand, or Spot with an on-demand base, split or
fallback; continuation on or off). Each figure says where it comes from.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .sim_fleet import Scenario

ON_DEMAND_PER_H = 1.006
"""g5.xlarge (one NVIDIA A10G, 24 GiB), Linux On-Demand, us-east-1: $1.006 an hour (aws.amazon.com/ec2/pricing/
on-demand/). The stack's default ``InstanceType``."""
SPOT_PER_H = 0.35
"""Spot price per GPU-hour of the same class. g5.xlarge Spot in us-east-1 has been about $0.30-0.50 an hour
(2026; aws.amazon.com/ec2/spot/pricing/ and the EC2 console's Spot price history), g6.xlarge (one L4, 24 GiB) at
or below it; the Spot group spreads over four such types with ``price-capacity-optimized``, which buys from the
cheaper pools with capacity: 0.35 (35% of on-demand) is an assumption within that range, not a quote. The dollar
table is printed again at 0.30, 0.40 and 0.50 (:data:`PRICE_SWEEP`); ``--spot-price`` sets it."""
PRICE_SWEEP = (0.30, 0.40, 0.50)
NOTICE_S = 120.0
"""EC2's Spot interruption notice: the instance is reclaimed two minutes after it."""
DRAIN_S = 90.0
"""INFERQ_DRAIN_S of the Spot stack (infra/gpu.yaml's DrainSeconds): what will end within it finishes where it
runs; the worker's stop timeout (105 s) and vLLM's (10 s) fit inside the notice."""
CONTINUE_OVERHEAD_S = 0.5
"""What a continued attempt spends before its first new token: the prompt and the kept text prefilled again (a
few thousand tokens prefill in well under a second on one A10G); an estimate, charged to every continuation."""
FALLBACK_AFTER_S = 180.0
"""INFERQ_SCALE_SPOT_FALLBACK_S's default: a Spot task that has waited this long for an instance gets an
on-demand stand-in (a Spot launch takes a minute or two)."""
ADVISOR_MONTHLY = {"<5%": 0.05, "5-10%": 0.10, "10-15%": 0.15, "15-20%": 0.20}
"""The Spot Instance Advisor's frequency-of-interruption buckets (the share of a type's instances interrupted over
the trailing month; aws.amazon.com/ec2/spot/instance-advisor/), by their upper ends: GPU types sit in 5-20%."""
STRESS_PER_H = 1.0
"""A stress rate: every Spot instance interrupted about once an hour, far beyond any bucket."""
SHORTAGES = 2
SHORTAGE_S = 3600.0
"""The shortage rows: two windows of an hour each, within 08:00-20:00 (the busy part of the day), when no Spot
pool has capacity; drawn from a generator of their own, so the day's jobs are unchanged."""


def per_hour(monthly: float) -> float:
    """Interruptions per instance-hour for a share ``monthly`` of instances interrupted within a month (730 h)."""
    return -math.log(1.0 - monthly) / 730.0


def shortage_windows(sc: Scenario, count: int = SHORTAGES,
                     length_s: float = SHORTAGE_S) -> tuple[tuple[float, float], ...]:
    rng = random.Random(sc.seed + 500)
    starts = sorted(rng.uniform(sc.day_s * 8 / 24, sc.day_s * 20 / 24 - length_s) for _ in range(count))
    return tuple((s, s + length_s) for s in starts)


@dataclass(frozen=True)
class Market:
    """How the fleet buys its instances (module docstring). The default is all on-demand: :class:`bench.sim_fleet.Sim`'s
    fleet, priced."""

    spot: bool = False
    on_demand_base: int = 0
    on_demand_weight: int = 0
    fallback_after_s: float = 0.0
    interruptions_per_h: float = 0.0
    continuation: bool = True
    hand_back: str = "at_once"
    drain_s: float = DRAIN_S
    notice_s: float = NOTICE_S
    shortages: tuple[tuple[float, float], ...] = ()
    spot_per_h: float = SPOT_PER_H
    on_demand_per_h: float = ON_DEMAND_PER_H
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hand_back not in ("at_once", "at_deadline"):
            raise ValueError(f"hand_back must be at_once or at_deadline, got {self.hand_back!r}")


def price(spot_hours: float, on_demand_hours: float, spot_per_h: float = SPOT_PER_H,
          on_demand_per_h: float = ON_DEMAND_PER_H) -> float:
    return spot_hours * spot_per_h + on_demand_hours * on_demand_per_h
