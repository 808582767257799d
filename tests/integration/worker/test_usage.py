"""What a worker reports for usage (gpu_worker/runner.py, outcomes.py), against a real Valkey with the mock backend:
each attempt's run time and share of the worker's busy time go with the write that ends it, the tokens of the
answer's ``usage`` with a success, and the tenant's usage then counts every job once: by status, with the tokens of
its result, the run time of all its attempts (a retried one's first attempt too, a released one's), and a GPU
share that never exceeds its run time."""

from __future__ import annotations

import asyncio
import time

from gpu_worker.backends.mock import MockBackend
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.protocol import Queue
from inferq.usage.report import Row, Source, usage

from .support import chat, running_worker, status_is, terminal


async def rows(queue: Queue) -> dict[str, Row]:
    now = time.time()
    found = await usage([Source(queue.redis, queue.keys, None, 1.0)], now - 3600, now + 3600)
    return {row.tenant: row for row in found}


async def test_two_tenants_jobs_are_counted_with_their_tokens_and_time(settings: Settings, queue: Queue) -> None:
    settings = settings.replace(window=4, retry_base_ms=0, retry_max_ms=0)
    submitted: dict[str, list[str]] = {"a": [], "b": []}
    for tenant, count in (("a", 3), ("b", 2)):
        for i in range(count):
            job, _ = await queue.enqueue(tenant, JobRequest(body=chat(f"{tenant} says {'word ' * i}", latency_ms=60)))
            submitted[tenant].append(job.id)
    failed, _ = await queue.enqueue("b", JobRequest(body=chat("no", fatal=True)))
    retried, _ = await queue.enqueue("a", JobRequest(body=chat("again", latency_ms=60, fail_attempts=1)))
    await Worker(settings, queue, MockBackend(queue.redis, queue.keys), webhooks=False, block_ms=50,
                 burst=True).run()

    results = {}
    for job_id in [*submitted["a"], *submitted["b"], failed.id, retried.id]:
        results[job_id] = await terminal(queue, job_id)
    found = await rows(queue)
    assert found["a"].jobs == [4, 0, 0, 0] and found["b"].jobs == [2, 1, 0, 0]
    for tenant, ids in (("a", [*submitted["a"], retried.id]), ("b", submitted["b"])):
        answers = [results[i].result["body"]["usage"] for i in ids]  # type: ignore[index]
        assert found[tenant].prompt_tokens == sum(u["prompt_tokens"] for u in answers) > 0
        assert found[tenant].completion_tokens == sum(u["completion_tokens"] for u in answers) > 0
    # every success ran its 60 ms at least (the retried one twice), and no job's GPU share exceeds its run time
    assert found["a"].run_ms >= 5 * 60 and found["b"].run_ms >= 2 * 60
    for row in found.values():
        assert 0 < row.gpu_ms <= row.run_ms


async def test_a_released_attempt_s_time_counts_when_the_job_ends_elsewhere(settings: Settings, queue: Queue) -> None:
    settings = settings.replace(window=2, drain_s=0)
    job, _ = await queue.enqueue("a", JobRequest(body=chat("long", latency_ms=400)))
    async with running_worker(settings, queue, webhooks=False, block_ms=50):
        await status_is(queue, job.id, "running")
        # not a wait for an event: the attempt runs at least this long before the worker stops and gives it back,
        # so its time is there to count (a slower machine only makes it longer)
        await asyncio.sleep(0.2)
    record = await queue.redis.hgetall(queue.keys.job(job.id))
    assert record["status"] == "queued" and int(record["run_ms"]) >= 150 and int(record["gpu_ms"]) >= 150

    await Worker(settings, queue, MockBackend(queue.redis, queue.keys), webhooks=False, block_ms=50,
                 burst=True).run()
    assert (await terminal(queue, job.id)).status is JobStatus.SUCCEEDED
    row = (await rows(queue))["a"]
    assert row.jobs == [1, 0, 0, 0] and row.run_ms >= int(record["run_ms"]) + 400
