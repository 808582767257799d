"""Work-based sizing through the real handler (moto ECS, real Valkey): what the scaler reads of the queue's
expected work and the workers' measured throughput, and the count it sets with and without
INFERQ_SCALE_TOKENS_PER_S."""

from __future__ import annotations

from typing import Any

import pytest
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions.scaler import app
from functions.scaler.scaler import fleet_figures
from inferq.queue.jobs import JobRequest
from inferq.queue.protocol import Queue

from .test_handler import CHAT, desired_count, scheduled, updates  # noqa: F401


async def enqueue(queue: Queue, n: int, max_tokens: int) -> None:
    for _ in range(n):
        await queue.enqueue("tenant-a", JobRequest(body={**CHAT, "max_tokens": max_tokens}))


async def test_the_scaler_reads_the_backlogs_tokens_and_the_live_workers_throughput(queue: Queue) -> None:
    queue.settings = queue.settings.replace(scale_tokens_per_s=100.0)  # the gateway keeps the counter while it is on
    assert await fleet_figures(queue) == (0, None, 0, None)  # nothing yet: no run time, no throughput
    await enqueue(queue, 3, 100)
    keys = queue.keys
    await queue.redis.hset(keys.fleet, mapping={
        "w1": "1000 10 40.000 800",  # 10 attempts, 40 backend seconds, 800 tokens
        "w2": "1001 10 20.000 1200",
        "w3": "1002 5 10.000",  # an older worker's record: run time, no tokens
        "gone": "999 100 100.000 100000",  # no heartbeat: not counted
        "odd": "1003 x y z",
    })
    await queue.redis.hset(keys.workers, mapping={w: "1 0" for w in ("w1", "w2", "w3", "odd")})
    enqueued, job_s, tokens, slot_rate = await fleet_figures(queue)
    assert (enqueued, tokens) == (3, 300)
    assert job_s == pytest.approx(70.0 / 25)
    assert slot_rate == pytest.approx(2000 / 60.0)


async def test_without_the_setting_the_job_counts_size_the_fleet(queue: Queue, ecs: Any,
                                                                 updates: list[int]) -> None:  # noqa: F811
    await enqueue(queue, 20, 16)  # 20 short jobs: 320 tokens
    app.handler(scheduled(), LambdaContext())
    assert desired_count(ecs) == 3 and updates == [3]  # ceil(20 / 8), as the contract says


async def test_with_the_setting_short_work_starts_one_worker_and_long_work_the_job_counts(
    queue: Queue, ecs: Any, updates: list[int], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.setenv("INFERQ_SCALE_TOKENS_PER_S", "100")
    app.reset()
    queue.settings = queue.settings.replace(scale_tokens_per_s=100.0)  # the gateway's, set from the same parameter
    await enqueue(queue, 20, 16)  # 320 tokens: 3.2 s of one worker's work, far under a 120 s boot
    answer = app.handler(scheduled(), LambdaContext())
    assert desired_count(ecs) == 1 and updates == [1], answer
    recorded = await queue.scale_state()
    assert recorded["target"] == "1"
    await enqueue(queue, 20, 4000)  # 80,000 tokens more: 800 s of one worker's work
    app.handler(scheduled(), LambdaContext())
    assert desired_count(ecs) == 4 and updates == [1, 4]  # max 4: the job counts (40 / 8 = 5) and the work agree
