"""A clock a test moves by hand, for the code that takes one (``clock=``, as cachetools' ``timer=``): a cache's
expiry or a back-off is then a step of the test, not a sleep."""

from __future__ import annotations


class FakeClock:
    """Seconds, starting at ``start`` and moving only when told to; called like ``time.monotonic``."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock never goes back"
        self.now += seconds
