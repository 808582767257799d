"""What an attempt comes to, and writing it.

:func:`failed` and :func:`aborted` classify an attempt whose backend call did not answer (retry, fail at once,
poison the engine's killer, give back, drop); :class:`Settler` writes the outcome to the queue, with retries across
Redis faults until its deadline (the shutdown grace) runs out: then the entry stays pending and is reclaimed, so
nothing is lost (G8). Finishes of jobs that end together are coalesced into one round trip.

The logs carry a short code and a digest of a backend's error text, never the text: a model server's message can
quote its input (the job's error, which the tenant reads, keeps it).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from inferq.config.settings import Settings
from inferq.queue.jobs import Job, JobStatus
from inferq.queue.protocol import Delivery, Outcome, Queue
from inferq.redis.coalescing import Coalescer
from inferq.redis.faults import FaultRun
from inferq.retry import backoff_ms
from inferq.usage.spend import Spend

from .attempt import Abort, Attempt
from .backends.base import BackendError, EngineDied, FatalError, RetryableError, digest
from .claim_check import ClaimCheck
from .metrics import WorkerMetrics

log = logging.getLogger("gpu_worker.worker")  # the worker's own logger: moving code here changes no log line

T = TypeVar("T")

FinishItem = tuple[Delivery, JobStatus, Any, Any, Spend | None]


@dataclass(frozen=True)
class Settle:
    """What to write for an attempt."""

    kind: str  # "finish" | "retry" | "poison" | "release" | "drop"
    status: JobStatus | None = None
    result: Any = None
    error: Any = None
    strikes: int = 1
    """For "poison": the engine deaths that make the job poison (1: it had the engine to itself; 2: it shared it)."""


def succeeded(result: Any) -> Settle:
    return Settle("finish", JobStatus.SUCCEEDED, result=result)


def aborted(attempt: Attempt, metrics: WorkerMetrics) -> Settle:
    """An attempt whose backend call was cancelled from outside, for :attr:`Attempt.abort`."""
    if attempt.abort == Abort.CANCEL:
        log.info("job cancelled while running")
        return Settle("finish", JobStatus.CANCELLED,
                      error={"type": "cancelled", "message": "the job was cancelled while running"})
    if attempt.abort == Abort.SHUTDOWN:
        return Settle("release")
    log.info("job lost to another worker or already ended; dropping this attempt")
    metrics.outcome("lost")
    return Settle("drop")


def failed(record: Job, error: Exception, metrics: WorkerMetrics, *, timed_out: bool, timeout_s: int,
           shared: bool = False) -> Settle:
    """Classify a failed attempt: retry (timeout, retryable, unexpected), fail at once (fatal), or poison (the
    model server died: the caller stops taking work)."""
    attempt = record.attempts
    if isinstance(error, TimeoutError) and timed_out:
        metrics.backend_error("timeout")
        log.warning("attempt %d timed out after %d s", attempt, timeout_s)
        return Settle("retry", error={"type": "timeout", "message": f"the attempt took longer than {timeout_s} s"})
    if isinstance(error, TimeoutError):  # a timeout inside the backend, not the job's: retryable
        error = RetryableError(f"timeout in the backend: {error!r}")
    if isinstance(error, EngineDied):
        # alone at the engine, the job killed it: poison now. Sharing it, it may be a bystander of the one
        # that did: poison at its second engine death (the culprit dies again on its next worker)
        metrics.backend_error("engine_died")
        log.error("the model server died during attempt %d (%s; %s)", attempt, _code(error),
                  "shared with other jobs" if shared else "the only job at it",
                  extra={"error_digest": digest(error.message)})
        return Settle("poison", error=error.to_error("engine_died"), strikes=2 if shared else 1)
    if isinstance(error, RetryableError):
        metrics.backend_error("retryable")
        log.warning("attempt %d failed, retryable (%s)", attempt, _code(error),
                    extra={"status_code": error.status_code, "error_digest": digest(error.to_error("")["message"])})
        return Settle("retry", error=error.to_error("backend_error"))
    if isinstance(error, FatalError):
        metrics.backend_error("fatal")
        log.warning("attempt %d failed, not retryable (%s)", attempt, _code(error),
                    extra={"status_code": error.status_code, "error_digest": digest(error.to_error("")["message"])})
        return Settle("finish", JobStatus.FAILED, error=error.to_error("model_error"))
    # a bug or an unexpected backend failure: retried, the attempts are bounded. The traceback's frames are
    # logged (file, line, function), not the exception's text
    metrics.backend_error("unexpected")
    log.error("attempt %d failed unexpectedly (%s)", attempt, type(error).__name__,
              extra={"error_digest": digest(str(error)),
                     "frames": "".join(traceback.format_tb(error.__traceback__))[-4000:]})
    return Settle("retry", error={"type": "worker_error", "message": f"{type(error).__name__}: {error}"})


class Settler:
    """Writes outcomes: one method per kind of write, each retried across Redis faults.

    ``faults(what)`` gives the fault bookkeeping of one write (the worker's, which counts them). :attr:`deadline`
    (a ``time.monotonic()`` value, None while the worker runs) is when writes against an unreachable Redis stop
    trying: a write not made by then answers None and its entry stays pending, to be reclaimed."""

    def __init__(self, settings: Settings, queue: Queue, metrics: WorkerMetrics, claim_check: ClaimCheck,
                 faults: Callable[[str], FaultRun]) -> None:
        self.settings = settings
        self.queue = queue
        self.metrics = metrics
        self.claim_check = claim_check
        self._faults = faults
        self.finishes: Coalescer[FinishItem, Outcome] = Coalescer(queue.finish_many)
        self.deadline: float | None = None

    @property
    def idle(self) -> bool:
        """No finish waits to be written."""
        return self.finishes.idle

    async def wait_idle(self) -> None:
        await self.finishes.wait_idle()

    async def settle(self, delivery: Delivery, settle: Settle, spend: Spend | None = None) -> Outcome | None:
        """Write ``settle`` for ``delivery``, with what the attempt spent (counted in its tenant's usage); the
        queue's answer, or None when the deadline ran out first. A dropped attempt (lost to another worker) writes
        nothing, and its time is counted nowhere."""
        if settle.kind == "drop":
            return None
        if settle.kind == "finish":
            outcome = await self.finish(delivery, settle, spend)
        elif settle.kind in ("retry", "poison"):
            outcome = await self.retry(delivery, settle, spend)
        else:
            outcome = await self.release(delivery, spend)
        if outcome is Outcome.DUPLICATE:
            self.metrics.duplicates.inc()
        if outcome in (Outcome.WRITTEN, Outcome.ENDED):  # ended here, and not dead-lettered: its body is done with
            await self.claim_check.drop_request_body(delivery.job)
        if outcome is None:
            log.error("could not write the outcome (%s) before giving up; the entry will be reclaimed", settle.kind)
        elif outcome not in (Outcome.WRITTEN, Outcome.RETRY_SCHEDULED, Outcome.RELEASED):
            log.info("outcome of %s: %s", settle.kind, outcome.value)
        return outcome

    async def finish(self, delivery: Delivery, settle: Settle, spend: Spend | None = None) -> Outcome | None:
        """Succeeded, failed or cancelled: joins the finishes written in the next round trip."""
        assert settle.status is not None
        item: FinishItem = (delivery, settle.status, settle.result, settle.error, spend)
        outcome = await self.retrying(lambda: self.finishes.submit(item))
        if outcome is Outcome.WRITTEN:
            self.metrics.outcome(settle.status.value)
        return outcome

    async def retry(self, delivery: Delivery, settle: Settle, spend: Spend | None = None) -> Outcome | None:
        """Again after a backoff, or dead-lettered past the attempts (a poison job: past its strikes)."""
        delay = backoff_ms(delivery.job.attempts, self.settings.retry_base_ms, self.settings.retry_max_ms)
        if settle.kind == "poison":
            outcome = await self.retrying(lambda: self.queue.retry(
                delivery, delay_ms=delay, error=settle.error, dead_letter="engine_died", strikes=settle.strikes,
                spend=spend))
        else:
            outcome = await self.retrying(lambda: self.queue.retry(delivery, delay_ms=delay, error=settle.error,
                                                                   spend=spend))
        if outcome in (Outcome.RETRY_SCHEDULED, Outcome.DEAD_LETTERED):
            self.metrics.outcome("retried" if outcome is Outcome.RETRY_SCHEDULED else "dead_lettered")
        return outcome

    async def release(self, delivery: Delivery, spend: Spend | None = None) -> Outcome | None:
        """Give the entry back without spending an attempt (a drain, or a read the worker will not run)."""
        outcome = await self.retrying(lambda: self.queue.release(delivery, spend=spend))
        if outcome is Outcome.RELEASED:
            self.metrics.outcome("released")
        return outcome

    async def retrying(self, write: Callable[[], Awaitable[T]]) -> T | None:
        """Run a Redis write until it succeeds; None only past :attr:`deadline` (the entry stays pending and is
        reclaimed, so nothing is lost)."""
        faults = self._faults("Redis write failed")
        while True:
            try:
                return await write()
            except Exception as exc:  # absorb() re-raises what is not a Redis fault to wait out
                delay = await faults.absorb(exc)
                if self.deadline is not None and time.monotonic() > self.deadline:
                    return None
                await asyncio.sleep(delay)


def _code(error: BackendError) -> str:
    """A short code for a backend error in the logs: its kind and the model server's status."""
    return type(error).__name__ + (f" {error.status_code}" if error.status_code is not None else "")
