"""The settler alone (gpu_worker/outcomes.py) against a real Valkey: each kind of outcome written as the queue
expects it, finishes that end together in one round trip, and a full Redis waited out until memory is freed, or
until the deadline, after which the entry stays pending for another worker to reclaim (G8)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulator.valkey import ValkeyProcess
from gpu_worker.outcomes import Settle, succeeded
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Delivery, Outcome, Queue
from inferq.redis.faults import Fault
from tests.support.queued import read_all
from tests.support.waiting import eventually_async

from .support import chat, settler_for, submit


async def taken(queue: Queue, count: int = 1) -> list[Delivery]:
    """``count`` jobs submitted and read by a worker ``w``: what a settler is handed."""
    for i in range(count):
        await submit(queue, chat(f"q{i}"))
    got, _ = await read_all(queue, "w", count)
    assert len(got) == count
    return got


async def test_finishes_that_end_together_are_written_in_one_round_trip(settings: Settings, queue: Queue) -> None:
    deliveries = await taken(queue, 5)
    writes: list[int] = []
    write = queue.finish_many

    async def counted(items: list[Any]) -> Any:
        writes.append(len(items))
        return await write(items)

    queue.finish_many = counted  # type: ignore[method-assign]
    settler = settler_for(settings, queue)
    outcomes = await asyncio.gather(*(settler.settle(d, succeeded({"status_code": 200, "body": {"n": i}}))
                                      for i, d in enumerate(deliveries)))
    assert outcomes == [Outcome.WRITTEN] * 5 and writes == [5] and settler.idle
    for i, delivery in enumerate(deliveries):
        job = await queue.get(delivery.job.id)
        assert job is not None and job.status is JobStatus.SUCCEEDED and job.result == {"status_code": 200,
                                                                                        "body": {"n": i}}
    failed = Settle("finish", JobStatus.FAILED, error={"type": "model_error", "message": "400"})
    assert await settler.settle(deliveries[0], failed) is Outcome.DUPLICATE  # already ended: nothing changes
    assert settler.metrics.duplicates._value.get() == 1


async def test_a_retry_waits_out_its_backoff_and_a_poison_job_alone_at_the_engine_is_dead_lettered(
    settings: Settings, queue: Queue
) -> None:
    retried, poison = await taken(queue, 2)
    settler = settler_for(settings.replace(retry_base_ms=60_000, retry_max_ms=60_000), queue)
    error = {"type": "backend_error", "message": "503"}
    assert await settler.settle(retried, Settle("retry", error=error)) is Outcome.RETRY_SCHEDULED
    assert await queue.redis.zscore(queue.keys.delayed, retried.job.id) is not None
    record = await queue.get(retried.job.id)
    assert record is not None and record.status is JobStatus.QUEUED and record.attempts == 2  # the next one
    assert json.loads(await queue.redis.hget(queue.keys.job(retried.job.id), "last_error")) == error
    died = {"type": "engine_died", "message": "the model server died"}
    assert await settler.settle(poison, Settle("poison", error=died, strikes=1)) is Outcome.DEAD_LETTERED
    dead = await queue.get(poison.job.id)
    assert dead is not None and dead.dead_lettered and dead.error == died
    assert [f["reason"] for _, f in await queue.redis.xrange(queue.keys.dlq)] == ["engine_died"]


async def test_a_release_gives_the_job_back_unspent_and_a_drop_writes_nothing(settings: Settings,
                                                                                queue: Queue) -> None:
    released, dropped = await taken(queue, 2)
    settler = settler_for(settings, queue)
    assert await settler.settle(released, Settle("release")) is Outcome.RELEASED
    back = await queue.get(released.job.id)
    assert back is not None and back.status is JobStatus.QUEUED and back.deliveries == 0
    assert await settler.settle(dropped, Settle("drop")) is None
    still = await queue.get(dropped.job.id)
    assert still is not None and still.status is JobStatus.RUNNING
    observation = await queue.observe()
    assert observation.lag == 1 and observation.pending == 1  # the dropped entry waits for its owner or a reclaim


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    """A server of its own: these tests fill it up."""
    with ValkeyProcess(tmp_path / "valkey", appendfsync=None) as valkey:
        yield valkey


@pytest.fixture
async def own_queue(server: ValkeyProcess) -> Any:
    settings = Settings(redis_url=server.url, queue="q" + uuid.uuid4().hex[:8], retry_base_ms=0, redis_timeout_s=1.0)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    yield queue
    await queue.close()


async def test_a_full_redis_is_waited_out_and_the_finish_written_once_memory_is_freed(
    server: ValkeyProcess, own_queue: Queue
) -> None:
    queue = own_queue
    [delivery] = await taken(queue)
    seen: list[Fault] = []
    settler = settler_for(queue.settings, queue, seen)
    server.set_maxmemory("1")
    try:
        write = asyncio.create_task(settler.settle(delivery, succeeded({"status_code": 200, "body": {}})))
        await eventually_async(lambda: _true(len(seen) >= 2), what="the write to be refused and tried again")
        assert not write.done() and set(seen) == {Fault.CAPACITY}
    finally:
        server.set_maxmemory("0")
    assert await asyncio.wait_for(write, 10) is Outcome.WRITTEN
    job = await queue.get(delivery.job.id)
    assert job is not None and job.status is JobStatus.SUCCEEDED


async def test_past_its_deadline_a_write_gives_up_and_the_entry_stays_pending_for_a_reclaim(
    server: ValkeyProcess, own_queue: Queue
) -> None:
    queue = own_queue
    [delivery] = await taken(queue)
    settler = settler_for(queue.settings, queue)
    settler.deadline = time.monotonic()  # the shutdown grace is over
    server.set_maxmemory("1")
    try:
        assert await settler.settle(delivery, succeeded({"status_code": 200, "body": {}})) is None
    finally:
        server.set_maxmemory("0")
    job = await queue.get(delivery.job.id)
    assert job is not None and job.status is JobStatus.RUNNING
    assert (await queue.observe()).pending == 1


async def _true(value: bool) -> bool:
    return value
