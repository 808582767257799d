"""The hot-path decision of wake-on-enqueue: no I/O, at most one check per refresh period."""

from __future__ import annotations

from functions.gateway.telemetry import Telemetry
from functions.gateway.wake import WakeOnEnqueue, wake_event


async def noop() -> None:
    return None


def test_without_a_waker_nothing_is_ever_due() -> None:
    assert not WakeOnEnqueue(None, Telemetry()).due()


def test_a_check_is_due_once_per_refresh_period() -> None:
    wake = WakeOnEnqueue(noop, Telemetry(), refresh_s=60)
    assert wake.due()
    wake._checked_at = float("inf")  # just checked
    assert not wake.due()


def test_no_second_check_while_one_runs() -> None:
    wake = WakeOnEnqueue(noop, Telemetry(), refresh_s=0)
    wake._running_since = 1e18
    assert not wake.due()


def test_the_wake_event_names_the_queue_and_looks_like_eventbridge() -> None:
    event = wake_event("q1")
    assert event["source"] == "inferq.gateway" and event["detail"]["queue"] == "q1"
    assert {"version", "source", "detail-type", "detail"} <= set(event)
