"""A worker's place in the fleet (gpu_worker/fleet.py), alone against a real Valkey: the surplus order every worker
computes alike, the record the scaler sizes by, the drain target followed and a stale or damaged one ignored."""

from __future__ import annotations

import asyncio
import time

from gpu_worker.fleet import TARGET_STALE_S, Fleet, surplus
from gpu_worker.metrics import WorkerMetrics
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue


def test_surplus_follows_start_order_among_live_workers_only() -> None:
    now = 1_000_000.0
    fleet = {"a": "100 0 0", "b": "200 5 10.0", "c": "300 0 0", "dead": "50 0 0"}
    beats = {"a": f"{int(now)} 0", "b": f"{int(now)} 1", "c": f"{int(now)} 0", "dead": f"{int(now - 60_000)} 0"}
    assert [surplus(fleet, beats, w, 2, now, 15_000) for w in "abc"] == [False, False, True]
    assert [surplus(fleet, beats, w, None, now, 15_000) for w in "abc"] == [False, False, False]
    assert [surplus(fleet, beats, w, 0, now, 15_000) for w in "abc"] == [True, True, True]
    tie = {"x": "100 0 0", "y": "100 0 0"}
    assert surplus(tie, {"x": f"{int(now)} 0", "y": f"{int(now)} 0"}, "y", 1, now, 15_000)


def fleet_of(settings: Settings, queue: Queue, worker_id: str) -> Fleet:
    return Fleet(settings, queue, worker_id, WorkerMetrics(settings.queue, 1), held=lambda: 0)


async def test_the_newest_live_worker_beyond_the_target_drains_and_is_taken_back(settings: Settings,
                                                                                 queue: Queue) -> None:
    # started in this order (within one millisecond, the ids break the tie the same way)
    oldest, newest = fleet_of(settings, queue, "a-oldest"), fleet_of(settings, queue, "b-newest")
    for fleet in (oldest, newest):
        await queue.heartbeat(fleet.id, 0)
        await fleet.check()
    newest.metrics.run_time.observe(2.5)
    newest.metrics.output_tokens.inc(40)
    await queue.redis.hset(queue.keys.scale, mapping={"target": 1, "at": time.time()})
    await oldest.check()
    await newest.check()
    assert not oldest.surplus and newest.surplus
    started, runs, run_s, tokens = (await queue.redis.hget(queue.keys.fleet, "b-newest") or "").split(" ")
    assert (runs, run_s, tokens) == ("1", "2.500", "40") and int(started) > 0
    waiting = asyncio.create_task(newest.taken_back())
    await queue.redis.hset(queue.keys.scale, "target", 2)
    await newest.check()
    await asyncio.wait_for(waiting, 1)
    assert not newest.surplus
    await newest.leave()
    assert not await queue.redis.hexists(queue.keys.fleet, "b-newest")


async def test_a_stale_or_damaged_target_keeps_every_worker_pulling(settings: Settings, queue: Queue) -> None:
    fleet = fleet_of(settings, queue, "alone")
    await queue.redis.hset(queue.keys.scale, mapping={"target": 0, "at": time.time() - TARGET_STALE_S - 1})
    await fleet.check()
    assert not fleet.surplus
    await queue.redis.hset(queue.keys.scale, mapping={"target": "many", "at": time.time()})
    await fleet.check()
    assert not fleet.surplus
    await queue.redis.hset(queue.keys.scale, mapping={"target": 0, "at": time.time()})
    await fleet.check()
    assert fleet.surplus
