"""The worker's half of the claim check against moto's S3 in server mode and real Valkey: a claimed body is read
back before the model is called, a large result is stored, and S3 being down is a fault the job survives."""

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

from .support import TENANT, Receiver, chat, eventually, mock_calls, running_worker, submit, terminal

s3 = moto_s3.s3  # the moto S3 server and a fresh bucket: fixtures shared by the claim-check tests
bucket = moto_s3.bucket


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Room for a few retries while S3 is down, with short backoffs."""
    return settings.replace(max_attempts=20, retry_base_ms=50, retry_max_ms=300)


def claim_body(s3: MotoS3, bucket: str, text: str) -> dict[str, object]:
    """What the gateway does with a large body: store it, and give the record its reference."""
    data = claimcheck.encode(chat(text))
    claim = claimcheck.request_claim(TENANT, data)
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
        await eventually(lambda: _at_least(queue, job.id, 2), timeout=60, what="a retried attempt")
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
        await eventually(lambda: _at_least(queue, job.id, 2), timeout=60, what="a retried attempt")
        s3.start()
        done = await terminal(queue, job.id, timeout=60)
    assert done.status.value == "succeeded", done.error
    claim = claimcheck.claim_of_result(done.result, TENANT, job.id)
    assert claim is not None and claim.bytes > 1024
    assert s3.keys(bucket, f"claims/{TENANT}/results/{job.id}/") == [claim.key]


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
            await eventually(lambda: _received(receiver), timeout=30, what="the webhook")
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
    assert len(s3.keys(bucket, f"claims/{TENANT}/results/")) == 1
    await driver.run_once()
    done = await Batches(queue).get(batch.id, TENANT)
    assert done is not None and done.status is BatchStatus.COMPLETED and done.output_file_id
    output = [json.loads(line) for line in b"".join(store.chunks(TENANT, done.output_file_id)).splitlines()]
    answers = [line["response"]["body"]["choices"][0]["message"]["content"] for line in output]
    assert answers == texts


async def running_worker_until_idle(settings: Settings, queue: Queue) -> None:
    from gpu_worker.backends.mock import MockBackend
    from gpu_worker.worker import Worker

    await Worker(settings, queue, MockBackend(queue.redis, queue.keys), webhooks=False).run_until_idle()


async def _received(receiver: Receiver) -> bool:
    return bool(receiver.requests)


async def _at_least(queue: Queue, job_id: str, attempts: int) -> bool:
    return await attempts_of(queue, job_id) >= attempts
