"""The one backoff of the project: capped exponential, with full jitter by default (AWS Architecture Blog,
"Exponential Backoff And Jitter"). Every waiting loop uses it with its own base and cap: job retries
(:func:`backoff_ms`), waiting out a Redis fault (:class:`inferq.redis.faults.Backoff`), webhook redeliveries (without
jitter: the delay is an idle time compared against, not slept), the client's resubmits, the emulator's crash-loop
guard."""

from __future__ import annotations

import random


def backoff(attempt: int, base: float, cap: float, *, jitter: bool = True, rng: random.Random | None = None) -> float:
    """The wait after ``attempt`` failures (1 = the first): ``min(cap, base * 2**(attempt-1))``, or with ``jitter``
    uniform in [0, that]. Full jitter spreads a burst of failures over the whole window, so many callers that
    failed together (a model server restart, a failover) do not come back together. Any unit: the caller's."""
    if base <= 0:
        return 0.0
    ceiling = min(cap, base * 2 ** min(max(attempt - 1, 0), 62))
    return (rng or random).uniform(0, ceiling) if jitter else ceiling


def backoff_ms(attempt: int, base_ms: int, cap_ms: int, rng: random.Random | None = None) -> int:
    """A job's retry delay after ``attempt`` failed (``INFERQ_RETRY_BASE_MS``, ``INFERQ_RETRY_MAX_MS``)."""
    return int(backoff(attempt, base_ms, cap_ms, rng=rng))
