"""Which jobs a stopping worker keeps and which it hands back at once (a pure rule, on the jobs' progress).

A worker is told to stop by SIGTERM: a scale-in, a deployment, or ECS draining a Spot instance on EC2's
two-minute interruption notice (the stack's stop timeouts fit that notice: infra/gpu.yaml). It stops pulling at
once and has ``INFERQ_DRAIN_S`` (90 s in the stack) before it gives back whatever is left. Within that budget:

- a job that will end within it finishes where it runs: its instance is paid for until the notice ends anyway, and
  a continuation elsewhere would read its prompt and its output so far again;
- a job that will not is handed back at once, without spending an attempt, with the output it made kept (its
  streamed text so far): another worker, the replacement ECS starts beside this one included, takes it now and
  continues after that output instead of after the drain;
- a job whose end cannot be told (no output yet, or no bound on what it will make) is kept; if the drain ends
  first it is handed back then, its output kept all the same: nothing is lost either way, only the wait.

Whether a job will end in time is read from what it has made: the tokens this attempt has written after its
first, over the time since that first one, give its rate (the time to the first token, a prefill, is not a
decoding rate); what it may still make is its ``max_tokens`` (or ``max_completion_tokens``) less what it and
earlier attempts made, or what its backend says it will make (the mock knows its echo). At that rate, the rest
takes ``left / rate`` seconds: an upper bound, since a generation may stop before its limit.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_SAMPLE_S = 0.2
"""The rate of fewer than this many seconds of output is no rate: the job is kept until it has one."""


@dataclass(frozen=True)
class Progress:
    """What one attempt has made so far."""

    first_at: float | None
    """When its first token came (the caller's monotonic clock); None before any."""
    made: int
    """Tokens this attempt has made."""
    left: int | None
    """Tokens it may still make at most; None when nothing bounds them."""


def seconds_left(progress: Progress | None, now: float) -> float | None:
    """How long the attempt needs at most to end, at the rate it has made tokens; None when that cannot be told."""
    if progress is None or progress.left is None:
        return None
    if progress.left <= 0:
        return 0.0
    if progress.first_at is None or progress.made < 2:
        return None
    elapsed = now - progress.first_at  # the tokens after the first came in this time
    if elapsed < MIN_SAMPLE_S:
        return None
    return progress.left * elapsed / (progress.made - 1)


def hand_back_now(progress: Progress | None, budget_s: float, now: float) -> bool:
    """Whether a stopping worker should hand the attempt back at once: it will not end within ``budget_s``."""
    needed = seconds_left(progress, now)
    return needed is not None and needed > budget_s
