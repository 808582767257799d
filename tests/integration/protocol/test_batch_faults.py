"""The batch driver when things go wrong, against real Valkey and moto's S3 (in process), this test acting as the
worker: one batch's faults stay with it, lines obey a submit's limits, outcomes outlive the result TTL, and a
finalisation killed at any step is finished exactly once by the next driver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from functions.storage import FileStore
from inferq.batches import driver as batch_driver
from inferq.batches.driver import BatchDriver
from inferq.batches.records import Batches, BatchStatus, new_file_id
from inferq.config.settings import Settings
from inferq.queue import claimcheck
from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.protocol import Queue
from tests.support.queued import read_all
from tests.support.s3 import in_process_bucket

BUCKET = "inferq-test-batch-faults"


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[FileStore]:
    with in_process_bucket(monkeypatch, BUCKET) as client:
        yield FileStore(BUCKET, client)


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_driver, "FAULT_BACKOFF_S", 0.0)


@pytest.fixture
async def make_queue(valkey: Any, queue_name: str) -> Any:
    opened: list[Queue] = []

    async def make(**overrides: Any) -> Queue:
        queue = Queue.connect(Settings(redis_url=valkey.url, queue=queue_name, **overrides))
        await queue.ensure_groups()
        opened.append(queue)
        return queue

    yield make
    for queue in opened:
        await queue.close()


def request_line(i: int, content: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": content or f"q{i}"}], **extra}}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


async def new_batch(queue: Queue, store: FileStore, data: bytes, tenant: str = "tenant-a", window: str = "24h") -> str:
    file_id = new_file_id()
    store.put(tenant, file_id, data, "in.jsonl", "batch")
    return (await Batches(queue).create(tenant, file_id, "/v1/chat/completions", window, None)).id


async def work_off(queue: Queue, limit: int = 10_000) -> int:
    """Act as a worker: run up to ``limit`` queued jobs to success, echoing the request's size."""
    done = 0
    while done < limit:
        deliveries, _ = await queue.read("test-worker", min(500, limit - done))
        if not deliveries:
            break
        await queue.finish_many([(d, JobStatus.SUCCEEDED, {"status_code": 200, "body": {"job": d.job.id}}, None)
                                 for d in deliveries])
        done += len(deliveries)
    return done


def file_lines(store: FileStore, tenant: str, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in b"".join(store.chunks(tenant, file_id)).splitlines() if x.strip()]


async def batch_of(queue: Queue, batch_id: str) -> Any:
    batch = await Batches(queue).get(batch_id)
    assert batch is not None
    return batch


async def test_a_batch_whose_input_file_vanishes_fails_alone_and_another_tenants_batch_completes(
    make_queue: Any, store: FileStore
) -> None:
    queue = await make_queue()
    doomed = await new_batch(queue, store, jsonl([request_line(i) for i in range(20)]))
    other = await new_batch(queue, store, jsonl([request_line(i) for i in range(20)]), tenant="tenant-b")
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()  # both validated
    doomed_batch = await batch_of(queue, doomed)
    store.client.delete_object(Bucket=BUCKET, Key=store.file_key("tenant-a", doomed_batch.input_file_id))
    for _ in range(batch_driver.MAX_FAULTS + 2):
        await driver.run_once()
        await work_off(queue)
    failed = await batch_of(queue, doomed)
    assert failed.status is BatchStatus.FAILED and failed.errors
    assert failed.errors[0]["code"] == "batch_processing_error" and "in_progress" in failed.errors[0]["message"]
    assert not await queue.redis.zscore(queue.keys.batches_active, doomed), "the driver is done with it"
    completed = await batch_of(queue, other)
    assert completed.status is BatchStatus.COMPLETED and completed.completed == 20


