"""What a worker takes from the queue, and the queue's upkeep it shares in (a mixin of
:class:`gpu_worker.worker.Worker`, which owns the state named below).

- The pull loop reads only as many entries as the worker has free slots (a job's slot is free once its backend
  call is over, while its outcome is written: :meth:`Pulling._free_slots`); :meth:`~inferq.queue.protocol.Queue.read`
  takes the
  lanes in priority order with a starvation bound, and blocks across every lane only when all are empty. It
  reclaims idle entries of dead workers, in every lane, when slots are free (one suspect at a time, see
  :meth:`Pulling._reclaim`), and starts one task per job.
- The maintenance task heartbeats, promotes due retries (each into its own lane), expires jobs past their
  ``ttl_s``, and now and then prunes what dead workers left behind.
- Drain when surplus: with each heartbeat the worker records itself in ``inferq:{Q}:fleet`` (start time, attempts
  run, their backend seconds and output tokens: the run time and throughput the scaler sizes by) and reads the
  scaler's drain target (``target`` in ``inferq:{Q}:scale``). The live workers in start order, oldest first: the
  first ``target`` pull; the others are surplus: they take no new job, finish what they hold and, idle, drop their
  ECS scale-in protection, so a lower desired count takes effect while work keeps coming (new work packs onto the
  workers that pull). A surplus worker that the target takes back pulls again at once: no boot lost. No target, or one
  older than :data:`TARGET_STALE_S` (no scaler is running), and every worker pulls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from redis.exceptions import ResponseError

from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.keys import GROUP, WEBHOOK_GROUP
from inferq.queue.protocol import Delivery, Outcome, Queue, Skipped
from inferq.redis.batching import Batcher
from inferq.redis.faults import Fault, FaultRun, is_recoverable

from .leases import InFlight
from .metrics import WorkerMetrics
from .protection import TaskProtection
from .window import Window

log = logging.getLogger("gpu_worker.worker")  # the worker's own logger: moving code here changes no log line

T = TypeVar("T")

READ_BATCH = 256
"""Most entries taken per read. With a window larger than this, the next batch is read and started while the
previous one is still being finished, so the worker's CPU and Redis's work overlap."""
MAINTENANCE_S = 0.5
HEARTBEAT_S = 1.0
PRUNE_EVERY_S = 300.0
GONE_AFTER_S = 3600.0
TARGET_STALE_S = 600.0
"""A drain target older than this is ignored: the scaler that wrote it is gone, and a fleet that nobody sizes must
not keep workers idle."""


def surplus(fleet: dict[str, str], beats: dict[str, str], me: str, target: int | None, now_ms: float,
            stale_ms: float) -> bool:
    """Whether worker ``me`` is beyond the drain target: the live workers (a fresh heartbeat, or ``me``) in start
    order, oldest first, ties by id; the first ``target`` of them pull. Every worker computes the same order from
    the same hashes, so they agree on who drains without talking to each other."""
    if target is None:
        return False
    order = []
    for worker, record in fleet.items():
        beat = beats.get(worker)
        fresh = beat is not None and now_ms - int(beat.split(" ", 1)[0]) <= stale_ms
        if worker == me or fresh:
            order.append((int(record.split(" ", 1)[0]), worker))
    order.sort()
    rank = next((i for i, (_, worker) in enumerate(order) if worker == me), len(order))
    return rank >= target


class Pulling:
    """The pull loop and the maintenance task of a worker."""

    id: str
    settings: Settings
    queue: Queue
    reader: Queue
    window: Window
    metrics: WorkerMetrics
    protection: TaskProtection | None
    block_ms: int
    _in_flight: dict[str, InFlight]  # by Delivery.key: entry ids are per lane
    _settling: int  # of those, the jobs whose backend call is over and whose outcome is being written
    _suspects: set[str]
    _next_reclaim: float
    _slot_freed: asyncio.Event
    _stopping: asyncio.Event
    _finishes: Batcher[tuple[Delivery, JobStatus, Any, Any], Outcome]
    # drain when surplus (set up on first use, so the worker's constructor needs nothing of it)
    _surplus: bool = False
    _started_ms: int | None = None
    _resumed: asyncio.Event | None = None

    if TYPE_CHECKING:  # the worker's, used here

        async def _run_job(self, job: InFlight) -> None: ...

        async def _retrying(self, write: Callable[[], Awaitable[T]]) -> T | None: ...

    def _count_fault(self, fault: Fault) -> None:
        self.metrics.redis_errors.inc()

    def _faults(self, what: str, *, cap_s: float = 2.0) -> FaultRun:
        """The fault bookkeeping of one of this worker's loops (see :class:`inferq.redis.faults.FaultRun`)."""
        return FaultRun(what, log, on_fault=self._count_fault, clients=[self.queue.redis, self.reader.redis],
                        cap_s=cap_s)

    # ------------------------------------------------------------------ pulling

    async def _pull(self, until_idle: bool) -> None:
        reclaim_every_s = min(self.settings.claim_idle_ms / 2000.0, 5.0)
        faults = self._faults("cannot read from Redis")
        # run-until-idle checks for idleness after each empty read: keep those reads short
        block_ms = min(self.block_ms, 100) if until_idle else self.block_ms
        while not self._stopping.is_set():
            if self._surplus:  # beyond the drain target: take nothing new until it takes this worker back
                await _first(self._resumed_event().wait(), self._stopping.wait())
                continue
            free = self._free_slots()
            if free <= 0:
                self._slot_freed.clear()
                await _first(self._slot_freed.wait(), self._stopping.wait())
                continue
            try:
                if time.monotonic() >= self._next_reclaim and not self._suspects:
                    self._next_reclaim = time.monotonic() + reclaim_every_s
                    await self._reclaim(free)
                    free = self._free_slots()
                    if free <= 0:
                        continue
                got, skipped = await self.reader.read(self.id, min(free, READ_BATCH), block_ms)
                faults.succeeded()
            except Exception as exc:  # absorb() re-raises what is not a Redis fault: the pull dies
                await _first(asyncio.sleep(await faults.absorb(exc)), self._stopping.wait())
                continue
            if self._stopping.is_set() and got:
                for delivery in got:  # read while stopping: give them straight back
                    await self._release(delivery)
                self._count_skipped(skipped)
                break
            if self._surplus and got:
                for delivery in got:  # read as the worker turned surplus: back to the workers that pull
                    await self._release(delivery)
                self._count_skipped(skipped)
                continue
            self._start(got, skipped)
            if until_idle and not got and not skipped and not self._in_flight and await self._idle():
                return

    def _engine_slots(self) -> int:
        """The jobs the window counts: those whose backend call is not over yet."""
        return len(self._in_flight) - self._settling

    def _free_slots(self) -> int:
        """How many more jobs the worker may take now.

        The window bounds the jobs at the model server. A job whose backend call is over no longer takes a slot
        there while its outcome is written: the next job is pulled and sent meanwhile, so the engine's slot is
        refilled one Redis round trip sooner (the write of the outcome is off the refill path). Writes that cannot
        keep up must not let the worker take ever more, so it holds at most twice its window in all: jobs at the
        server and jobs whose outcome is still being written together."""
        size = self.window.size
        return min(size - self._engine_slots(), 2 * size - len(self._in_flight))

    async def _reclaim(self, free: int) -> None:
        """Take over idle entries one at a time, and stop at the first suspect.

        A reclaimed job was delivered before and never finished: its worker died or hung, maybe because of this
        very job (a poison request that crashes the model server). Such a suspect runs as the only suspect on
        this worker. So a poison job meets fresh jobs only, and each of those dies with it at most once, then
        runs as a suspect itself, never again beside the poison: innocent jobs are never dead-lettered for
        another job's crashes (with INFERQ_MAX_DELIVERIES >= 2), and the poison alone reaches the limit."""
        for _ in range(free):
            got, skipped = await self.queue.reclaim(self.id, 1)
            self._start(got, skipped)
            if self._suspects or not (got or skipped):
                return

    async def _release(self, delivery: Delivery) -> None:
        await self._retrying(lambda: self.queue.release(delivery))

    async def _idle(self) -> bool:
        if self._in_flight or not self._finishes.idle:
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

    def _start(self, deliveries: list[Delivery], skipped: list[Skipped]) -> None:
        self._count_skipped(skipped)
        if not deliveries:
            return
        now = time.time()
        for delivery in deliveries:
            job = InFlight(delivery)
            self._in_flight[delivery.key] = job
            if delivery.job.deliveries > 1:
                self._suspects.add(delivery.key)
            job.task = asyncio.create_task(self._run_job(job))
            if delivery.reclaimed:
                self.metrics.reclaimed.inc()
            self.metrics.queue_wait.observe(max(0.0, now - delivery.job.created_at))
        self._occupancy_changed()

    def _window_changed(self, old: int, new: int) -> None:
        self.metrics.window.set(new)
        log.debug("window %d -> %d", old, new)
        if new > old:
            self._slot_freed.set()  # the pull loop may be waiting for a slot: there are more now

    def _occupancy_changed(self) -> None:
        self.metrics.in_flight.set(len(self._in_flight))
        if self.protection:
            self.protection.set_busy(bool(self._in_flight))

    # ------------------------------------------------------------------ drain when surplus

    def _resumed_event(self) -> asyncio.Event:
        if self._resumed is None:
            self._resumed = asyncio.Event()
        return self._resumed

    def _run_totals(self) -> tuple[int, float, int]:
        """Attempts run, their backend seconds (the worker's own run-time histogram) and the output tokens the model
        server produced for them."""
        labels = {"queue": self.settings.queue}
        count = self.metrics.registry.get_sample_value("inferq_worker_run_seconds_count", labels) or 0.0
        total = self.metrics.registry.get_sample_value("inferq_worker_run_seconds_sum", labels) or 0.0
        tokens = self.metrics.registry.get_sample_value("inferq_worker_output_tokens_total", labels) or 0.0
        return int(count), float(total), int(tokens)

    async def _check_fleet(self) -> None:
        """Record this worker in the fleet hash and follow the scaler's drain target (module docstring)."""
        now_ms = time.time() * 1000
        if self._started_ms is None:
            self._started_ms = int(now_ms)
        runs, run_s, tokens = self._run_totals()
        keys = self.queue.keys
        async with self.queue.redis.pipeline(transaction=False) as pipe:
            pipe.hset(keys.fleet, self.id, f"{self._started_ms} {runs} {run_s:.3f} {tokens}")
            pipe.hgetall(keys.fleet)
            pipe.hgetall(keys.workers)
            pipe.hmget(keys.scale, ["target", "at"])
            _, fleet, beats, (raw_target, raw_at) = await pipe.execute()
        target: int | None = None
        try:
            if raw_target not in (None, "") and now_ms / 1000 - float(raw_at or 0) <= TARGET_STALE_S:
                target = max(int(raw_target), 0)
        except ValueError:
            target = None  # a damaged field: every worker pulls
        stale_ms = max(3 * self.settings.claim_idle_ms, 15000)
        self._set_surplus(surplus(fleet, beats, self.id, target, now_ms, stale_ms))

    def _set_surplus(self, value: bool) -> None:
        if value == self._surplus:
            return
        self._surplus = value
        resumed = self._resumed_event()
        if value:
            resumed.clear()
            log.info("beyond the scaler's drain target: taking no new jobs, finishing %d", len(self._in_flight))
        else:
            resumed.set()
            log.info("within the scaler's drain target again: pulling")

    async def _leave_fleet(self) -> None:
        await self.queue.redis.hdel(self.queue.keys.fleet, self.id)

    # ------------------------------------------------------------------ maintenance

    async def _maintain(self, stop: asyncio.Event) -> None:
        """Heartbeat (with the in-flight count), promotion of retries whose backoff is over, expiry of jobs past their
        ``ttl_s`` that no attempt started (a full window would otherwise keep them queued), and now and then the
        removal of what dead workers left behind."""
        last_beat = 0.0
        last_prune = time.monotonic()
        faults = self._faults("maintenance failed")
        while not stop.is_set():
            delay = MAINTENANCE_S
            try:
                if time.monotonic() - last_beat >= HEARTBEAT_S:
                    await self.queue.heartbeat(self.id, len(self._in_flight))
                    await self._check_fleet()
                    last_beat = time.monotonic()
                for _ in range(10):
                    if await self.queue.promote(limit=100) < 100:
                        break
                await self.queue.expire_due(limit=100)
                if time.monotonic() - last_prune >= PRUNE_EVERY_S:
                    last_prune = time.monotonic()
                    await self._prune()
                faults.succeeded()
            except Exception as exc:  # absorb() re-raises what is not a Redis fault: the task dies
                delay = max(delay, await faults.absorb(exc))
            await asyncio.sleep(delay)

    async def _prune(self, *, gone_after_s: float = GONE_AFTER_S) -> None:
        """Forget workers killed without a goodbye: heartbeats older than ``gone_after_s``, and group consumers
        idle that long holding nothing (a consumer with pending entries is never removed: that would strand
        them; a live worker that is removed is simply recreated by its next read)."""
        redis = self.queue.redis
        now_ms = time.time() * 1000
        beats = await redis.hgetall(self.queue.keys.workers)
        stale = [w for w, beat in beats.items() if now_ms - int(beat.split(" ", 1)[0]) > gone_after_s * 1000]
        if stale:
            await redis.hdel(self.queue.keys.workers, *stale)
        records = await redis.hkeys(self.queue.keys.fleet)
        gone = [w for w in records if w != self.id and (w in stale or w not in beats)]
        if gone:
            await redis.hdel(self.queue.keys.fleet, *gone)
        for stream, group in (*((s, GROUP) for s in self.queue.keys.lane_streams), (self.queue.keys.events,
                                                                                   WEBHOOK_GROUP)):
            try:
                consumers = await redis.xinfo_consumers(stream, group)
            except ResponseError as exc:
                if "NOGROUP" not in str(exc) and "no such key" not in str(exc):
                    raise  # a fault (READONLY, BUSY, ...) for the caller's fault handling
                continue
            for consumer in consumers:
                name = consumer["name"]
                if name != self.id and not consumer["pending"] and consumer["idle"] > gone_after_s * 1000:
                    await redis.xgroup_delconsumer(stream, group, name)


async def _first(*aws: Awaitable[Any]) -> None:
    """Wait until the first of ``aws`` completes, cancelling the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
