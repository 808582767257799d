"""A stopping worker's rule (gpu_worker/interruption.py): keep what ends within the drain, hand back the rest now."""

from __future__ import annotations

from gpu_worker.interruption import MIN_SAMPLE_S, Progress, hand_back_now, seconds_left


def test_the_rest_takes_what_is_left_at_the_rate_made_so_far() -> None:
    progress = Progress(first_at=100.0, made=51, left=150)  # 50 tokens in the 10 s after the first: 5/s
    assert seconds_left(progress, now=110.0) == 30.0
    assert not hand_back_now(progress, budget_s=30.0, now=110.0)  # ends within the drain: it stays
    assert hand_back_now(progress, budget_s=25.0, now=110.0)  # would not: back to the queue now


def test_a_job_whose_end_cannot_be_told_is_kept() -> None:
    assert seconds_left(None, now=5.0) is None  # a request answered whole: no output to read
    assert seconds_left(Progress(first_at=None, made=0, left=100), now=5.0) is None  # no token yet
    assert seconds_left(Progress(first_at=1.0, made=10, left=None), now=5.0) is None  # nothing bounds the rest
    assert seconds_left(Progress(first_at=1.0, made=1, left=100), now=9.0) is None  # one token is no rate
    assert seconds_left(Progress(first_at=1.0, made=3, left=100), now=1.0 + MIN_SAMPLE_S / 2) is None  # too soon
    for unknown in (None, Progress(first_at=1.0, made=10, left=None)):
        assert not hand_back_now(unknown, budget_s=0.0, now=100.0)


def test_a_job_at_its_limit_is_done() -> None:
    assert seconds_left(Progress(first_at=1.0, made=10, left=0), now=2.0) == 0.0
    assert not hand_back_now(Progress(first_at=1.0, made=10, left=0), budget_s=0.0, now=2.0)
