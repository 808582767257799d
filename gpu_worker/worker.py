"""The worker loop: pull through a window, run each job on the backend, write one outcome per attempt.

Tasks of one worker, all on one event loop:

- the pull loop (:mod:`gpu_worker.pull`) reads only as many entries as it has free slots, higher lanes first,
  reclaims idle entries of dead workers when slots are free (one suspect at a time), and starts one task per job;
- each job's task calls the backend under the job's timeout and writes the outcome: finish (succeeded, failed,
  cancelled — coalesced with other jobs' into one round trip), retry with backoff, release, or nothing (lost);
- :class:`~gpu_worker.leases.LeaseKeeper` renews the leases and aborts cancelled or lost jobs;
- the maintenance task (also :mod:`gpu_worker.pull`) heartbeats and promotes due retries; the protection task
  holds ECS scale-in protection while busy; the webhook task delivers terminal events (see ``webhooks.py``).

Redis faults follow :mod:`inferq.redis.faults`: a TRANSIENT or CAPACITY one (a failover's ``READONLY``, a timeout, a
full server) is retried with backoff everywhere, counted in ``redis_errors``; an outcome that cannot be written yet
keeps its slot until it can (or, past the shutdown grace, is left to be reclaimed), so nothing that was not
finished is lost (G8).

Every task is supervised. Anything else (a BUG-class error, or any unexpected exception) that ends the pull loop,
the lease keeper, the maintenance, protection or webhook task, or an outcome's write, stops the worker at once:
it stops pulling, releases every job it holds without spending an attempt, deregisters, and :meth:`Worker.run`
returns with :attr:`Worker.failure` set (``python -m gpu_worker`` exits 1, so ECS replaces the task). A worker never
runs on with a dead task: without its lease keeper, every long job would be reclaimed and run twice (G4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from typing import Any, TypeVar

from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Delivery, Outcome, Queue
from inferq.redis.batching import Batcher
from inferq.webhooks.sender import WebhookSender

from .backends.base import (
    Backend,
    check_status,
    child_traceparent,
    trace_id,
)
from .claims import ClaimCheck
from .leases import Abort, InFlight, LeaseKeeper
from .logs import bind_job
from .metrics import WorkerMetrics
from .outcomes import Settle, Settling
from .protection import TaskProtection
from .pull import Pulling, _first
from .window import AdaptiveWindow, Window, window_for

log = logging.getLogger(__name__)

T = TypeVar("T")

BLOCK_MS = 500
"""Longest blocking read: bounds how long a stop request waits for the pull loop."""
SHUTDOWN_GRACE_S = 10.0
"""After the drain, how long releases and late writes may retry against an unreachable Redis."""


PROTOCOL_FIELDS = ("queue", "claim_idle_ms", "max_attempts", "max_deliveries", "result_ttl_s", "events_maxlen")
"""Settings the queue's scripts apply: the worker and its :class:`Queue` must agree on them."""