async def test_a_step_that_raises_or_hangs_holds_up_no_other_batch(
    make_queue: Any, store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    queue = await make_queue()
    stuck = await new_batch(queue, store, jsonl([request_line(0)]))
    broken = await new_batch(queue, store, jsonl([request_line(0)]))
    fine = await new_batch(queue, store, jsonl([request_line(i) for i in range(5)]), tenant="tenant-b")
    real = BatchDriver._validate

    async def sabotaged(self: BatchDriver, batch: Any, deadline: Any) -> None:
        if batch.id == stuck:
            await asyncio.sleep(3600)
        if batch.id == broken:
            raise RuntimeError("a bug in one batch's step")
        await real(self, batch, deadline)

    monkeypatch.setattr(BatchDriver, "_validate", sabotaged)
    monkeypatch.setattr(batch_driver, "STEP_MAX_S", 1.0)
    driver = BatchDriver(queue, store, queue.settings)
    report = await driver.run_once()
    assert set(report.faults) == {stuck, broken}
    assert (await batch_of(queue, fine)).status is BatchStatus.IN_PROGRESS
    for _ in range(3):
        await driver.run_once()
        await work_off(queue)
    assert (await batch_of(queue, fine)).status is BatchStatus.COMPLETED
    for _ in range(batch_driver.MAX_FAULTS):
        await driver.run_once()
    for batch_id in (stuck, broken):
        batch = await batch_of(queue, batch_id)
        assert batch.status is BatchStatus.FAILED and batch.errors[0]["code"] == "batch_processing_error"


async def test_a_failing_batch_whose_cancel_fails_is_failed_only_once_its_jobs_are_cancelled(
    make_queue: Any, store: FileStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch failed after its jobs were queued cancels them; a cancel that fails (Redis refused it) is not
    forgotten: the batch stays active and the next pass tries again, so no job of a failed batch runs on the GPUs."""
    import redis.exceptions

    queue = await make_queue()
    batch_id = await new_batch(queue, store, jsonl([request_line(i) for i in range(20)]))
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()  # validated
    await driver.run_once()  # its 20 jobs queued
    jobs = list((await queue.redis.hgetall(queue.keys.batch_lines(batch_id))).values())
    assert len(jobs) == 20

    async def broken(self: BatchDriver, batch: Any, report: Any) -> None:
        raise RuntimeError("a bug in the batch's step")

    real_cancel, refusals = BatchDriver._cancel_job, [1]

    async def refused_once(self: BatchDriver, tenant: str, job_id: str) -> None:
        if refusals:
            refusals.pop()
            raise redis.exceptions.ConnectionError("reset by peer")
        await real_cancel(self, tenant, job_id)

    monkeypatch.setattr(BatchDriver, "_progress", broken)
    monkeypatch.setattr(BatchDriver, "_cancel_job", refused_once)
    for _ in range(batch_driver.MAX_FAULTS):
        await driver.run_once()
    assert (await batch_of(queue, batch_id)).status is BatchStatus.IN_PROGRESS, "failed with its cancel undone"
    assert await queue.redis.zscore(queue.keys.batches_active, batch_id) is not None
    assert f"cancelling the jobs of failing batch {batch_id} failed" in caplog.text
    await driver.run_once()  # fails again: the cancel is tried again, and goes through
    failed = await batch_of(queue, batch_id)
    assert failed.status is BatchStatus.FAILED and failed.errors[0]["code"] == "batch_processing_error"
    statuses = {(await queue.get(job_id)).status for job_id in jobs}  # type: ignore[union-attr]
    assert statuses == {JobStatus.CANCELLED}


class S3Down:
    """The file store, but S3 refuses every removal and abort."""

    def __init__(self, store: FileStore) -> None:
        self._store = store

    def discard_uploads(self, tenant: str, file_id: str) -> int:
        raise ConnectionError("S3 unreachable")

    def delete(self, tenant: str, file_id: str) -> bool:
        raise ConnectionError("S3 unreachable")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_cleanup_that_fails_is_logged_naming_the_batch_and_its_file(
    make_queue: Any, store: FileStore, caplog: pytest.LogCaptureFixture
) -> None:
    queue = await make_queue()
    batch = await batch_of(queue, await new_batch(queue, store, jsonl([request_line(0)])))
    driver = BatchDriver(queue, S3Down(store), queue.settings)  # type: ignore[arg-type]
    output_id, error_id = await driver.output.file_ids(batch)
    await driver.output.discard(batch)  # best effort, never raises: the bucket's lifecycle rule is the net
    for file_id in (output_id, error_id):
        assert f"batch {batch.id}: removing what its finalising tries wrote under {file_id} failed" in caplog.text


async def test_lines_obey_the_body_limit_and_the_claim_check_of_a_submit(make_queue: Any, store: FileStore) -> None:
    queue = await make_queue(max_body_bytes=8192, inline_max_bytes=2048)
    lines = [request_line(0), request_line(1, "x" * 20_000), request_line(2, "y" * 4000), request_line(3)]
    batch_id = await new_batch(queue, store, jsonl(lines))
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()
    await driver.run_once()
    jobs = await queue.redis.hgetall(queue.keys.batch_lines(batch_id))
    assert jobs["1"] == "!request_too_large", "a line over INFERQ_MAX_BODY_BYTES becomes no job"
    claimed = await queue.get(jobs["2"], "tenant-a")
    assert claimed is not None
    claim = claimcheck.claim_of_body(claimed.body, "tenant-a")
    assert claim is not None, "a body over INFERQ_INLINE_MAX_BYTES is a reference in Valkey"
    assert len(await queue.redis.hget(queue.keys.job(jobs["2"]), "body")) < 1024
    assert json.loads(store.claimed(claim.key))["messages"][0]["content"] == "y" * 4000
    await work_off(queue)
    await driver.run_once()
    batch = await batch_of(queue, batch_id)
    assert batch.status is BatchStatus.COMPLETED and (batch.completed, batch.failed) == (3, 1)
    [too_large] = file_lines(store, "tenant-a", batch.error_file_id)
    assert too_large["custom_id"] == "c1" and too_large["error"]["code"] == "request_too_large"
    assert sorted(x["custom_id"] for x in file_lines(store, "tenant-a", batch.output_file_id)) == ["c0", "c2", "c3"]


async def test_a_big_batch_waits_for_its_tenants_quota_and_never_fills_others_out(
    make_queue: Any, store: FileStore
) -> None:
    queue = await make_queue(tenant_max_depth=10, max_queue_depth=40)
    batch_id = await new_batch(queue, store, jsonl([request_line(i) for i in range(60)]))
    driver = BatchDriver(queue, store, queue.settings)
    rounds = 0
    while (await batch_of(queue, batch_id)).status is not BatchStatus.COMPLETED:
        await driver.run_once()
        assert int(await queue.redis.hget(queue.keys.tenants, "tenant-a") or 0) <= 10
        # another tenant's submits are accepted at every point of the batch
        await queue.enqueue("tenant-b", JobRequest(body={"messages": [{"role": "user", "content": str(rounds)}]}))
        await work_off(queue)
        rounds += 1
        assert rounds < 30
    batch = await batch_of(queue, batch_id)
    assert (batch.completed, batch.failed) == (60, 0) and batch.error_file_id is None


async def test_every_result_reaches_the_output_file_though_job_records_expire_first(
    make_queue: Any, store: FileStore
) -> None:
    import asyncio

    queue = await make_queue(result_ttl_s=1)
    batch_id = await new_batch(queue, store, jsonl([request_line(i) for i in range(10)]))
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()
    await driver.run_once()
    deliveries, _ = await read_all(queue, "test-worker", 10)
    first = [d for d in deliveries if d.job.metadata["custom_id"] != "c0"]  # line 0 runs on: no finalisation yet
    await queue.finish_many([(d, JobStatus.SUCCEEDED, {"status_code": 200, "body": {"n": d.job.metadata["custom_id"]}},
                              None) for d in first])
    assert await queue.redis.ttl(queue.keys.job(first[0].job.id)) > 86400, "kept for the batch's life"
    await asyncio.sleep(2.5)  # past INFERQ_RESULT_TTL_S, with no driver pass in between
    [last] = [d for d in deliveries if d.job.metadata["custom_id"] == "c0"]
    await queue.finish_many([(last, JobStatus.SUCCEEDED, {"status_code": 200, "body": {"n": "c0"}}, None)])
    await driver.run_once()
    batch = await batch_of(queue, batch_id)
    assert batch.status is BatchStatus.COMPLETED and (batch.completed, batch.failed) == (10, 0)
    output = file_lines(store, "tenant-a", batch.output_file_id)
    assert sorted((x["custom_id"], x["response"]["body"]["n"]) for x in output) == sorted(
        (f"c{i}", f"c{i}") for i in range(10))


async def test_lines_unfinished_at_the_window_end_are_batch_expired_with_their_job(
    make_queue: Any, store: FileStore
) -> None:
    queue = await make_queue()
    batch_id = await new_batch(queue, store, jsonl([request_line(i) for i in range(4)]))
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()
    await driver.run_once()
    await work_off(queue, limit=1)
    await queue.redis.hset(queue.keys.batch(batch_id), "expires_at", 1)  # the window is over
    await driver.run_once()
    batch = await batch_of(queue, batch_id)
    assert batch.status is BatchStatus.EXPIRED
    [done] = file_lines(store, "tenant-a", batch.output_file_id)
    errors = file_lines(store, "tenant-a", batch.error_file_id)
    assert len(errors) == 3 and {e["error"]["code"] for e in errors} == {"batch_expired"}
    jobs = await queue.redis.hgetall(queue.keys.batch_lines(batch_id))
    for line in [*errors, done]:
        n = line["custom_id"][1:]
        assert line["job_id"] == jobs[n] and line["id"] == "batch_req_" + jobs[n].removeprefix("job_")


class Killed(BaseException):
    """The process dying at a step boundary: nothing after it runs (no except Exception catches it)."""


def bucket_state(store: FileStore) -> tuple[list[str], list[str]]:
    bucket = store.bucket
    keys = [o["Key"] for o in store.client.list_objects_v2(Bucket=bucket, Prefix="files/").get("Contents", [])]
    uploads = [u["Key"] for u in store.client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    return sorted(keys), uploads


STEPS = ["ids", "discarded", "opened", "chunk", "written", "output_closed", "errors_closed", "moved"]


@pytest.mark.parametrize("step", STEPS)
async def test_finalisation_killed_at_any_step_ends_the_batch_once_with_one_file_each(
    make_queue: Any, store: FileStore, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from functions.storage import MultipartWriter

    queue = await make_queue()
    lines = [request_line(i) for i in range(5)] + [request_line(5, mock={"fatal": True})]
    batch_id = await new_batch(queue, store, jsonl(lines))
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()
    await driver.run_once()
    deliveries, _ = await read_all(queue, "test-worker", 6)
    await queue.finish_many([
        (d, JobStatus.FAILED, None, {"type": "model_error", "message": "refused"}) if d.job.body.get("mock")
        else (d, JobStatus.SUCCEEDED, {"status_code": 200, "body": {"ok": 1}}, None) for d in deliveries])

    def die(batch: str, name: str) -> None:
        if name == step:
            raise Killed(name)

    driver.on_step = die
    with monkeypatch.context() as dying:  # a killed process aborts nothing: its open uploads stay behind
        dying.setattr(MultipartWriter, "abort", lambda self: None)
        with pytest.raises(Killed):
            await driver.step(batch_id, batch_driver.PassReport())
    if step in ("opened", "chunk", "written"):
        assert bucket_state(store)[1], "the killed try left its uploads open"
    # a second try (a killed first one's lease runs out; here the lease was let go) and one more pass after
    fresh = BatchDriver(queue, store, queue.settings)
    await fresh.run_once()
    await fresh.run_once()
    batch = await batch_of(queue, batch_id)
    assert batch.status is BatchStatus.COMPLETED and (batch.completed, batch.failed) == (5, 1)
    keys, uploads = bucket_state(store)
    input_key = store.file_key("tenant-a", batch.input_file_id)
    assert keys == sorted([input_key, store.file_key("tenant-a", batch.output_file_id),
                           store.file_key("tenant-a", batch.error_file_id)]), "one output, one error file, no orphan"
    assert uploads == [], "no multipart upload left open"
    output = file_lines(store, "tenant-a", batch.output_file_id)
    errors = file_lines(store, "tenant-a", batch.error_file_id)
    assert sorted(x["custom_id"] for x in output) == [f"c{i}" for i in range(5)]
    assert [x["custom_id"] for x in errors] == ["c5"] and errors[0]["error"]["code"] == "model_error"
    assert not await queue.redis.zscore(queue.keys.batches_active, batch_id)


KILL_CHILD = """
import asyncio, os, sys
from functions.storage import FileStore
from inferq.batches.driver import BatchDriver, PassReport
from inferq.queue.protocol import Queue
from inferq.config.settings import Settings

redis_url, queue_name, bucket, batch_id, step = sys.argv[1:]

def die(batch, name):
    if name == step:
        os._exit(9)  # as a SIGKILL: no finally, no abort, the lease left held

async def main():
    queue = Queue.connect(Settings(redis_url=redis_url, queue=queue_name))
    driver = BatchDriver(queue, FileStore(bucket), queue.settings)
    driver.on_step = die
    await driver.run_once()

asyncio.run(main())
sys.exit(0)
"""


@pytest.mark.parametrize("step", ["discarded", "chunk", "output_closed", "moved"])
async def test_a_driver_process_killed_while_finalising_is_finished_once_by_the_next(
    valkey: Any, queue_name: str, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import uuid

    from tests.support.s3 import MotoS3

    server = MotoS3(monkeypatch)  # a server: the killed process and this one share the bucket
    bucket = f"kill-{uuid.uuid4().hex[:12]}"  # moto's buckets outlive its server within this process
    try:
        server.client().create_bucket(Bucket=bucket)
        store = FileStore(bucket)
        queue = Queue.connect(Settings(redis_url=valkey.url, queue=queue_name))
        await queue.ensure_groups()
        try:
            batch_id = await new_batch(queue, store, jsonl([request_line(i) for i in range(1200)]))
            driver = BatchDriver(queue, store, queue.settings)
            while (await batch_of(queue, batch_id)).next_line < 1200:
                await driver.run_once()
                await work_off(queue)
            child = await asyncio_run_child([sys.executable, "-c", KILL_CHILD, valkey.url, queue_name, bucket,
                                             batch_id, step])
            assert child == 9, "the child died at the step"
            if step == "chunk":
                assert bucket_state(store)[1], "it died with its uploads open"
            assert (await batch_of(queue, batch_id)).status is not BatchStatus.COMPLETED or step == "moved"
            await queue.redis.delete(queue.keys.batch_lock(batch_id))  # its lease runs out
            await driver.run_once()
            await driver.run_once()
            batch = await batch_of(queue, batch_id)
            assert batch.status is BatchStatus.COMPLETED and (batch.completed, batch.failed) == (1200, 0)
            keys, uploads = bucket_state(store)
            assert keys == sorted([store.file_key("tenant-a", batch.input_file_id),
                                   store.file_key("tenant-a", batch.output_file_id)]) and uploads == []
            output = file_lines(store, "tenant-a", batch.output_file_id)
            assert sorted(x["custom_id"] for x in output) == sorted(f"c{i}" for i in range(1200))
        finally:
            await queue.close()
    finally:
        server.stop()


async def asyncio_run_child(argv: list[str]) -> int:
    import asyncio

    process = await asyncio.create_subprocess_exec(*argv)
    return await process.wait()


async def test_a_finalisation_that_keeps_failing_fails_the_batch_and_leaves_no_file(
    make_queue: Any, store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from functions.storage import MultipartWriter

    queue = await make_queue()
    batch_id = await new_batch(queue, store, jsonl([request_line(i) for i in range(3)]))
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()
    await driver.run_once()
    await work_off(queue)
    real_close = MultipartWriter.close

    def close_then_fail(self: MultipartWriter) -> int:
        real_close(self)  # the object is there: a try that dies right after completing it
        raise ConnectionError("S3 went away")

    monkeypatch.setattr(MultipartWriter, "close", close_then_fail)
    for _ in range(batch_driver.MAX_FAULTS):
        await driver.run_once()
    batch = await batch_of(queue, batch_id)
    assert batch.status is BatchStatus.FAILED and batch.errors[0]["code"] == "batch_processing_error"
    assert "finalizing" in batch.errors[0]["message"]
    assert bucket_state(store) == ([store.file_key("tenant-a", batch.input_file_id)], [])
