"""The one backoff helper every waiting loop uses (inferq.retry.backoff)."""

from __future__ import annotations

import random

from inferq.redis.faults import Backoff
from inferq.retry import backoff


def test_without_jitter_it_doubles_from_the_base_up_to_the_cap() -> None:
    assert [backoff(n, 1.0, 30.0, jitter=False) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff(0, 1.0, 30.0, jitter=False) == 1.0  # "no failure yet" is treated as the first
    assert backoff(10_000, 1.0, 30.0, jitter=False) == 30.0  # no overflow however long the run
    assert backoff(5, 0, 30.0) == 0.0


def test_with_jitter_it_spreads_over_the_whole_window() -> None:
    rng = random.Random(3)
    samples = [backoff(4, 1.0, 30.0, rng=rng) for _ in range(500)]
    assert all(0 <= s <= 8 for s in samples)
    assert min(samples) < 1 and max(samples) > 7


def test_the_fault_backoff_is_the_same_curve() -> None:
    ceilings = []
    fault_backoff = Backoff(base_s=0.1, cap_s=1.0, rng=random.Random(1))
    for failures in range(1, 7):
        waits = [fault_backoff.next() for _ in range(1)]
        ceilings.append(min(1.0, 0.1 * 2**failures))
        assert 0 <= waits[0] <= ceilings[-1]
    assert fault_backoff.failures == 6
