"""What a worker takes from the queue: the pull loop, one background task per worker.

It reads only as many entries as the worker has free slots (:meth:`HeldJobs.free <gpu_worker.held.HeldJobs.free>`);
:meth:`~inferq.queue.protocol.Queue.read` takes the lanes in priority order with a starvation bound, and blocks
across every lane only when all are empty. It reclaims idle entries of dead workers, in every lane, when slots are
free (one suspect at a time, see :meth:`Puller.reclaim`), and hands each delivery to the runner. It takes nothing
while the worker is surplus (:class:`~gpu_worker.fleet.Fleet`), and gives back at once what it read as the worker
stopped or turned surplus.

In burst mode the loop ends once the queue is drained: nothing queued, delayed,
pending or held, and no outcome left to write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from inferq.config.settings import Settings
from inferq.queue.protocol import Delivery, Queue, Skipped
from inferq.redis.faults import FaultRun, is_recoverable

from .attempt import Attempt
from .fleet import Fleet
from .held import HeldJobs
from .metrics import WorkerMetrics
from .outcomes import Settler
from .waits import first

log = logging.getLogger("gpu_worker.worker")  # the worker's own logger: moving code here changes no log line

READ_BATCH = 256
"""Most entries taken per read. With a window larger than this, the next batch is read and started while the
previous one is still being finished, so the worker's CPU and Redis's work overlap."""
BURST_BLOCK_MS = 100
"""Longest blocking read in burst mode, which checks for a drained queue after each empty read."""


class Puller:
    """Reads, reclaims and starts. ``start(delivery)`` runs a job (the runner's); ``reader`` is the queue on the
    connection for blocking reads; ``stopping`` is set when the worker stops taking work."""

    def __init__(
        self, settings: Settings, worker_id: str, *, queue: Queue, reader: Queue, held: HeldJobs,
        start: Callable[[Delivery], Attempt], settler: Settler, fleet: Fleet, metrics: WorkerMetrics,
        stopping: asyncio.Event, faults: Callable[[str], FaultRun], block_ms: int, burst: bool = False,
    ) -> None:
        self.settings = settings
        self.id = worker_id
        self.queue = queue
        self.reader = reader
        self.held = held
        self._start = start
        self.settler = settler
        self.fleet = fleet
        self.metrics = metrics
        self.stopping = stopping
        self._faults = faults
        self.burst = burst
        self.block_ms = min(block_ms, BURST_BLOCK_MS) if burst else block_ms
        self.reclaim_every_s = min(settings.claim_idle_ms / 2000.0, 5.0)
        self._suspects: set[str] = set()  # entries delivered before that never finished (see reclaim)
        self._next_reclaim = 0.0

    async def run(self) -> None:
        faults = self._faults("cannot read from Redis")
        while not self.stopping.is_set():
            if self.fleet.surplus:  # beyond the drain target: take nothing new until it takes this worker back
                await first(self.fleet.taken_back(), self.stopping.wait())
                continue
            free = self.held.free()
            if free <= 0:
                await first(self.held.wait_for_slot(), self.stopping.wait())
                continue
            try:
                if self._reclaim_due():
                    self._next_reclaim = time.monotonic() + self.reclaim_every_s
                    await self.reclaim(free)
                    free = self.held.free()
                    if free <= 0:
                        continue
                got, skipped = await self.reader.read(self.id, min(free, READ_BATCH), self.block_ms)
                faults.succeeded()
            except Exception as exc:  # absorb() re-raises what is not a Redis fault: the pull dies
                await first(asyncio.sleep(await faults.absorb(exc)), self.stopping.wait())
                continue
            if got and (self.stopping.is_set() or self.fleet.surplus):
                # read as the worker stopped or turned surplus: straight back, to the workers that pull
                await self._give_back(got, skipped)
                continue
            self.start(got, skipped)
            if self.burst and not got and not skipped and await self.drained():
                return

    def _reclaim_due(self) -> bool:
        """Time to look for idle entries, and no suspect of this worker still running (a suspect that ended lets
        the next one come at once)."""
        if self._suspects:
            self._suspects = {key for key in self._suspects if key in self.held}
            if self._suspects:
                return False
            self._next_reclaim = 0.0
        return time.monotonic() >= self._next_reclaim

    async def reclaim(self, free: int) -> None:
        """Take over idle entries one at a time, and stop at the first suspect.

        A reclaimed job was delivered before and never finished: its worker died or hung, maybe because of this
        very job (a poison request that crashes the model server). Such a suspect runs as the only suspect on
        this worker. So a poison job meets fresh jobs only, and each of those dies with it at most once, then
        runs as a suspect itself, never again beside the poison: innocent jobs are never dead-lettered for
        another job's crashes (with INFERQ_MAX_DELIVERIES >= 2), and the poison alone reaches the limit."""
        for _ in range(free):
            got, skipped = await self.queue.reclaim(self.id, 1)
            self.start(got, skipped)
            if self._suspects or not (got or skipped):
                return

    def start(self, deliveries: list[Delivery], skipped: list[Skipped]) -> None:
        """Hand each delivery to the runner, counting what the read settled without a call."""
        self._count_skipped(skipped)
        if not deliveries:
            return
        now = time.time()
        for delivery in deliveries:
            attempt = self._start(delivery)
            if attempt.suspect:
                self._suspects.add(attempt.key)
            if delivery.reclaimed:
                self.metrics.reclaimed.inc()
            self.metrics.queue_wait.observe(max(0.0, now - delivery.job.created_at))
        self.held.changed()

    async def _give_back(self, deliveries: list[Delivery], skipped: list[Skipped]) -> None:
        for delivery in deliveries:
            await self.settler.release(delivery)
        self._count_skipped(skipped)

    async def drained(self) -> bool:
        """Burst mode's end: nothing held or left to write here, nothing queued, delayed or pending in the queue."""
        if len(self.held) or not self.settler.idle:
            return False
        try:
            return (await self.queue.observe()).backlog == 0
        except Exception as exc:
            if not is_recoverable(exc):
                raise
            return False

    def _count_skipped(self, skipped: list[Skipped]) -> None:
        for s in skipped:
            self.metrics.skipped(s.code.name.lower())
