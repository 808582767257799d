"""Running one job: the path from a delivery to its outcome, in one task per job.

:meth:`JobRunner.start` makes the job's :class:`~gpu_worker.attempt.Attempt` and its task; the task

1. reads a claimed request body back from S3 (:class:`~gpu_worker.claim_check.ClaimCheck`),
2. calls the backend under the job's timeout, at the engine from the call's start to its answer
   (:class:`EngineOccupancy`),
   with the attempt's output writer (:mod:`gpu_worker.output`) for a request whose output can stream: the backend
   writes the first choice's text to it as it is made, after what earlier attempts kept,
3. stores a large result in S3, and classifies the end (:mod:`gpu_worker.outcomes`); an attempt that did not
   succeed but is retried or given back writes all the output it made first, for the next attempt to continue,
4. frees its engine slot (:meth:`HeldJobs.settling <gpu_worker.held.HeldJobs.settling>`), writes the outcome
   (:class:`~gpu_worker.outcomes.Settler`), closes the job's output stream if the job ended, and leaves the held
   jobs.

These steps are the place for what happens to each job while it runs (its output as it comes, its share of the
worker's busy time, a hand-back when the instance is interrupted): they read and write the job's
:class:`~gpu_worker.attempt.Attempt`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from inferq.config.settings import Settings
from inferq.queue.protocol import Delivery
from inferq.usage.spend import BusyShare

from . import outcomes
from .attempt import Abort, Attempt, token_limit
from .backends.base import Backend, check_status, child_traceparent, trace_id
from .claim_check import ClaimCheck
from .held import HeldJobs
from .logs import bind_job
from .metrics import WorkerMetrics
from .outcomes import Settle, Settler
from .output import Appends, output_for

log = logging.getLogger("gpu_worker.worker")  # the worker's own logger: moving code here changes no log line


class EngineOccupancy:
    """The attempts whose backend call is under way. An attempt that enters while others are there, and each of
    those, is marked :attr:`~gpu_worker.attempt.Attempt.shared`."""

    def __init__(self) -> None:
        self._at_engine: set[Attempt] = set()

    def __len__(self) -> int:
        return len(self._at_engine)

    def enter(self, attempt: Attempt) -> None:
        if self._at_engine:
            attempt.shared = True
            for other in self._at_engine:
                other.shared = True
        self._at_engine.add(attempt)

    def leave(self, attempt: Attempt) -> None:
        self._at_engine.discard(attempt)


class JobRunner:
    """Runs the jobs the puller starts. ``on_engine_died()`` is called when the model server died under a job
    (the worker then takes no more work); ``on_error(exc)`` when writing an outcome raised what is not a Redis
    fault (a bug: the worker stops)."""

    def __init__(
        self, settings: Settings, backend: Backend, claim_check: ClaimCheck, settler: Settler, held: HeldJobs,
        metrics: WorkerMetrics, *, on_engine_died: Callable[[], None], on_error: Callable[[BaseException], None],
        gpus: int = 1,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.claim_check = claim_check
        self.settler = settler
        self.held = held
        self.metrics = metrics
        self.engine = EngineOccupancy()
        self.busy = BusyShare(gpus)
        """The worker's busy time, split among the attempts at the model server at once: each one's GPU time."""
        # the settler's queue: the output is written as the holder of the delivery, as outcomes are
        self.appends = Appends(settler.queue)
        self._on_engine_died = on_engine_died
        self._on_error = on_error

    def start(self, delivery: Delivery) -> Attempt:
        """Hold ``delivery`` and start its task (the caller tells :meth:`HeldJobs.changed` once per batch)."""
        attempt = Attempt(delivery)
        self.held.add(attempt)
        attempt.task = asyncio.create_task(self.run(attempt))
        return attempt

    async def run(self, attempt: Attempt) -> None:
        record = attempt.delivery.job
        traceparent = child_traceparent(record.traceparent)
        bind_job(record.id, trace_id(traceparent))
        timeout_s = record.timeout_s or self.settings.job_timeout_s
        try:
            settle = await self.call(attempt, timeout_s, traceparent)
            # the model server is done with it: its slot is free while the outcome is written
            self.held.settling(attempt)
            self.metrics.run_time.observe(time.monotonic() - attempt.started)
            if settle.kind == "poison":
                self._on_engine_died()
            await self.settler.settle(attempt.delivery, settle, attempt.spend)
            if attempt.output is not None:
                await attempt.output.close()  # the job ended: its stream's text goes, its readers wake
        except Exception as exc:  # a bug in writing the outcome: the worker stops; the entry is released or reclaimed
            self._on_error(exc)
        finally:
            self.held.remove(attempt)

    async def call(self, attempt: Attempt, timeout_s: int, traceparent: str) -> Settle:
        """The backend call and what it came to (never raises but for a cancellation that is not the job's)."""
        record = attempt.delivery.job
        if self.settings.log_payloads:
            log.debug("request", extra={"url": record.url, "body": record.body})
        deadline = asyncio.timeout(timeout_s)
        try:
            async with deadline:
                request_body = await self.claim_check.request_body(record)
                attempt.output = await output_for(self.settler.queue, self.settings, attempt.delivery, request_body,
                                                  timeout_s, lambda: attempt.cancel(Abort.CANCEL), self.appends)
                attempt.token_limit = token_limit(request_body)
                self.engine.enter(attempt)
                self.busy.begin(attempt)
                status, body = await self.backend.complete(
                    record.url, request_body, timeout_s=timeout_s, traceparent=traceparent, job=record,
                    output=attempt.output,
                )
            attempt.spend = self.busy.end(attempt)  # the model server is done with it
            status, body = check_status(status, body)
            if attempt.output is not None:
                await attempt.output.settle(succeeded=True)
            self.metrics.answered(body)
            # its tokens, read here: a large answer goes to S3 next, and its record keeps a reference
            attempt.spend = attempt.spend.with_tokens(body.get("usage") if isinstance(body, dict) else None)
            result = await self.claim_check.result(record, status, body)
        except asyncio.CancelledError:
            if attempt.abort is None:
                raise  # not ours (the loop is shutting down): let it through
            return await self._kept(attempt, self._aborted(attempt))
        except Exception as exc:
            if attempt.abort is not None:  # the abort's cancellation surfaced as another error (see cancelling())
                return await self._kept(attempt, self._aborted(attempt))
            return await self._kept(attempt, outcomes.failed(record, exc, self.metrics, timed_out=deadline.expired(),
                                                             timeout_s=timeout_s, shared=attempt.shared))
        finally:
            self.engine.leave(attempt)
            if attempt in self.busy:  # a call that failed or was aborted ran until now
                attempt.spend = self.busy.end(attempt)
        if self.settings.log_payloads:
            log.debug("response", extra={"status_code": status, "body": body})
        return outcomes.succeeded(result)

    @staticmethod
    async def _kept(attempt: Attempt, settle: Settle) -> Settle:
        """An attempt that did not succeed and is retried or given back writes all the output it made, so the next
        attempt continues after it (the deltas always spell the final text); one that ended the job, or was lost to
        another worker, writes nothing more."""
        if attempt.output is not None and settle.kind in ("retry", "poison", "release"):
            await attempt.output.settle(succeeded=False)
        return settle

    def _aborted(self, attempt: Attempt) -> Settle:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return outcomes.aborted(attempt, self.metrics)
