"""tests/support/waiting.py: the one way the suite waits for an event."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support.waiting import NeverHappened, eventually, eventually_async


def test_returns_the_first_truthy_value_of_the_condition() -> None:
    answers = iter([None, 0, [], "ready", "later"])
    assert eventually(lambda: next(answers), what="an answer", interval=0) == "ready"


def test_a_condition_that_never_holds_fails_naming_what_never_happened_and_the_last_value() -> None:
    jobs = {"job-1": "running"}
    failure = r"never happened within 0\.05 s: every job to succeed \(last value: \[\]\)"
    with pytest.raises(NeverHappened, match=failure):
        eventually(lambda: [job for job, status in jobs.items() if status == "succeeded"],
                   what="every job to succeed", timeout=0.05)


def test_an_error_of_the_condition_fails_at_once_unless_ignored() -> None:
    calls = itertools.count()

    def dead() -> bool:
        next(calls)
        raise AssertionError("the worker exited with 3")

    with pytest.raises(AssertionError, match="exited with 3"):
        eventually(dead, what="a heartbeat", timeout=5)
    assert next(calls) == 1  # one call: no waiting out the 5 s

    def refused() -> bool:
        raise ConnectionRefusedError("not listening yet")

    with pytest.raises(NeverHappened, match=r"a server \(last error: ConnectionRefusedError") as failure:
        eventually(refused, what="a server", timeout=0.05, ignoring=(OSError,))
    assert isinstance(failure.value.__cause__, ConnectionRefusedError)


def test_the_blocking_form_refuses_a_coroutine_which_would_look_true() -> None:
    async def check() -> bool:
        return False

    with pytest.raises(TypeError, match="use eventually_async"):
        eventually(check, what="a coroutine's answer")


async def test_the_async_form_takes_plain_and_async_conditions_and_lets_the_loop_run() -> None:
    done = asyncio.Event()
    asyncio.get_running_loop().call_soon(done.set)
    assert await eventually_async(done.is_set, what="the event") is True

    async def ready() -> str:
        return "yes"

    assert await eventually_async(ready, what="an async answer") == "yes"
    assert await eventually_async(lambda: asyncio.sleep(0, result=7), what="an awaitable") == 7
    with pytest.raises(NeverHappened, match=r"never happened within 0\.05 s: a miracle"):
        await eventually_async(lambda: asyncio.sleep(0, result=False), what="a miracle", timeout=0.05)
