"""The lane share (inferq/queue/lanes.py) without a server: which lanes a read asks, and the starvation bound it keeps,
counted in takes."""

from __future__ import annotations

import pytest

from inferq.queue.jobs import LANES, Priority
from inferq.queue.lanes import SHARE_EVERY, LaneShare

H, N, L = Priority.HIGH, Priority.NORMAL, Priority.LOW


def simulate(share: LaneShare, waiting: dict[Priority, int], window: int, reads: int) -> dict[Priority, int]:
    """Reads of ``window`` slots against lanes holding ``waiting`` entries (a huge number: a constant stream),
    following the plan as Consumer._take does; returns the takes per lane."""
    total = dict.fromkeys(LANES, 0)
    for _ in range(reads):
        taken = dict.fromkeys(LANES, 0)
        short: set[Priority] = set()
        free = window
        for lane, wanted in share.plan(window):
            if free <= 0:
                break
            if wanted is None and lane in short:
                continue
            ask = free if wanted is None else min(wanted, free)
            got = min(ask, waiting[lane])
            waiting[lane] -= got
            if got < ask:
                short.add(lane)
            taken[lane] += got
            free -= got
        share.record(taken, short)
        for lane in LANES:
            total[lane] += taken[lane]
    return total


def test_with_nothing_owed_a_read_asks_the_lanes_in_priority_order() -> None:
    assert LaneShare().plan(1) == [(H, None), (N, None), (L, None)]


@pytest.mark.parametrize("window", [1, 3, 8, 64])
def test_a_waiting_low_lane_gets_at_least_one_take_in_ten_under_a_constant_high_stream(window: int) -> None:
    takes = simulate(LaneShare(), {H: 10**9, N: 0, L: 10**9}, window, reads=2000 // window)
    total = sum(takes.values())
    assert takes[L] >= total // SHARE_EVERY, takes
    assert takes[H] >= total * 8 // 10, takes  # the share is a floor for the low lane, not a round robin


@pytest.mark.parametrize("window", [1, 8])
def test_normal_and_low_each_keep_their_share_when_both_wait(window: int) -> None:
    takes = simulate(LaneShare(), {H: 10**9, N: 10**9, L: 10**9}, window, reads=3000 // window)
    total = sum(takes.values())
    assert takes[L] >= total // SHARE_EVERY and takes[N] >= total // SHARE_EVERY, takes


def test_high_work_is_taken_first_when_no_share_is_owed() -> None:
    share = LaneShare()
    assert simulate(share, {H: 5, N: 5, L: 5}, 1, reads=5) == {H: 5, N: 0, L: 0}


def test_an_empty_lower_lane_owes_nothing_once_read_empty() -> None:
    share = LaneShare()
    simulate(share, {H: 10**9, N: 0, L: 0}, 1, reads=50)
    # each lower lane was asked now and then, came back empty, and started owing from zero again
    assert all(share.waited[lane] < SHARE_EVERY for lane in (N, L))
    assert simulate(share, {H: 10**9, N: 0, L: 3}, 1, reads=40)[L] == 3
