"""One attempt of a job on this worker: its run context, from the read that delivered it to its outcome's write.

An :class:`Attempt` is created by :class:`~gpu_worker.runner.JobRunner` for each delivery and lives as long as the
worker holds the entry. Everything about the job while it runs hangs here: the delivery, the task running it, why
it was aborted from outside (:class:`Abort`), whether its backend call is over, whether it shared the engine.
A per-job concern added later (its output as it is produced, its share of the worker's busy time, what to keep
when the instance is interrupted) belongs on this object and in the runner's steps, not in the worker's state.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from inferq.queue.protocol import Delivery
from inferq.usage.spend import NONE, Spend

from .interruption import Progress
from .output import OutputWriter


def token_limit(body: dict[str, Any]) -> int | None:
    """A request's ``max_completion_tokens`` or ``max_tokens``: the most its answer may make."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


class Abort:
    """Why a job's backend call was cancelled from outside its task."""

    CANCEL = "cancel"  # the client cancelled it: finish it cancelled
    LOST = "lost"  # another worker holds it now, or it already ended: write nothing
    SHUTDOWN = "shutdown"  # the drain is over: give it back without spending an attempt


@dataclass(eq=False)
class Attempt:
    """A job this worker holds: its delivery, the task running it, and what is happening to it."""

    delivery: Delivery
    task: asyncio.Task[None] | None = None
    abort: str | None = None
    settling: bool = False
    """The backend call is over and the outcome is being written: too late to abort, and no longer at the engine."""
    shared: bool = False
    """Another job's backend call overlapped this one's: when the model server dies, a job that had it to itself
    is the cause, one that shared it may be a bystander (:class:`~gpu_worker.runner.EngineOccupancy`)."""
    started: float = field(default_factory=time.monotonic)
    spend: Spend = NONE
    """What the attempt spent, counted in its tenant's usage with the write that ends it: its time at the model
    server, its share of the worker's busy time (:class:`~inferq.usage.spend.BusyShare`) and, once it answered, the
    tokens of the answer's ``usage``."""
    output: OutputWriter | None = None
    """Where its backend writes its output as it is made, while the call runs (:mod:`gpu_worker.output`); None for a
    request answered whole."""
    token_limit: int | None = None
    """Its request's ``max_tokens`` (or ``max_completion_tokens``): the most the job may make, all attempts
    together; None when it names none."""

    def progress(self) -> Progress | None:
        """What it has made so far, for a stopping worker to tell whether it will end within the drain
        (:mod:`gpu_worker.interruption`); None for a request answered whole."""
        out = self.output
        if out is None:
            return None
        if out.expected is not None:
            left: int | None = out.expected - out.made
        elif self.token_limit is not None:
            left = self.token_limit - out.kept_tokens - out.made
        else:
            left = None
        return Progress(out.first_at, out.made, left)

    @property
    def key(self) -> str:
        return self.delivery.key

    @property
    def suspect(self) -> bool:
        """Delivered before and never finished: its worker died or hung, maybe because of this very job."""
        return self.delivery.job.deliveries > 1

    def cancel(self, reason: str) -> bool:
        """Abort the backend call for ``reason`` (an :class:`Abort`); False when too late or already aborted."""
        if self.settling or self.abort is not None or self.task is None or self.task.done():
            return False
        self.abort = reason
        self.task.cancel()
        return True