def _check_same_protocol(worker: Settings, queue: Settings) -> None:
    differ = [name for name in PROTOCOL_FIELDS if getattr(worker, name) != getattr(queue, name)]
    if differ:
        raise ValueError(f"the worker's and its queue's settings differ in {', '.join(differ)}")


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class Worker(Pulling, Settling):
    def __init__(
        self,
        settings: Settings,
        queue: Queue,
        backend: Backend,
        *,
        worker_id: str | None = None,
        reader: Queue | None = None,
        metrics: WorkerMetrics | None = None,
        protection: TaskProtection | None = None,
        webhooks: bool = True,
        block_ms: int = BLOCK_MS,
        window: Window | None = None,
    ) -> None:
        _check_same_protocol(settings, queue.settings)
        self.settings = settings
        self.queue = queue
        self.backend = backend
        self.id = worker_id or settings.worker_id or default_worker_id()
        # fixed, or sized from the backend's load (INFERQ_WINDOW=auto): the pull loop asks it before each read
        self.window = window or window_for(settings, backend)
        self.metrics = metrics or WorkerMetrics(settings.queue, self.window.size)
        self.metrics.window.set(self.window.size)
        if isinstance(self.window, AdaptiveWindow):
            window = self.window
            self.metrics.watch_engine(lambda: window.last_load)
        self.protection = protection
        self.block_ms = block_ms
        self._own_reader = reader is None
        # blocking reads get their own connection, with a socket timeout longer than the block
        self.reader = reader or Queue.connect(settings, socket_timeout=settings.redis_timeout_s + block_ms / 1000.0)
        self._in_flight: dict[str, InFlight] = {}
        self._settling = 0  # of those, the jobs whose backend call is over and whose outcome is being written
        # the jobs whose backend call is under way -> whether another job's call overlapped it: when the model
        # server dies, a job that had it to itself is the cause; one that shared it may be a bystander
        self._at_engine: dict[str, bool] = {}
        self._suspects: set[str] = set()  # entries delivered before that never finished (see _reclaim)
        self._next_reclaim = 0.0
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._skip_drain = asyncio.Event()
        self._give_up_at: float | None = None
        self.failure: str | None = None
        """Why the worker stopped on its own (a task died), or None: the process exits non-zero when set."""
        self.claims = ClaimCheck(settings)  # large bodies and results in S3
        self._finishes: Batcher[tuple[Delivery, JobStatus, Any, Any], Outcome] = Batcher(self.queue.finish_many)
        self.leases = LeaseKeeper(
            queue, self.id, self._in_flight.values, claim_idle_ms=settings.claim_idle_ms,
            on_fault=self._count_fault,
        )
        self.webhooks = (
            WebhookSender(queue, settings, self.id, on_outcome=self.metrics.webhook, present=self.claims.job_api)
            if webhooks else None
        )

    # ------------------------------------------------------------------ control

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def stop(self, *, now: bool = False) -> None:
        """Stop pulling and drain (SIGTERM); ``now`` skips the drain (a second signal)."""
        if self._stopping.is_set() and not now:
            now = True  # asked twice: the operator means it
        self._stopping.set()
        if self._give_up_at is None:  # writes against an unreachable Redis stop trying after the drain and grace
            self._give_up_at = time.monotonic() + self.settings.drain_s + SHUTDOWN_GRACE_S
        if now:
            self._skip_drain.set()

    async def run(self) -> None:
        """Work until :meth:`stop`, then drain, release and deregister."""
        await self._run(until_idle=False)

    async def run_until_idle(self) -> None:
        """Work until nothing is queued, delayed, pending or in flight (tests, batch jobs), then shut down."""
        await self._run(until_idle=True)

    async def _run(self, until_idle: bool) -> None:
        if not await self._connect():
            await self._close()
            return
        log.info("worker started", extra={"window": self.settings.window, "backend": self.backend.name})
        side_stop = asyncio.Event()
        background = [
            asyncio.create_task(self.leases.run(side_stop), name="leases"),
            asyncio.create_task(self._maintain(side_stop), name="maintenance"),
        ]
        if self.protection:
            background.append(asyncio.create_task(self.protection.run(side_stop), name="protection"))
        background.append(asyncio.create_task(
            self.window.run(side_stop, self._engine_slots, self._window_changed), name="window"))
        webhook_task = (
            asyncio.create_task(self.webhooks.run(side_stop), name="webhooks") if self.webhooks else None
        )
        supervised = background + ([webhook_task] if webhook_task is not None else [])
        pull = asyncio.create_task(self._pull(until_idle), name="pull")
        try:
            await self._supervise(pull, supervised)
            await self._drain()
        finally:
            side_stop.set()
            pull.cancel()
            for task in background:
                task.cancel()
            if webhook_task is not None:
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(webhook_task, 5.0)
            # bounded: a background task must never hold the shutdown (see inferq.redis.faults.cancelling)
            _, stuck = await asyncio.wait([pull, *background], timeout=5.0)
            if stuck:
                log.error("background tasks did not stop: %s", ", ".join(t.get_name() for t in stuck))
            await self._close()
        if self.failure:
            log.error("worker stopped after a failure: %s", self.failure)
        else:
            log.info("worker stopped")

    async def _supervise(self, pull: asyncio.Task[None], background: list[asyncio.Task[None]]) -> None:
        """Wait for the pull loop to end; a background task that ends before it died (they only end once the
        pull loop has), and stops the worker."""
        alive = set(background)
        while True:
            done, _ = await asyncio.wait({pull, *alive}, return_when=asyncio.FIRST_COMPLETED)
            for task in done - {pull}:
                alive.discard(task)
                self._died(task.get_name(), _error_of(task))
            if pull in done:
                error = _error_of(pull)
                if error is not None:
                    self._died("pull", error)
                return

    def _died(self, what: str, error: BaseException | None) -> None:
        """A task of this worker ended unexpectedly: stop at once, release everything, exit non-zero."""
        reason = f"{what}: {type(error).__name__}: {error}" if error is not None else f"{what} ended"
        log.error("the %s task died; stopping the worker and releasing its jobs", what, exc_info=error)
        if self.failure is None:
            self.failure = reason
        self.stop(now=True)

    async def _connect(self) -> bool:
        """Wait for Redis (a worker may start before it is reachable); False when stopped meanwhile."""
        faults = self._faults("cannot reach Redis", cap_s=5.0)
        while not self._stopping.is_set():
            try:
                await self.queue.ensure_groups()
                return True
            except Exception as exc:  # absorb() re-raises what is not a Redis fault to wait out
                await _first(asyncio.sleep(await faults.absorb(exc)), self._stopping.wait())
        return False

    async def _close(self) -> None:
        try:
            await asyncio.wait_for(self.queue.forget_worker(self.id), 5.0)
            await asyncio.wait_for(self._leave_fleet(), 5.0)
        except Exception as exc:  # on the way out: the heartbeat goes stale and is pruned
            log.warning("could not deregister: %r", exc)
        if self.webhooks:
            await self.webhooks.aclose()
        if self.protection:
            await self.protection.close()
        if self._own_reader:
            await self.reader.close()

    # ------------------------------------------------------------------ one job

    async def _run_job(self, job: InFlight) -> None:
        delivery = job.delivery
        record = delivery.job
        traceparent = child_traceparent(record.traceparent)
        bind_job(record.id, trace_id(traceparent))
        timeout_s = record.timeout_s or self.settings.job_timeout_s
        started = time.monotonic()
        try:
            settle = await self._call(job, timeout_s, traceparent)
            job.settling = True
            # the model server is done with it: its slot is free while the outcome is written (see _engine_slots)
            self._settling += 1
            self._slot_freed.set()
            self.metrics.run_time.observe(time.monotonic() - started)
            await self._settle(delivery, settle)
        except Exception as exc:  # a bug in writing the outcome: the worker stops; the entry is released or reclaimed
            self._died("job writer", exc)
        finally:
            if job.settling:
                self._settling -= 1
            self._in_flight.pop(delivery.key, None)
            if delivery.key in self._suspects:
                self._suspects.discard(delivery.key)
                self._next_reclaim = 0.0  # the next suspect, if any, may come now
            self._slot_freed.set()
            self._occupancy_changed()

    async def _call(self, job: InFlight, timeout_s: int, traceparent: str) -> Settle:
        record = job.delivery.job
        if self.settings.log_payloads:
            log.debug("request", extra={"url": record.url, "body": record.body})
        deadline = asyncio.timeout(timeout_s)
        key = job.delivery.key
        try:
            async with deadline:
                request_body = await self.claims.request_body(record)
                self._engine_enter(key)
                status, body = await self.backend.complete(
                    record.url, request_body, timeout_s=timeout_s, traceparent=traceparent, job=record
                )
            status, body = check_status(status, body)
            self.metrics.answered(body)
            result = await self.claims.result(record, status, body)
        except asyncio.CancelledError:
            if job.abort is None:
                raise  # not ours (the loop is shutting down): let it through
            return self._aborted(job)
        except Exception as exc:
            if job.abort is not None:  # the abort's cancellation surfaced as another error (see cancelling())
                return self._aborted(job)
            return self._failed(record, exc, deadline.expired(), timeout_s, shared=self._at_engine.get(key, False))
        finally:
            self._at_engine.pop(key, None)
        if self.settings.log_payloads:
            log.debug("response", extra={"status_code": status, "body": body})
        return Settle("finish", JobStatus.SUCCEEDED, result=result)

    def _engine_enter(self, key: str) -> None:
        """A job's backend call begins: it and every call under way overlap."""
        if self._at_engine:
            for other in self._at_engine:
                self._at_engine[other] = True
            self._at_engine[key] = True
        else:
            self._at_engine[key] = False

    # ------------------------------------------------------------------ shutdown

    async def _drain(self) -> None:
        tasks = [j.task for j in self._in_flight.values() if j.task is not None]
        if tasks and not self._skip_drain.is_set():
            log.info("draining %d jobs for up to %d s", len(tasks), self.settings.drain_s)
            # asyncio.wait never cancels what it waits for, so the jobs still running are left alone
            await _first(asyncio.wait(tasks, timeout=self.settings.drain_s), self._skip_drain.wait())
        self._give_up_at = time.monotonic() + SHUTDOWN_GRACE_S
        left = [j for j in self._in_flight.values() if j.cancel(Abort.SHUTDOWN)]
        if left:
            log.info("releasing %d unfinished jobs", len(left))
        tasks = [j.task for j in self._in_flight.values() if j.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S + 2)
            for task in pending:  # stuck writing to an unreachable Redis: the entries will be reclaimed
                task.cancel()
        await self._finishes.wait_idle()


def _error_of(task: asyncio.Task[Any]) -> BaseException | None:
    return None if task.cancelled() else task.exception()
