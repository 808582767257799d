"""What an attempt comes to, and writing it (a mixin of :class:`gpu_worker.worker.Worker`, which owns the state
named below): a failed backend call classified (retry, fail at once, poison the engine's killer, abort), and the
outcome written to the queue with retries across Redis faults until the shutdown grace runs out (then the entry
stays pending and is reclaimed: nothing is lost, G8).

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
from typing import TYPE_CHECKING, Any, TypeVar

from inferq.config.settings import Settings
from inferq.queue.jobs import Job, JobStatus
from inferq.queue.protocol import Delivery, Outcome, Queue
from inferq.redis.batching import Batcher
from inferq.retry import backoff_ms

from .backends.base import BackendError, EngineDied, FatalError, RetryableError, digest
from .claims import ClaimCheck
from .leases import Abort, InFlight
from .metrics import WorkerMetrics

if TYPE_CHECKING:
    from inferq.redis.faults import FaultRun

log = logging.getLogger("gpu_worker.worker")  # the worker's own logger: moving code here changes no log line

T = TypeVar("T")


@dataclass(frozen=True)
class Settle:
    """What to write for an attempt."""

    kind: str  # "finish" | "retry" | "poison" | "release" | "drop"
    status: JobStatus | None = None
    result: Any = None
    error: Any = None
    strikes: int = 1
    """For "poison": the engine deaths that make the job poison (1: it had the engine to itself; 2: it shared it)."""


class Settling:
    """A worker's side of an attempt's outcome."""

    settings: Settings
    queue: Queue
    metrics: WorkerMetrics
    claims: ClaimCheck
    failure: str | None
    _give_up_at: float | None
    _finishes: Batcher[tuple[Delivery, JobStatus, Any, Any], Outcome]

    if TYPE_CHECKING:  # the worker's and its pull mixin's, used here

        def stop(self, *, now: bool = False) -> None: ...

        def _faults(self, what: str, *, cap_s: float = 2.0) -> FaultRun: ...

    def _aborted(self, job: InFlight) -> Settle:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        if job.abort == Abort.CANCEL:
            log.info("job cancelled while running")
            return Settle("finish", JobStatus.CANCELLED,
                          error={"type": "cancelled", "message": "the job was cancelled while running"})
        if job.abort == Abort.SHUTDOWN:
            return Settle("release")
        log.info("job lost to another worker or already ended; dropping this attempt")
        self.metrics.outcome("lost")
        return Settle("drop")

    def _failed(self, record: Job, error: Exception, timed_out: bool, timeout_s: int, *, shared: bool = False
                ) -> Settle:
        """Classify a failed attempt: retry (timeout, retryable, unexpected) or fail at once (fatal)."""
        attempt = record.attempts
        if isinstance(error, TimeoutError) and timed_out:
            self.metrics.backend_error("timeout")
            log.warning("attempt %d timed out after %d s", attempt, timeout_s)
            return self._retry({"type": "timeout", "message": f"the attempt took longer than {timeout_s} s"})
        if isinstance(error, TimeoutError):  # a timeout inside the backend, not the job's: retryable
            error = RetryableError(f"timeout in the backend: {error!r}")
        # the logs carry a short code and a digest of the error text, never the text: a model server's message can
        # quote its input (the job's error, which the tenant reads, keeps it)
        if isinstance(error, EngineDied):
            # alone at the engine, the job killed it: poison now. Sharing it, it may be a bystander of the one
            # that did: poison at its second engine death (the culprit dies again on its next worker)
            self.metrics.backend_error("engine_died")
            log.error("the model server died during attempt %d (%s; %s)", attempt, _code(error),
                      "shared with other jobs" if shared else "the only job at it",
                      extra={"error_digest": digest(error.message)})
            # a worker whose model server died takes no more work: it writes what it holds and exits non-zero,
            # so its task is replaced (an engine that stays dead would otherwise fail every job it is handed)
            if self.failure is None:
                self.failure = "the model server died"
            self.stop()
            return Settle("poison", error=error.to_error("engine_died"), strikes=2 if shared else 1)
        if isinstance(error, RetryableError):
            self.metrics.backend_error("retryable")
            log.warning("attempt %d failed, retryable (%s)", attempt, _code(error),
                        extra={"status_code": error.status_code, "error_digest": digest(error.to_error("")["message"])})
            return self._retry(error.to_error("backend_error"))
        if isinstance(error, FatalError):
            self.metrics.backend_error("fatal")
            log.warning("attempt %d failed, not retryable (%s)", attempt, _code(error),
                        extra={"status_code": error.status_code, "error_digest": digest(error.to_error("")["message"])})
            return Settle("finish", JobStatus.FAILED, error=error.to_error("model_error"))
        # a bug or an unexpected backend failure: retried, the attempts are bounded. The traceback's frames are
        # logged (file, line, function), not the exception's text
        self.metrics.backend_error("unexpected")
        log.error("attempt %d failed unexpectedly (%s)", attempt, type(error).__name__,
                  extra={"error_digest": digest(str(error)),
                         "frames": "".join(traceback.format_tb(error.__traceback__))[-4000:]})
        return self._retry({"type": "worker_error", "message": f"{type(error).__name__}: {error}"})

    def _retry(self, error: dict[str, Any]) -> Settle:
        return Settle("retry", error=error)

    async def _settle(self, delivery: Delivery, settle: Settle) -> None:
        outcome: Outcome | None
        if settle.kind == "drop":
            return
        if settle.kind == "finish":
            assert settle.status is not None
            item = (delivery, settle.status, settle.result, settle.error)
            outcome = await self._retrying(lambda: self._finishes.submit(item))
            if outcome is Outcome.WRITTEN:
                self.metrics.outcome(settle.status.value)
        elif settle.kind == "poison":
            delay = backoff_ms(delivery.job.attempts, self.settings.retry_base_ms, self.settings.retry_max_ms)
            outcome = await self._retrying(lambda: self.queue.retry(
                delivery, delay_ms=delay, error=settle.error, dead_letter="engine_died", strikes=settle.strikes))
            if outcome in (Outcome.RETRY_SCHEDULED, Outcome.DEAD_LETTERED):
                self.metrics.outcome("retried" if outcome is Outcome.RETRY_SCHEDULED else "dead_lettered")
        elif settle.kind == "retry":
            attempt = delivery.job.attempts
            delay = backoff_ms(attempt, self.settings.retry_base_ms, self.settings.retry_max_ms)
            outcome = await self._retrying(lambda: self.queue.retry(delivery, delay_ms=delay, error=settle.error))
            if outcome in (Outcome.RETRY_SCHEDULED, Outcome.DEAD_LETTERED):
                self.metrics.outcome("retried" if outcome is Outcome.RETRY_SCHEDULED else "dead_lettered")
        else:
            outcome = await self._retrying(lambda: self.queue.release(delivery))
            if outcome is Outcome.RELEASED:
                self.metrics.outcome("released")
        if outcome is Outcome.DUPLICATE:
            self.metrics.duplicates.inc()
        if outcome in (Outcome.WRITTEN, Outcome.ENDED):  # ended here, and not dead-lettered: its body is done with
            await self.claims.drop_request_body(delivery.job)
        if outcome is None:
            log.error("could not write the outcome (%s) before giving up; the entry will be reclaimed", settle.kind)
        elif outcome not in (Outcome.WRITTEN, Outcome.RETRY_SCHEDULED, Outcome.RELEASED):
            log.info("outcome of %s: %s", settle.kind, outcome.value)

    async def _retrying(self, write: Callable[[], Awaitable[T]]) -> T | None:
        """Run a Redis write until it succeeds; None only past the shutdown grace (the entry stays pending and
        is reclaimed, so nothing is lost)."""
        faults = self._faults("Redis write failed")
        while True:
            try:
                return await write()
            except Exception as exc:  # absorb() re-raises what is not a Redis fault to wait out
                delay = await faults.absorb(exc)
                if self._give_up_at is not None and time.monotonic() > self._give_up_at:
                    return None
                await asyncio.sleep(delay)


def _code(error: BackendError) -> str:
    """A short code for a backend error in the logs: its kind and the model server's status."""
    return type(error).__name__ + (f" {error.status_code}" if error.status_code is not None else "")
