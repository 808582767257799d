"""What a worker holds and what its transitions answer: a :class:`Delivery` (a job handed to it under a lease), an
entry its start settled without running the model (:class:`Skipped`), the :class:`Outcome` of a finish, retry or
release, a renewal's :class:`Lease` per entry, and the call token of a settle (:func:`settle_token`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum

from inferq.queue.core import new_token
from inferq.queue.jobs import Job, Priority
from inferq.redis.scripting import Code


class Outcome(str, Enum):
    """What a worker's transition did."""

    WRITTEN = "written"  # finish: terminal state recorded
    RETRY_SCHEDULED = "retry_scheduled"
    DEAD_LETTERED = "dead_lettered"
    RELEASED = "released"
    DUPLICATE = "duplicate"  # the job was already terminal: discarded and counted
    STALE = "stale"  # the entry was no longer the job's live entry
    NOT_FOUND = "not_found"
    ENDED = "ended"  # the job ended some other way here (e.g. cancellation requested)


class Lease(int, Enum):
    """Per-entry answer of a lease renewal."""

    HELD = 0
    CANCEL_REQUESTED = 1
    LOST = 2
    TERMINAL = 3
    WATCHED = 4  # held, and someone reads the job's output as it is made: write it (gpu_worker/output.py)


@dataclass(frozen=True)
class Delivery:
    """A job handed to this worker: run it, then finish, retry or release it by its entry and lease token.
    The lease token is this delivery's own (start.lua records it on the job): once the entry is reclaimed or
    started again, the token no longer matches and this delivery's writes change nothing."""

    entry_id: str
    job: Job
    reclaimed: bool = False
    lease: str = ""
    lane: Priority = Priority.NORMAL
    spent: tuple[str, int, int] = ("", 0, 0)
    """What the job's usage is counted under and what its earlier attempts spent, as its record said when this
    delivery began: (model, run ms, GPU ms; fields ``model``, ``run_ms``, ``gpu_ms``). Only this delivery's own
    retry or release changes them until it ends."""

    @property
    def attempt(self) -> int:
        return self.job.attempts

    @property
    def key(self) -> str:
        """The entry's identity across lanes: entry ids are per stream, so two lanes can hand out the same one."""
        return f"{self.lane.value}:{self.entry_id}"


@dataclass(frozen=True)
class Skipped:
    """An entry that start.lua settled without running the model (terminal, stale, expired, dead-lettered)."""

    entry_id: str
    job_id: str
    code: Code
    status: str | None = None


def settle_token(delivery: Delivery, *what: str) -> str:
    """The call token of a finish, retry or release: derived from the delivery's lease and what is written, so the
    worker's own retry of the same write after an error it saw (a timeout, ReplicationLag) is recognised as a
    resend too and answers as the first did; another write by the same delivery is a different call."""
    if not delivery.lease:
        return new_token()
    return hashlib.sha256("\0".join((delivery.lease, *what)).encode()).hexdigest()[:16]
