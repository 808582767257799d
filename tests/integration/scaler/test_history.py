"""Each scaler evaluation leaves one history sample (the console's charts), with what it observed and decided."""

from __future__ import annotations

from typing import Any

from functions.scaler import app
from inferq.queue.history import read_history
from inferq.queue.protocol import Queue

from .test_handler import LambdaContext, ecs, enqueue, scaler_env, scheduled  # noqa: F401


async def test_a_tick_appends_a_sample_of_the_counters_and_the_fleet(queue: Queue, ecs: Any) -> None:  # noqa: F811
    await enqueue(queue, 20)
    await queue.redis.hset(queue.keys.stats, mapping={"succeeded": 7, "latency_ms_total": 3500})
    app.handler(scheduled(), LambdaContext())
    (sample,) = await read_history(queue)
    assert sample["lag"] == 20 and sample["unfinished"] == 20 and sample["enqueued"] == 20
    assert sample["succeeded"] == 7 and sample["latency_ms_total"] == 3500
    assert sample["desired"] == 3 and sample["running"] is not None

    app.handler(scheduled(), LambdaContext())  # seconds later: within the spacing, no second sample
    assert len(await read_history(queue)) == 1


async def test_redis_down_costs_a_gap_not_the_tick(queue: Queue, ecs: Any, monkeypatch: Any) -> None:  # noqa: F811
    async def refuse(*_: Any, **__: Any) -> bool:
        raise ConnectionError("history write refused")

    monkeypatch.setattr("functions.scaler.scaler.record_sample", refuse)
    await enqueue(queue, 1)
    answer = app.handler(scheduled(), LambdaContext())
    assert answer["desired"] == 1 and answer["errors"] == []
    assert await read_history(queue) == []
