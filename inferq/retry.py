"""Retry backoff: exponential with full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter")."""

from __future__ import annotations

import random


def backoff_ms(attempt: int, base_ms: int, cap_ms: int, rng: random.Random | None = None) -> int:
    """Delay before attempt ``attempt + 1`` after ``attempt`` failed: uniform in [0, min(cap, base * 2**(attempt-1))].

    Full jitter spreads a burst of failures over the whole window, so retries of many jobs that failed together
    (a model server restart) do not come back together."""
    if base_ms <= 0:
        return 0
    ceiling = min(cap_ms, base_ms * (2 ** max(attempt - 1, 0)))
    return int((rng or random).uniform(0, ceiling))
