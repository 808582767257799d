"""The worker's half of the claim check against moto's S3 in server mode and real Valkey: a claimed body is read
back before the model is called, a large result is stored, S3 being down is a fault the job survives, and a job's
body object is deleted when the job ends (kept for a dead letter's redrive)."""

from __future__ import annotations

import json

import httpx
import pytest

from functions.storage import FileStore
from inferq.batches.driver import BatchDriver
from inferq.batches.records import Batches, BatchStatus, new_file_id
from inferq.config.settings import Settings
from inferq.queue import claimcheck
from inferq.queue.protocol import Queue
from tests.support import s3 as moto_s3
from tests.support.s3 import MotoS3
from tests.support.waiting import eventually_async

from .support import TENANT, Receiver, chat, mock_calls, running_worker, submit, terminal

s3 = moto_s3.s3  # the moto S3 server and a fresh bucket: fixtures shared by the claim-check tests
bucket = moto_s3.bucket


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Room for a few retries while S3 is down, with short backoffs."""
    return settings.replace(max_attempts=20, retry_base_ms=50, retry_max_ms=300)


def claim_body(s3: MotoS3, bucket: str, text: str, **mock: object) -> dict[str, object]:
    """What the gateway does with a large body: store it, and give the record its reference."""
    data = claimcheck.encode(chat(text, **mock))
    claim = claimcheck.request_claim(TENANT, data, None)
    s3.client().put_object(Bucket=bucket, Key=claim.key, Body=data)
    return claimcheck.claimed_body(claim)


async def attempts_of(queue: Queue, job_id: str) -> int:
    return int(await queue.redis.hget(queue.keys.job(job_id), "attempts") or 0)


async def test_s3_down_when_the_body_is_read_is_retried_and_the_job_not_lost(
    s3: MotoS3, bucket: str, settings: Settings, queue: Queue
) -> None:
    text = "large " * 40_000
    job = await submit(queue, claim_body(s3, bucket, text))
    s3.stop()
    async with running_worker(settings.replace(files_bucket=bucket), queue):
        await eventually_async(lambda: _at_least(queue, job.id, 2), what="a retried attempt", timeout=60)
        assert await mock_calls(queue, job.id) == 0  # the model is never called without its body
        s3.start()
        done = await terminal(queue, job.id, timeout=60)
    assert done.status.value == "succeeded", done.error
    assert await mock_calls(queue, job.id) == 1
    claim = claimcheck.claim_of_result(done.result, TENANT, job.id)
    assert claim is not None and done.result is not None and done.result["status_code"] == 200
    stored = s3.client().get_object(Bucket=bucket, Key=claim.key)["Body"].read()
    assert claimcheck.verify(claim, stored)


async def test_s3_down_when_a_large_result_is_stored_is_retried_and_the_job_not_lost(
    s3: MotoS3, bucket: str, settings: Settings, queue: Queue
) -> None:
    text = "answer " * 1000  # an inline request whose echo is over the worker's threshold
    job = await submit(queue, chat(text))
    s3.stop()
    async with running_worker(settings.replace(files_bucket=bucket, inline_max_bytes=1024), queue):
        await eventually_async(lambda: _at_least(queue, job.id, 2), what="a retried attempt", timeout=60)
        s3.start()
        done = await terminal(queue, job.id, timeout=60)
    assert done.status.value == "succeeded", done.error
    claim = claimcheck.claim_of_result(done.result, TENANT, job.id)
    assert claim is not None and claim.bytes > 1024
    assert s3.keys(bucket, f"claims/results/{TENANT}/{job.id}/") == [claim.key]


async def test_a_claimed_body_that_is_gone_fails_the_job_at_once(
    s3: MotoS3, bucket: str, settings: Settings, queue: Queue
) -> None:
    body = claim_body(s3, bucket, "expired " * 20_000)
    s3.client().delete_object(Bucket=bucket, Key=body[claimcheck.MARKER]["key"])  # type: ignore[index]
    job = await submit(queue, body)
    async with running_worker(settings.replace(files_bucket=bucket), queue):
        done = await terminal(queue, job.id, timeout=60)
    assert done.status.value == "failed" and done.attempts == 1
    assert done.error is not None and "gone from S3" in done.error["message"]
    assert await mock_calls(queue, job.id) == 0


async def test_a_small_result_stays_inline_and_nothing_is_stored(
    s3: MotoS3, bucket: str, settings: Settings, queue: Queue
) -> None:
    job = await submit(queue, chat("hello"))
    async with running_worker(settings.replace(files_bucket=bucket), queue):
        done = await terminal(queue, job.id, timeout=30)
    assert done.result is not None and done.result["body"]["choices"][0]["message"]["content"] == "hello"
    assert s3.keys(bucket) == []


async def test_a_webhook_carries_a_claimed_result_as_a_presigned_url(
    s3: MotoS3, bucket: str, settings: Settings, queue: Queue
) -> None:
    receiver = Receiver()
    try:
        text = "hook " * 1000
        job = await submit(queue, chat(text), webhook_url=receiver.url)
        worker_settings = settings.replace(files_bucket=bucket, inline_max_bytes=1024, webhook_allow_private=True)
        async with running_worker(worker_settings, queue):
            await terminal(queue, job.id, timeout=30)
            await eventually_async(lambda: _received(receiver), what="the webhook", timeout=30)
    finally:
        receiver.close()
    sent = json.loads(receiver.requests[0][3])
    assert sent["status"] == "succeeded" and set(sent["result"]) == {"status_code", "body_url", "body_bytes"}
    async with httpx.AsyncClient() as plain:
        fetched = await plain.get(sent["result"]["body_url"])
    assert fetched.status_code == 200 and len(fetched.content) == sent["result"]["body_bytes"]
    assert json.loads(fetched.content)["choices"][0]["message"]["content"] == text


async def test_a_batch_output_file_holds_claimed_results_inline(
    s3: MotoS3, bucket: str, settings: Settings, queue: Queue
) -> None:
    store = FileStore(bucket)
    texts = ["short", "long " * 2000, "again"]
    data = b"".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": chat(t)}).encode() + b"\n" for i, t in enumerate(texts))
    file_id = new_file_id()
    store.put(TENANT, file_id, data, "in.jsonl", "batch")
    batch = await Batches(queue).create(TENANT, file_id, "/v1/chat/completions", "24h", None)
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()
    await driver.run_once()
    await running_worker_until_idle(settings.replace(files_bucket=bucket, inline_max_bytes=1024), queue)
    assert len(s3.keys(bucket, f"claims/results/{TENANT}/")) == 1
    await driver.run_once()
    done = await Batches(queue).get(batch.id, TENANT)
    assert done is not None and done.status is BatchStatus.COMPLETED and done.output_file_id
    output = [json.loads(line) for line in b"".join(store.chunks(TENANT, done.output_file_id)).splitlines()]
    answers = [line["response"]["body"]["choices"][0]["message"]["content"] for line in output]
    assert answers == texts


async def test_an_ended_jobs_body_object_is_deleted_and_a_dead_letters_kept_until_its_redrive_ends(
    s3: MotoS3, bucket: str, settings: Settings, queue: Queue
) -> None:
    """Issue 40 leftovers, point 3: two jobs with the same large body each have their own object, and each is
    deleted when its job ends (the other still runs); a job dead-lettered keeps its object, its redrive reads it
    again, and the object goes when the redriven job ends. Results are left to the lifecycle rule."""
    text = "same prompt " * 10_000
    first = await submit(queue, claim_body(s3, bucket, text))
    second = await submit(queue, claim_body(s3, bucket, text))
    doomed = await submit(queue, claim_body(s3, bucket, text, fail_attempts=1))
    assert len(s3.keys(bucket, f"claims/requests/{TENANT}/")) == 3  # one object per job, the same bytes
    queue.settings = queue.settings.replace(max_attempts=1)  # the worker's must be the queue's
    await running_worker_until_idle(settings.replace(files_bucket=bucket, max_attempts=1), queue)
    for job in (first, second):
        done = await queue.get(job.id, TENANT)
        assert done is not None and done.status.value == "succeeded", done
        result = done.result or {}
        assert claimcheck.claim_of_result(result, TENANT, job.id) is not None  # the echo is claim-checked
    dead = await queue.get(doomed.id, TENANT)
    assert dead is not None and dead.dead_lettered
    [kept] = s3.keys(bucket, f"claims/requests/{TENANT}/")
    assert kept == dead.body[claimcheck.MARKER]["key"]
    assert len(s3.keys(bucket, f"claims/results/{TENANT}/")) == 2  # results expire by the lifecycle rule

    await queue.redrive(TENANT, doomed.id)
    # attempt 1 fails again, attempt 2 succeeds: the redrive read the kept body twice
    queue.settings = queue.settings.replace(max_attempts=3)
    await running_worker_until_idle(settings.replace(files_bucket=bucket, max_attempts=3), queue)
    done = await queue.get(doomed.id, TENANT)
    assert done is not None and done.status.value == "succeeded" and done.attempts == 2, done
    assert s3.keys(bucket, f"claims/requests/{TENANT}/") == []


async def test_a_job_cancelled_while_running_has_its_body_deleted_by_the_worker_that_ends_it(
    s3: MotoS3, bucket: str, settings: Settings, queue: Queue
) -> None:
    job = await submit(queue, claim_body(s3, bucket, "slow " * 20_000, latency_ms=60_000))
    async with running_worker(settings.replace(files_bucket=bucket), queue):
        await eventually_async(lambda: _running(queue, job.id), what="the job running", timeout=30)
        await queue.cancel(TENANT, job.id)
        done = await terminal(queue, job.id, timeout=30)
    assert done.status.value == "cancelled"
    assert s3.keys(bucket, f"claims/requests/{TENANT}/") == []


async def test_s3_down_when_an_ended_jobs_body_is_deleted_leaves_the_job_done_and_the_object_to_the_rule(
    s3: MotoS3, bucket: str, settings: Settings, queue: Queue
) -> None:
    """The deletion is one best-effort try after the outcome is written: S3 down then costs nothing but an object
    the lifecycle rule on claims/ removes later."""
    job = await submit(queue, claim_body(s3, bucket, "keep " * 20_000, latency_ms=1500))
    async with running_worker(settings.replace(files_bucket=bucket, inline_max_bytes=1024 * 1024), queue):
        await eventually_async(lambda: mock_calls(queue, job.id), what="the model called", timeout=30)
        s3.stop()  # its body was read: the model is answering
        done = await terminal(queue, job.id, timeout=60)
    assert done.status.value == "succeeded" and done.attempts == 1, done
    s3.start()
    assert len(s3.keys(bucket, f"claims/requests/{TENANT}/")) == 1


async def _running(queue: Queue, job_id: str) -> bool:
    return await queue.redis.hget(queue.keys.job(job_id), "status") == "running"


async def test_a_batch_line_its_batch_cancel_ends_while_queued_has_its_body_object_deleted(
    s3: MotoS3, bucket: str, settings: Settings, queue: Queue
) -> None:
    store = FileStore(bucket)
    data = json.dumps({"custom_id": "big", "method": "POST", "url": "/v1/chat/completions",
                       "body": chat("long " * 20_000)}).encode() + b"\n"
    file_id = new_file_id()
    store.put(TENANT, file_id, data, "in.jsonl", "batch")
    batch = await Batches(queue).create(TENANT, file_id, "/v1/chat/completions", "24h", None)
    driver = BatchDriver(queue, store, queue.settings)
    await driver.run_once()
    await driver.run_once()
    assert len(s3.keys(bucket, f"claims/requests/{TENANT}/")) == 1  # the line's job waits, its body in S3
    await Batches(queue).cancel(TENANT, batch.id)
    await driver.run_once()
    done = await Batches(queue).get(batch.id, TENANT)
    assert done is not None and done.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED), done
    assert s3.keys(bucket, f"claims/requests/{TENANT}/") == []


async def running_worker_until_idle(settings: Settings, queue: Queue) -> None:
    from gpu_worker.backends.mock import MockBackend
    from gpu_worker.worker import Worker

    await Worker(settings, queue, MockBackend(queue.redis, queue.keys), webhooks=False, burst=True).run()


async def _received(receiver: Receiver) -> bool:
    return bool(receiver.requests)


async def _at_least(queue: Queue, job_id: str, attempts: int) -> bool:
    return await attempts_of(queue, job_id) >= attempts
