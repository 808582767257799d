"""The queue's upkeep (gpu_worker/maintenance.py), alone against a real Valkey: the heartbeat with the jobs held,
due retries promoted, and pruning that forgets dead workers but never a consumer holding entries."""

from __future__ import annotations

import asyncio
import time

from gpu_worker.fleet import Fleet
from gpu_worker.maintenance import Maintenance
from gpu_worker.metrics import WorkerMetrics
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.keys import GROUP
from inferq.queue.protocol import Queue

from .support import chat, counting_faults, submit


def maintenance_of(settings: Settings, queue: Queue, worker_id: str, held: int = 0) -> Maintenance:
    fleet = Fleet(settings, queue, worker_id, WorkerMetrics(settings.queue, 1), held=lambda: held)
    return Maintenance(queue, worker_id, fleet, held=lambda: held, faults=counting_faults(queue, []))


async def test_the_heartbeat_says_how_many_jobs_are_held_and_records_the_worker_in_the_fleet(
    settings: Settings, queue: Queue
) -> None:
    await maintenance_of(settings, queue, "beater", held=3).beat()
    beat = await queue.redis.hget(queue.keys.workers, "beater")
    assert beat is not None and beat.endswith(" 3")
    assert await queue.redis.hexists(queue.keys.fleet, "beater")
    assert (await queue.observe()).in_flight == 3


async def test_a_retry_whose_backoff_is_over_is_promoted_back_into_its_lane(settings: Settings,
                                                                             queue: Queue) -> None:
    job = await submit(queue, chat("x"))
    [delivery], _ = await queue.read("w", 1)
    await queue.retry(delivery, delay_ms=1, error={"type": "backend_error", "message": "503"},
                      now=int(time.time() * 1000) - 1000)
    assert (await queue.observe()).delayed == 1
    await maintenance_of(settings, queue, "keeper").promote_and_expire()
    observation = await queue.observe()
    assert observation.delayed == 0 and observation.lag == 1
    record = await queue.get(job.id)
    assert record is not None and record.status is JobStatus.QUEUED


async def test_pruning_forgets_dead_workers_but_never_a_consumer_holding_entries(
    settings: Settings, queue: Queue
) -> None:
    await queue.read("gone-idle", 1)  # a consumer that holds nothing
    await submit(queue, chat("held"))
    await queue.read("gone-holding", 1)  # a consumer that died holding an entry
    now_ms = int(time.time() * 1000)
    await queue.heartbeat("gone-idle", 0, now=now_ms - 10_000)
    # not a wait for an event: a consumer's idle time is the server's clock, which only passing time moves
    await asyncio.sleep(0.4)
    await queue.heartbeat("alive", 0)
    await queue.redis.hset(queue.keys.fleet, mapping={"gone-idle": f"{now_ms} 0 0 0", "alive": f"{now_ms} 0 0 0"})
    await maintenance_of(settings, queue, "pruner").prune(gone_after_s=0.3)
    consumers = {c["name"] for c in await queue.redis.xinfo_consumers(queue.keys.stream, GROUP)}
    assert consumers == {"gone-holding"}
    assert set(await queue.redis.hkeys(queue.keys.workers)) == {"alive"}
    assert set(await queue.redis.hkeys(queue.keys.fleet)) == {"alive"}
