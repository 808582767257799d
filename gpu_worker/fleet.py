"""Drain when surplus: a worker's place in the fleet, and the scaler's drain target it follows.

With each heartbeat the worker records itself in ``inferq:{Q}:fleet`` (start time, attempts run, their backend
seconds and output tokens: the run time and throughput the scaler sizes by) and reads the scaler's drain target
(``target`` in ``inferq:{Q}:scale``). The live workers in start order, oldest first: the first ``target`` pull; the
others are surplus: they take no new job, finish what they hold and, idle, drop their ECS scale-in protection, so
a lower desired count takes effect while work keeps coming (new work packs onto the workers that pull). A surplus
worker that the target takes back pulls again at once: no boot lost. No target, or one older than
:data:`TARGET_STALE_S` (no scaler is running), and every worker pulls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from inferq.config.settings import Settings
from inferq.queue.protocol import Queue

from .metrics import WorkerMetrics

log = logging.getLogger("gpu_worker.worker")  # the worker's own logger: moving code here changes no log line

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


class Fleet:
    """One worker's record in the fleet hash and its surplus state. ``held()`` is how many jobs it holds (for the
    log line when it turns surplus)."""

    def __init__(self, settings: Settings, queue: Queue, worker_id: str, metrics: WorkerMetrics,
                 held: Callable[[], int]) -> None:
        self.settings = settings
        self.queue = queue
        self.id = worker_id
        self.metrics = metrics
        self._held = held
        self._started_ms: int | None = None
        self._surplus = False
        self._taken_back = asyncio.Event()

    @property
    def surplus(self) -> bool:
        """Beyond the drain target: take nothing new until :meth:`taken_back`."""
        return self._surplus

    async def taken_back(self) -> None:
        """Until the target takes this worker back (at once when it is not surplus)."""
        if self._surplus:
            await self._taken_back.wait()

    def run_totals(self) -> tuple[int, float, int]:
        """Attempts run, their backend seconds (the worker's own run-time histogram) and the output tokens the model
        server produced for them."""
        labels = {"queue": self.settings.queue}
        registry = self.metrics.registry
        count = registry.get_sample_value("inferq_worker_run_seconds_count", labels) or 0.0
        total = registry.get_sample_value("inferq_worker_run_seconds_sum", labels) or 0.0
        tokens = registry.get_sample_value("inferq_worker_output_tokens_total", labels) or 0.0
        return int(count), float(total), int(tokens)

    async def check(self) -> None:
        """Record this worker in the fleet hash and follow the scaler's drain target (module docstring)."""
        now_ms = time.time() * 1000
        if self._started_ms is None:
            self._started_ms = int(now_ms)
        runs, run_s, tokens = self.run_totals()
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
        if value:
            self._taken_back.clear()
            log.info("beyond the scaler's drain target: taking no new jobs, finishing %d", self._held())
        else:
            self._taken_back.set()
            log.info("within the scaler's drain target again: pulling")

    async def leave(self) -> None:
        await self.queue.redis.hdel(self.queue.keys.fleet, self.id)
