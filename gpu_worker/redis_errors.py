"""Which Redis failures are transient (retry with backoff, G8) and the backoff between tries."""

from __future__ import annotations

import asyncio
import random

from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

TRANSIENT: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, BusyLoadingError, OSError)


class Backoff:
    """Capped exponential backoff with full jitter for reconnecting: many workers that lost one server together
    do not all come back in the same millisecond."""

    def __init__(self, base_s: float = 0.05, cap_s: float = 2.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return random.uniform(self.base_s, min(self.cap_s, self.base_s * 2**self.failures))

    def reset(self) -> None:
        self.failures = 0


def cancelling() -> bool:
    """True when the current task has been asked to stop.

    On Python 3.11 a cancellation that races with an ``asyncio.timeout`` (redis-py wraps every read in one) can
    come out as a ``TimeoutError``, an ``OSError``, which looks like a transient Redis error: a loop that retries
    those must check this, or it would swallow its own cancellation and never end."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
