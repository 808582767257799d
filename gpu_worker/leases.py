"""Lease renewal: the worker's proof of life for each job it holds (G4).

A separate task renews every live lease every ``min(1 s, claim-idle / 3)``, so an entry's idle time never nears
``INFERQ_CLAIM_IDLE_MS`` while its worker is healthy, however long the inference runs: the backend call awaits
I/O and never holds the event loop, so nothing it does can starve this task. The same call tells which jobs were
cancelled (abort, finish ``cancelled``) and which were lost to another worker or already ended (abort, write
nothing): the ``renew`` script answers one :class:`~inferq.queue.protocol.Lease` per entry.

A Redis fault the fault model calls recoverable (a failover's ``READONLY``, a timeout, a full server) is tried
again at the next interval: a short outage costs no lease. Anything else ends :meth:`LeaseKeeper.run` with the
exception, and the worker, which supervises it, stops: a worker without a lease keeper would let every long job
be reclaimed and run twice (G4).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from inferq.queue.protocol import Lease, Queue
from inferq.redis.faults import Fault, FaultRun

from .attempt import Abort, Attempt

log = logging.getLogger(__name__)


def renew_interval_s(claim_idle_ms: int) -> float:
    return min(1.0, claim_idle_ms / 3000.0)


class LeaseKeeper:
    """Renews the leases of ``jobs()`` (the attempts the worker holds) as ``consumer``."""

    def __init__(
        self, queue: Queue, consumer: str, jobs: Callable[[], Iterable[Attempt]], *, claim_idle_ms: int,
        on_fault: Callable[[Fault], None] | None = None,
    ) -> None:
        self.queue = queue
        self.consumer = consumer
        self.jobs = jobs
        self.interval_s = renew_interval_s(claim_idle_ms)
        self.on_fault = on_fault
        self.renewals = 0

    async def renew_once(self) -> None:
        held = list(self.jobs())
        if not held:
            return
        leases = await self.queue.renew(self.consumer, [f.delivery for f in held])
        self.renewals += 1
        for job, lease in zip(held, leases, strict=True):
            if lease is Lease.HELD:
                continue
            if lease is Lease.WATCHED:  # someone reads its output now: write it as it is made
                if job.output is not None:
                    job.output.go_live()
                continue
            reason = Abort.CANCEL if lease is Lease.CANCEL_REQUESTED else Abort.LOST
            if job.cancel(reason):
                log.info("aborting job %s: lease %s", job.delivery.job.id, lease.name.lower(),
                         extra={"job_id": job.delivery.job.id})

    async def run(self, stop: asyncio.Event) -> None:
        faults = FaultRun("lease renewal failed", log, on_fault=self.on_fault, clients=[self.queue.redis])
        while not stop.is_set():
            await asyncio.sleep(self.interval_s)
            try:
                await self.renew_once()
                faults.succeeded()
            except Exception as exc:  # absorb() re-raises what is not a Redis fault to wait out
                await faults.absorb(exc)  # the next try is the next interval: never later than a lease allows
