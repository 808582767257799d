"""Where the workers run: Spot capacity first, on-demand stand-ins while Spot capacity is short (a pure rule).

A model's GPU fleet is two ECS services on one queue (infra/gpu.yaml): the **primary** service, whose tasks run on
EC2 Spot (an Auto Scaling group of several instance types of one GPU class, ``price-capacity-optimized``), with an
optional on-demand base placed by its capacity provider strategy; and the **fallback** service, on the on-demand
capacity provider alone, which the scaler sizes here. The scaling policy (:mod:`inferq.scaling.policy`) decides
how many workers the queue needs; that count is always asked of the primary service, so Spot is used whenever it
has capacity. ECS has no fallback of its own: a Spot task that finds no instance waits in ``PROVISIONING``.
So a primary task that has waited for an instance longer than ``fallback_after_s`` (a Spot launch takes a minute
or two; longer means the pools are short) gets an on-demand stand-in on the fallback service. The stand-ins stay
until Spot tasks run in their place or the queue needs fewer workers, then go (ECS stops an idle one at once, a
busy one when its scale-in protection drops); the Spot tasks that still wait are kept, and take over when capacity
returns.

Why a second service and not a second weight in the primary's strategy: a strategy splits every scale-up between
the providers by weight whether Spot is short or not, so a share of every day is paid at on-demand prices, and
during a shortage the Spot share still waits. ``python -m bench.simulate`` compares the two (docs/benchmarks.md,
"GPU dollars").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fallback:
    """The fallback rule's settings: ``after_s`` (``INFERQ_SCALE_SPOT_FALLBACK_S``), how long a Spot task may wait
    for an instance before it gets an on-demand stand-in, 0 turning stand-ins off (Spot tasks wait for capacity);
    and ``memory_s``, how long a shortage, once seen, is remembered: meanwhile a Spot task waiting for an instance
    is short at once, so only the first scale-up of a shortage waits ``after_s``."""

    after_s: float = 180.0
    memory_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.after_s < 0 or self.memory_s < 0:
            raise ValueError(f"the Spot fallback delays must be >= 0, got {self.after_s} and {self.memory_s}")

    @property
    def enabled(self) -> bool:
        return self.after_s > 0

    def short(self, waiting_s: list[float], short_at: float | None, now: float) -> tuple[int, float | None]:
        """The primary's tasks that Spot is short for, given how long each has waited for an instance
        (``PROVISIONING``), and when a shortage was last seen (None: never): those waiting at least ``after_s``,
        or, within ``memory_s`` of the last shortage, every one. Returns the count and the new last-seen time."""
        if not self.enabled:
            return 0, None
        recent = short_at is not None and 0 <= now - short_at < self.memory_s
        threshold = 0.0 if recent else self.after_s
        count = sum(1 for age in waiting_s if age >= threshold)
        return count, (now if count else short_at)


def stand_ins(desired: int, primary_running: int, short: int, current: int) -> int:
    """The fallback service's count: on-demand workers standing in for Spot tasks that find no capacity.

    ``desired`` is the policy's count (asked of the primary service), ``primary_running`` the primary's running
    tasks, ``short`` its tasks short of capacity (:func:`short_of_capacity`) and ``current`` the fallback
    service's count now. While any task is short, Spot is short: every task the primary lacks gets a stand-in,
    the ones asked for since included (they would wait the same), so a burst during a shortage waits for an
    on-demand boot, not for the fallback delay again. Once none is short the stand-ins are kept while the primary
    runs fewer tasks than wanted (the Spot tasks still starting, or stopped and retried by ECS for want of
    capacity, which starts their wait again), never more than it lacks: as Spot tasks start, or the policy wants
    fewer, stand-ins go."""
    lacking = max(desired - max(primary_running, 0), 0)
    if short > 0:
        return lacking
    return min(max(current, 0), lacking)


FALLBACK_SUFFIX = "-on-demand"
"""The fallback service is named after the primary service: its name and this suffix (infra/gpu.yaml)."""


def fallback_service(service: str) -> str:
    return service + FALLBACK_SUFFIX
