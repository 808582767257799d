"""The worker: pull through a window, run each job on the backend, write one outcome per attempt.

:class:`Worker` owns its collaborators, each made here with what it needs and each with one concern:

- :class:`~gpu_worker.held.HeldJobs`: the jobs it holds and the room its window leaves
  (:mod:`gpu_worker.window`: fixed, or sized from the model server's load);
- :class:`~gpu_worker.pull.Puller`: the pull loop: reads only as many entries as there are free slots, higher lanes
  first, reclaims idle entries of dead workers (one suspect at a time), hands each delivery to the runner;
- :class:`~gpu_worker.runner.JobRunner`: one task per job: the backend call under the job's timeout, then its
  outcome through the :class:`~gpu_worker.outcomes.Settler` (finish, coalesced with other jobs' into one round
  trip; retry with backoff; release; or nothing, when lost);
- :class:`~gpu_worker.leases.LeaseKeeper`: renews the leases, aborts cancelled or lost jobs;
- :class:`~gpu_worker.maintenance.Maintenance`: heartbeat and fleet record (:class:`~gpu_worker.fleet.Fleet`,
  drain when surplus), promotion of due retries, expiry, pruning;
- :class:`~gpu_worker.protection.TaskProtection` (on ECS): scale-in protection while busy; and the
  :class:`~inferq.webhooks.sender.WebhookSender`: terminal events to their webhooks.

Redis faults follow :mod:`inferq.redis.faults`: a TRANSIENT or CAPACITY one (a failover's ``READONLY``, a timeout, a
full server) is retried with backoff everywhere, counted in ``redis_errors``; an outcome that cannot be written yet
keeps its slot until it can (or, past the shutdown grace, is left to be reclaimed), so nothing that was not
finished is lost (G8).

Every task is supervised. Anything else (a BUG-class error, or any unexpected exception) that ends the pull loop,
the lease keeper, the maintenance, window, protection or webhook task, or an outcome's write, stops the worker at
once: it stops pulling, releases every job it holds without spending an attempt, deregisters, and
:meth:`Worker.run` returns with :attr:`Worker.failure` set (``python -m gpu_worker`` exits 1, so ECS replaces the
task). A worker never runs on with a dead task: without its lease keeper, every long job would be reclaimed and run
twice (G4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from typing import Any

from inferq.config.settings import Settings
from inferq.queue.protocol import Queue
from inferq.redis.faults import Fault, FaultRun
from inferq.webhooks.sender import WebhookSender

from .attempt import Abort, Attempt
from .backends.base import Backend
from .claim_check import ClaimCheck
from .fleet import Fleet
from .held import HeldJobs
from .interruption import hand_back_now
from .leases import LeaseKeeper
from .maintenance import Maintenance
from .metrics import WorkerMetrics
from .outcomes import Settler
from .protection import TaskProtection
from .pull import Puller
from .runner import JobRunner
from .waits import first
from .window import AdaptiveWindow, Window, window_for

log = logging.getLogger(__name__)

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


class Worker:
    """One worker on ``queue``, calling ``backend``. ``burst``: drain the queue, then return. ``gpus``: the GPUs its
    model server uses (each busy second is that many GPU-seconds in its tenants' usage)."""

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
        burst: bool = False,
        gpus: int = 1,
    ) -> None:
        _check_same_protocol(settings, queue.settings)
        self.settings = settings
        self.queue = queue
        self.backend = backend
        self.id = worker_id or settings.worker_id or default_worker_id()
        self.protection = protection
        self.failure: str | None = None
        """Why the worker stopped on its own (a task died, the model server died), or None: the process exits
        non-zero when set."""
        self._stopping = asyncio.Event()
        self._skip_drain = asyncio.Event()
        self._own_reader = reader is None
        # blocking reads get their own connection, with a socket timeout longer than the block
        self.reader = reader or Queue.connect(settings, socket_timeout=settings.redis_timeout_s + block_ms / 1000.0)
        # fixed, or sized from the backend's load (INFERQ_WINDOW=auto): the held jobs ask it before each read
        self.window = window or window_for(settings, backend)
        self.metrics = metrics or WorkerMetrics(settings.queue, self.window.size)
        self._watch_window()
        self.held = HeldJobs(self.window, on_change=self._occupancy_changed)
        self.claim_check = ClaimCheck(settings)  # large bodies and results in S3
        self.settler = Settler(settings, queue, self.metrics, self.claim_check, self._faults)
        self.fleet = Fleet(settings, queue, self.id, self.metrics, held=lambda: len(self.held))
        self.runner = JobRunner(settings, backend, self.claim_check, self.settler, self.held, self.metrics,
                                on_engine_died=self._engine_died, on_error=lambda exc: self._died("job writer", exc),
                                gpus=gpus)
        self.puller = Puller(
            settings, self.id, queue=queue, reader=self.reader, held=self.held, start=self.runner.start,
            settler=self.settler, fleet=self.fleet, metrics=self.metrics, stopping=self._stopping,
            faults=self._faults, block_ms=block_ms, burst=burst,
        )
        self.leases = LeaseKeeper(queue, self.id, lambda: self.held, claim_idle_ms=settings.claim_idle_ms,
                                  on_fault=self._count_fault)
        self.maintenance = Maintenance(queue, self.id, self.fleet, held=lambda: len(self.held), faults=self._faults)
        self.webhooks = (
            WebhookSender(queue, settings, self.id, on_outcome=self.metrics.webhook, present=self.claim_check.job_api)
            if webhooks else None
        )

    def _watch_window(self) -> None:
        self.metrics.window.set(self.window.size)
        if isinstance(self.window, AdaptiveWindow):
            window = self.window
            self.metrics.watch_engine(lambda: window.last_load)

    # ------------------------------------------------------------------ control

    @property
    def in_flight(self) -> int:
        """The jobs this worker holds now."""
        return len(self.held)

    def stop(self, *, now: bool = False) -> None:
        """Stop pulling and drain (SIGTERM); ``now`` skips the drain (a second signal). The first stop hands back
        at once the jobs that will not end within the drain (:meth:`hand_back_late`)."""
        first = not self._stopping.is_set()
        if not first and not now:
            now = True  # asked twice: the operator means it
        self._stopping.set()
        if self.settler.deadline is None:  # writes against an unreachable Redis stop trying after the drain and grace
            self.settler.deadline = time.monotonic() + self.settings.drain_s + SHUTDOWN_GRACE_S
        if now:
            self._skip_drain.set()
        elif first and self.failure is None:  # told to stop (SIGTERM), not stopping for a failure of its own
            self.hand_back_late()

    def hand_back_late(self) -> list[Attempt]:
        """Give back now, without spending an attempt and with their output kept, the jobs that will not end within
        ``INFERQ_DRAIN_S`` at the rate they make tokens (:mod:`gpu_worker.interruption`): another worker continues
        them at once instead of after the drain. What ends in time, or cannot tell, stays."""
        now = time.monotonic()
        late = [a for a in self.held
                if hand_back_now(a.progress(), self.settings.drain_s, now) and a.cancel(Abort.SHUTDOWN)]
        if late:
            log.info("handing back %d jobs that will not end within the %d s drain", len(late),
                     self.settings.drain_s)
        return late

    async def run(self) -> None:
        """Work until :meth:`stop` (or, in burst mode, until the queue is drained), then drain, release and
        deregister."""
        if not await self._connect():
            await self._close()
            return
        log.info("worker started", extra={"window": self.settings.window, "backend": self.backend.name})
        side_stop = asyncio.Event()
        background = self._start_background(side_stop)
        webhook_task = (
            asyncio.create_task(self.webhooks.run(side_stop), name="webhooks") if self.webhooks else None
        )
        supervised = background + ([webhook_task] if webhook_task is not None else [])
        pull = asyncio.create_task(self.puller.run(), name="pull")
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

    def _start_background(self, stop: asyncio.Event) -> list[asyncio.Task[None]]:
        """The tasks beside the pull loop that end only when ``stop`` is set (but for the webhooks', which the
        shutdown lets finish its delivery)."""
        background = [
            asyncio.create_task(self.leases.run(stop), name="leases"),
            asyncio.create_task(self.maintenance.run(stop), name="maintenance"),
            asyncio.create_task(self.window.run(stop, self.held.at_engine, self._window_changed), name="window"),
        ]
        if self.protection:
            background.append(asyncio.create_task(self.protection.run(stop), name="protection"))
        return background

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

    def _engine_died(self) -> None:
        """The model server died under a job: take no more work, write what is held, exit non-zero, so the task
        is replaced (an engine that stays dead would otherwise fail every job it is handed)."""
        if self.failure is None:
            self.failure = "the model server died"
        self.stop()

    # ------------------------------------------------------------------ wiring

    def _count_fault(self, fault: Fault) -> None:
        self.metrics.redis_errors.inc()

    def _faults(self, what: str, *, cap_s: float = 2.0) -> FaultRun:
        """The fault bookkeeping of one of this worker's loops (see :class:`inferq.redis.faults.FaultRun`)."""
        return FaultRun(what, log, on_fault=self._count_fault, clients=[self.queue.redis, self.reader.redis],
                        cap_s=cap_s)

    def _window_changed(self, old: int, new: int) -> None:
        self.metrics.window.set(new)
        log.debug("window %d -> %d", old, new)
        if new > old:
            self.held.slot_freed()  # the pull loop may be waiting for a slot: there are more now

    def _occupancy_changed(self, held: int) -> None:
        self.metrics.in_flight.set(held)
        if self.protection:
            self.protection.set_busy(bool(held))

    # ------------------------------------------------------------------ start and end

    async def _connect(self) -> bool:
        """Wait for Redis (a worker may start before it is reachable); False when stopped meanwhile."""
        faults = self._faults("cannot reach Redis", cap_s=5.0)
        while not self._stopping.is_set():
            try:
                await self.queue.ensure_groups()
                return True
            except Exception as exc:  # absorb() re-raises what is not a Redis fault to wait out
                await first(asyncio.sleep(await faults.absorb(exc)), self._stopping.wait())
        return False

    async def _drain(self) -> None:
        tasks = [a.task for a in self.held if a.task is not None]
        if tasks and not self._skip_drain.is_set():
            log.info("draining %d jobs for up to %d s", len(tasks), self.settings.drain_s)
            # asyncio.wait never cancels what it waits for, so the jobs still running are left alone
            await first(asyncio.wait(tasks, timeout=self.settings.drain_s), self._skip_drain.wait())
        self.settler.deadline = time.monotonic() + SHUTDOWN_GRACE_S
        left = [a for a in self.held if a.cancel(Abort.SHUTDOWN)]
        if left:
            log.info("releasing %d unfinished jobs", len(left))
        tasks = [a.task for a in self.held if a.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S + 2)
            for task in pending:  # stuck writing to an unreachable Redis: the entries will be reclaimed
                task.cancel()
        await self.settler.wait_idle()

    async def _close(self) -> None:
        try:
            await asyncio.wait_for(self.queue.forget_worker(self.id), 5.0)
            await asyncio.wait_for(self.fleet.leave(), 5.0)
        except Exception as exc:  # on the way out: the heartbeat goes stale and is pruned
            log.warning("could not deregister: %r", exc)
        if self.webhooks:
            await self.webhooks.aclose()
        if self.protection:
            await self.protection.close()
        if self._own_reader:
            await self.reader.close()


def _error_of(task: asyncio.Task[Any]) -> BaseException | None:
    return None if task.cancelled() else task.exception()
