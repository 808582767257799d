"""The Spot fallback rule (inferq/scaling/capacity.py): when Spot is short, and how many on-demand stand-ins."""

from __future__ import annotations

import pytest

from inferq.scaling.capacity import FALLBACK_SUFFIX, Fallback, fallback_service, stand_ins


def test_a_task_is_short_of_spot_once_it_has_waited_the_delay() -> None:
    rule = Fallback(after_s=180.0)
    assert rule.short([10.0, 179.9], None, now=1000.0) == (0, None)  # a Spot launch takes a minute or two
    assert rule.short([10.0, 180.0, 400.0], None, now=1000.0) == (2, 1000.0)


def test_after_a_shortage_every_waiting_task_is_short_at_once_for_a_while() -> None:
    rule = Fallback(after_s=180.0, memory_s=1800.0)
    assert rule.short([5.0], short_at=1000.0, now=1500.0) == (1, 1500.0)  # within the memory: no second delay
    assert rule.short([], short_at=1000.0, now=1500.0) == (0, 1000.0)  # nothing waits: the memory stays as it was
    assert rule.short([5.0], short_at=1000.0, now=2800.0) == (0, 1000.0)  # forgotten: the delay again


def test_a_delay_of_zero_turns_the_fallback_off() -> None:
    rule = Fallback(after_s=0.0)
    assert not rule.enabled
    assert rule.short([3600.0], short_at=None, now=5000.0) == (0, None)
    with pytest.raises(ValueError, match=">= 0"):
        Fallback(after_s=-1.0)


def test_every_task_the_primary_lacks_gets_a_stand_in_while_spot_is_short() -> None:
    # the policy wants 5, Spot runs 1, 2 tasks waited past the delay, 2 more were asked for since: all 4 covered
    assert stand_ins(desired=5, primary_running=1, short=2, current=0) == 4


def test_stand_ins_stay_while_spot_has_not_caught_up_and_go_as_it_does() -> None:
    # the Spot task was stopped and retried by ECS for want of capacity: its wait starts again, the stand-in stays
    assert stand_ins(desired=3, primary_running=1, short=0, current=2) == 2
    # capacity is back: one Spot task runs, one stand-in goes; then the other
    assert stand_ins(desired=3, primary_running=2, short=0, current=2) == 1
    assert stand_ins(desired=3, primary_running=3, short=0, current=1) == 0


def test_stand_ins_go_when_the_queue_needs_fewer_workers() -> None:
    assert stand_ins(desired=1, primary_running=0, short=0, current=3) == 1
    assert stand_ins(desired=0, primary_running=0, short=4, current=3) == 0


def test_no_shortage_no_stand_ins() -> None:
    assert stand_ins(desired=4, primary_running=0, short=0, current=0) == 0  # Spot tasks still booting


def test_the_fallback_service_is_named_after_the_service() -> None:
    assert fallback_service("inferq-chat") == "inferq-chat" + FALLBACK_SUFFIX == "inferq-chat-on-demand"
