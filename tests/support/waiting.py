"""Waiting on an event instead of the clock: ``eventually`` (blocking) and ``eventually_async`` (in an event loop).

A test that sleeps and then asserts is a bet on how fast a loaded machine is; these poll a condition until it
holds and fail naming what never happened. The timeout is only a ceiling for a failure: a passing test returns as
soon as the condition holds, so timeouts are generous (the suite runs beside other work on 2 shared cores).

A condition returns something truthy when it holds (that value is returned). An exception it raises fails at once
(so a condition can assert that a process it waits on is still alive), unless its type is in ``ignoring``: then
it counts as "not yet" (e.g. connection refused while a server starts) and the last one is named on timeout.

Proving that something did NOT happen is the one use of a bare sleep left: wait a bounded time, then assert, with
a comment saying what the sleep proves.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_INTERVAL_S = 0.05


class NeverHappened(AssertionError):
    """What a test waited for did not happen within its timeout."""


def eventually(
    condition: Callable[[], T],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = DEFAULT_INTERVAL_S,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns something truthy, and return that; raise
    ``NeverHappened`` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: _Last = _Last()
    while True:
        try:
            value = condition()
        except ignoring as error:
            last.error = error
        else:
            if inspect.isawaitable(value):
                _close(value)
                raise TypeError(f"the condition for {what!r} is a coroutine: use eventually_async")
            if value:
                return value
            last.saw(value)
        if time.monotonic() >= deadline:
            raise last.failure(what, timeout)
        time.sleep(interval)


async def eventually_async(
    condition: Callable[[], T | Awaitable[T]],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = DEFAULT_INTERVAL_S,
    ignoring: tuple[type[BaseException], ...] = (),
) -> T:
    """``eventually`` inside an event loop: ``condition`` may be a plain function or return an awaitable (an async
    function, or a lambda returning a Redis call), and the loop runs between checks."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: _Last = _Last()
    while True:
        try:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
        except ignoring as error:
            last.error = error
        else:
            if value:
                return value  # type: ignore[return-value]
            last.saw(value)
        if loop.time() >= deadline:
            raise last.failure(what, timeout)
        await asyncio.sleep(interval)


class _Last:
    """What the last check saw, for the failure message."""

    def __init__(self) -> None:
        self.value: Any = None
        self.error: BaseException | None = None

    def saw(self, value: Any) -> None:
        self.value, self.error = value, None

    def failure(self, what: str, timeout: float) -> NeverHappened:
        seen = f"last error: {self.error!r}" if self.error is not None else f"last value: {_short(self.value)}"
        failure = NeverHappened(f"never happened within {timeout:g} s: {what} ({seen})")
        failure.__cause__ = self.error
        return failure


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()
