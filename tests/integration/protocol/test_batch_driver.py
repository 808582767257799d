"""The batch driver against real Valkey and moto's S3 (in process): crash safety of the line -> job step, the
status machine, and the output files, with this test acting as the worker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from functions.storage import FileStore
from inferq.batches.driver import QUEUE_SHARE, BatchDriver, PassReport
from inferq.batches.records import Batches, BatchStatus, new_file_id
from inferq.config.settings import Settings
from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.protocol import Queue
from inferq.queue.refusals import RetainedQuotaFull
from inferq.redis.scripting import Scripts
from tests.support.s3 import in_process_bucket

TENANT = "tenant-a"
BUCKET = "inferq-test-files"


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[FileStore]:
    with in_process_bucket(monkeypatch, BUCKET) as client:
        yield FileStore(BUCKET, client)


def lines(n: int) -> bytes:
    return b"".join(
        json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}}).encode() + b"\n"
        for i in range(n)
    )


async def new_batch(queue: Queue, store: FileStore, data: bytes, window: str = "24h") -> str:
    file_id = new_file_id()
    store.put(TENANT, file_id, data, "in.jsonl", "batch")
    batch = await Batches(queue).create(TENANT, file_id, "/v1/chat/completions", window, None)
    return batch.id


async def work_off(queue: Queue) -> int:
    """Act as a worker: run every queued job to success."""
    done = 0
    while True:
        deliveries, _ = await queue.read("test-worker", 500)
        if not deliveries:
            return done
        items: list[tuple[Any, JobStatus, Any, Any]] = [
            (d, JobStatus.SUCCEEDED, {"status_code": 200, "body": {"echo": d.job.body["messages"][0]["content"]}},
             None) for d in deliveries]
        await queue.finish_many(items)
        done += len(deliveries)


async def test_a_crash_between_enqueue_and_progress_never_makes_two_jobs_for_a_line(
    queue: Queue, store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = await new_batch(queue, store, lines(1200))
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()  # validating -> in_progress
    batches = Batches(queue)
    assert (await batches.get(batch_id)).status is BatchStatus.IN_PROGRESS  # type: ignore[union-attr]

    real = Scripts.__call__

    async def crash_on_progress(self: Scripts, name: str, keys: list[str], args: list[Any]) -> Any:
        if name == "advancebatch":
            raise ConnectionError("driver died after enqueueing its chunk")
        return await real(self, name, keys, args)

    monkeypatch.setattr(Scripts, "__call__", crash_on_progress)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            await driver.step(batch_id, PassReport())
    monkeypatch.undo()
    while (await batches.get(batch_id)).next_line < 1200:  # type: ignore[union-attr]
        await driver.step(batch_id, PassReport())

    stats = await queue.stats()
    assert stats["enqueued"] == 1200, "the chunk enqueued before each crash was replayed, not enqueued again"
    line_jobs = await queue.redis.hgetall(queue.keys.batch_lines(batch_id))
    assert len(line_jobs) == 1200 and len(set(line_jobs.values())) == 1200


async def test_a_batch_runs_to_completed_with_its_output_in_file_order(queue: Queue, store: FileStore) -> None:
    batch_id = await new_batch(queue, store, lines(50) + b"\n")  # a trailing blank line is no request
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()
    await driver.run_once()
    assert await work_off(queue) == 50
    await driver.run_once()  # -> finalizing, output written -> completed
    batch = await Batches(queue).get(batch_id, TENANT)
    assert batch is not None and batch.status is BatchStatus.COMPLETED
    assert (batch.total, batch.completed, batch.failed) == (50, 50, 0)
    assert batch.error_file_id is None and batch.output_file_id
    output = [json.loads(x) for x in b"".join(store.chunks(TENANT, batch.output_file_id)).splitlines()]
    assert [x["custom_id"] for x in output] == [f"c{i}" for i in range(50)]
    assert output[3]["response"] == {"status_code": 200, "request_id": output[3]["response"]["request_id"],
                                     "body": {"echo": "q3"}}
    assert not await queue.redis.zscore(queue.keys.batches_active, batch_id)
    assert await queue.redis.ttl(queue.keys.batch(batch_id)) > 0


async def test_at_zero_workers_a_full_queue_holds_the_batch_back_and_leaves_room_for_submits(
    valkey: Any, queue_name: str, store: FileStore
) -> None:
    settings = Settings(redis_url=valkey.url, queue=queue_name, max_queue_depth=30)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    try:
        batch_id = await new_batch(queue, store, lines(100))
        driver = BatchDriver(queue, store, settings)
        for _ in range(3):
            await driver.run_once()
        batch = await Batches(queue).get(batch_id)
        assert batch is not None and batch.status is BatchStatus.IN_PROGRESS
        assert batch.next_line == 30 * QUEUE_SHARE, "batches fill their share of the queue's depth, no more"
        for i in range(int(30 * (1 - QUEUE_SHARE))):  # another tenant's submits still find room: no 429
            await queue.enqueue("tenant-b", JobRequest(body={"messages": [{"role": "user", "content": str(i)}]}))
        await work_off(queue)
        for _ in range(10):
            await driver.run_once()
            await work_off(queue)
        batch = await Batches(queue).get(batch_id)
        assert batch is not None and batch.status is BatchStatus.COMPLETED and batch.completed == 100
    finally:
        await queue.close()


async def test_advancing_and_moving_a_batch_are_safe_to_resend(queue: Queue, store: FileStore) -> None:
    batch_id = await new_batch(queue, store, lines(3))
    keys = [queue.keys.batch(batch_id), queue.keys.batch_lines(batch_id)]
    first = await queue.scripts("advancebatch", keys, [0, 2, 99, 0, "job_a", 1, "job_b"])
    again = await queue.scripts("advancebatch", keys, [0, 2, 99, 0, "job_a", 1, "job_b"])
    assert first == again == 1
    assert await queue.scripts("advancebatch", keys, [1, 3, 120, 2, "job_c"]) == 0  # someone else's view: dropped
    batches = Batches(queue)
    args = ("validating", "in_progress")
    assert await queue.scripts("movebatch", keys[:1], [",".join(args), "cancelling"]) == [1, "cancelling"]
    assert await queue.scripts("movebatch", keys[:1], [",".join(args), "cancelling"]) == [1, "cancelling"]
    assert await batches.move(batch_id, (BatchStatus.IN_PROGRESS,), BatchStatus.FINALIZING) is False
    assert await queue.scripts("movebatch", [queue.keys.batch("batch_none")], ["a", "b"]) == [-1]


async def test_an_ended_batch_is_charged_to_its_tenant_and_a_tenant_at_its_quota_creates_none(
    queue: Queue, store: FileStore
) -> None:
    """G11: what an ended batch leaves behind (its record, its lines, its index entry) is charged to its tenant like
    an ended job's record, once, until the tenant's index forgets it; at INFERQ_TENANT_MAX_RETAINED_BYTES the tenant
    creates no batch (429 quota_exceeded at the gateway) -- else creating and cancelling batches at the rate limit
    would leave a record a batch behind, kept a day, that no bound counts."""
    file_id = new_file_id()
    store.put(TENANT, file_id, lines(20), "in.jsonl", "batch")
    batches = Batches(queue)
    metadata = {f"k{i}": "v" * 512 for i in range(16)}
    batch = await batches.create(TENANT, file_id, "/v1/chat/completions", "24h", metadata)
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()
    await driver.run_once()
    assert await work_off(queue) == 20
    jobs_charge = int(await queue.redis.hget(queue.keys.bounds, f"{TENANT}|kept") or 0)
    await driver.run_once()  # -> completed, retired
    assert (await batches.get(batch.id, TENANT)).status is BatchStatus.COMPLETED  # type: ignore[union-attr]
    held = int(await queue.redis.hget(queue.keys.batch(batch.id), "held") or 0)
    kept = int(await queue.redis.hget(queue.keys.bounds, f"{TENANT}|kept") or 0)
    assert kept - jobs_charge == held > 0
    costs = [int(await queue.redis.memory_usage(k, samples=0) or 0)
             for k in (queue.keys.batch(batch.id), queue.keys.batch_lines(batch.id))]
    assert held >= sum(costs) + 128, (held, costs)  # and the index entry
    until_hour = (batch.created_at + batches.index_keep_s()) * 1000 // 3_600_000
    assert int(await queue.redis.hget(queue.keys.bounds, f"{TENANT}|{until_hour}") or 0) >= held

    await driver._retire(batch.id)  # a retire done again (a driver that died after it) charges nothing more
    assert int(await queue.redis.hget(queue.keys.bounds, f"{TENANT}|kept") or 0) == kept

    queue.settings = queue.settings.replace(tenant_max_retained_bytes=kept)
    with pytest.raises(RetainedQuotaFull) as refused:
        await Batches(queue).create(TENANT, file_id, "/v1/chat/completions", "24h", None)
    assert 0 < refused.value.retry_after_s <= 3600
    queue.settings = queue.settings.replace(tenant_max_retained_bytes=kept + 1)
    assert await Batches(queue).create(TENANT, file_id, "/v1/chat/completions", "24h", None)
