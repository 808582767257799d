"""The claim check through the gateway app and an in-process worker, on real Valkey and moto's S3 in server mode:
large prompts and results live in S3, the job record stays small, and the job object looks the same to the
client (docs/api.md, "Large payloads")."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import FastAPI

from inferq.client import AsyncClient
from inferq.config.settings import Settings
from inferq.queue import claimcheck
from inferq.queue.protocol import Queue
from tests.integration.worker.support import running_worker, terminal
from tests.support import s3 as moto_s3
from tests.support.s3 import MotoS3

from .conftest import AppFactory
from .support import KEYS, A, B

s3 = moto_s3.s3  # the moto S3 server and a fresh bucket: fixtures shared by the claim-check tests
bucket = moto_s3.bucket

KEY_A = next(key for key, tenant in KEYS.items() if tenant == "tenant-a")

MIB = 1024 * 1024
SMALL_RECORD_BYTES = 4096
"""What a claim-checked job's whole record may cost in Redis (MEMORY USAGE), whatever its payload."""


def big_prompt(size: int) -> str:
    """About ``size`` bytes of text with what JSON escapes and what is not ASCII, so any re-encoding shows."""
    unit = 'word "quoted" \\ back\\slash é 漢字 \n'
    return (unit * (size // len(unit.encode()) + 1))[: size]


def chat(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


async def submit(client: httpx.AsyncClient, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    response = await client.post("/v1/jobs", json={"body": body}, headers={**A, **headers})
    assert response.status_code in (200, 202), response.text
    return dict(response.json())


async def record_cost(queue: Queue, job_id: str) -> tuple[int, int, int]:
    """(MEMORY USAGE of the job record, HSTRLEN of its body, HSTRLEN of its result)."""
    key = queue.keys.job(job_id)
    memory = int(await queue.redis.memory_usage(key, samples=0) or 0)
    return memory, int(await queue.redis.hstrlen(key, "body")), int(await queue.redis.hstrlen(key, "result"))


async def test_a_2mb_prompt_and_its_2mb_result_round_trip_through_s3_with_a_small_record(
    s3: MotoS3, bucket: str, settings: Settings, queue: Queue, make_app: AppFactory,
    open_client: Callable[[FastAPI], httpx.AsyncClient],
) -> None:
    app = make_app(files_bucket=bucket, max_body_bytes=3 * MIB)
    client = open_client(app)
    prompt = big_prompt(2 * MIB)
    created = await submit(client, chat(prompt))
    assert created["status"] == "queued" and created["result"] is None
    memory, body_len, _ = await record_cost(queue, created["id"])
    assert body_len < 512 and memory < SMALL_RECORD_BYTES, (memory, body_len)
    [request_key] = s3.keys(bucket, "claims/requests/tenant-a/")

    async with running_worker(settings.replace(files_bucket=bucket), queue):
        done = await terminal(queue, created["id"], timeout=60)
    assert done.status.value == "succeeded", done.error
    memory, body_len, result_len = await record_cost(queue, created["id"])
    assert result_len < 512 and memory < SMALL_RECORD_BYTES, (memory, result_len)
    [result_key] = s3.keys(bucket, f"claims/results/tenant-a/{created['id']}/")
    assert s3.keys(bucket, "claims/requests/tenant-a/") == []  # the ended job's body object is deleted

    # GET: a 2 MB result fits one response, so it comes inline, exactly as an inline job's would
    got = (await client.get(f"/v1/jobs/{created['id']}", headers=A)).json()
    assert got["status"] == "succeeded" and set(got["result"]) == {"status_code", "body"}
    answer = got["result"]["body"]
    assert answer["choices"][0]["message"]["content"] == prompt  # byte for byte, escapes and all
    stored = s3.client().get_object(Bucket=bucket, Key=result_key)["Body"].read()
    assert claimcheck.encode(answer) == stored and len(stored) > 2 * MIB
    assert (await client.get(f"/v1/jobs/{created['id']}", params={"wait": 1}, headers=A)).json() == got

    # too large for one response: a short-lived presigned URL to the same bytes
    app.state.gateway.claim_check.response_inline_max = MIB
    by_url = (await client.get(f"/v1/jobs/{created['id']}", headers=A)).json()
    assert by_url["result"]["status_code"] == 200 and by_url["result"]["body_bytes"] == len(stored)
    assert set(by_url["result"]) == {"status_code", "body_url", "body_bytes"}
    async with httpx.AsyncClient() as plain:
        fetched = await plain.get(by_url["result"]["body_url"])
    assert fetched.status_code == 200 and fetched.content == stored
    assert "X-Amz-Expires=900" in by_url["result"]["body_url"]
    # the Python client reads it into result.body, as if it had come inline
    async with AsyncClient("http://gateway", KEY_A, transport=httpx.ASGITransport(app=app)) as inferq:
        followed = await inferq.get(created["id"])
    assert followed.text == prompt and followed.result is not None and followed.result["body"] == answer

    # the events feed always gives a claimed result by URL (a page holds up to 1,000 jobs)
    feed = (await client.get("/v1/events", headers=A)).json()
    [event] = [job for job in feed["data"] if job["id"] == created["id"]]
    assert event["result"]["body_bytes"] == len(stored) and "body_url" in event["result"]

    # a resent submit with the same Idempotency-Key is a replay: no second object, no conflict
    key = {"Idempotency-Key": "big-1"}
    first = await submit(client, chat(prompt), **key)
    replay = await client.post("/v1/jobs", json={"body": chat(prompt)}, headers={**A, **key})
    assert replay.status_code == 200 and replay.json()["id"] == first["id"]
    [first_key] = s3.keys(bucket, "claims/requests/tenant-a/")
    assert first_key != request_key  # the keyed job's own object, written twice

    # S3 unreadable when the job is read: its URL, signed locally, instead of an error
    app.state.gateway.claim_check.response_inline_max = 3 * MIB
    s3.stop()
    unreadable = await client.get(f"/v1/jobs/{created['id']}", headers=A)
    assert unreadable.status_code == 200 and unreadable.json()["result"]["body_bytes"] == len(stored)
    assert unreadable.json()["result"]["body_url"].startswith(s3.endpoint)


async def test_the_threshold_is_inline_max_bytes_of_compact_json(
    s3: MotoS3, bucket: str, queue: Queue, make_app: AppFactory,
    open_client: Callable[[FastAPI], httpx.AsyncClient],
) -> None:
    limit = 64 * 1024
    client = open_client(make_app(files_bucket=bucket, inline_max_bytes=limit, max_body_bytes=MIB))
    overhead = len(claimcheck.encode(chat("")))
    at_limit = chat("x" * (limit - overhead))
    assert len(claimcheck.encode(at_limit)) == limit
    inline = await submit(client, at_limit)
    assert (await record_cost(queue, inline["id"]))[1] == limit
    assert s3.keys(bucket) == []
    over = await submit(client, chat("x" * (limit - overhead + 1)))
    assert (await record_cost(queue, over["id"]))[1] < 512
    [key] = s3.keys(bucket)
    stored = s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    assert json.loads(stored) == chat("x" * (limit - overhead + 1)) and len(stored) == limit + 1


async def test_without_a_bucket_a_large_body_stays_inline_as_before(
    settings: Settings, queue: Queue, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient],
) -> None:
    client = open_client(make_app(files_bucket=None, max_body_bytes=3 * MIB))
    prompt = big_prompt(2 * MIB)
    created = await submit(client, chat(prompt))
    assert (await record_cost(queue, created["id"]))[1] > 2 * MIB
    async with running_worker(settings.replace(files_bucket=None), queue):
        await terminal(queue, created["id"], timeout=60)
    got = (await client.get(f"/v1/jobs/{created['id']}", headers=A)).json()
    assert got["result"]["body"]["choices"][0]["message"]["content"] == prompt
    assert (await record_cost(queue, created["id"]))[2] > 2 * MIB
    # and the body bound is still the bound
    too_big = await client.post("/v1/jobs", json={"body": chat(big_prompt(3 * MIB))}, headers=A)
    assert too_big.status_code == 413


async def test_an_unreachable_store_on_submit_is_a_503_to_retry_never_a_500(
    s3: MotoS3, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient],
) -> None:
    client = open_client(make_app(files_bucket="no-such-bucket", max_body_bytes=MIB))
    response = await client.post("/v1/jobs", json={"body": chat("y" * 100_000)}, headers=A)
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert response.json()["error"]["type"] == "unavailable"
    s3.stop()
    response = await client.post("/v1/jobs", json={"body": chat("z" * 100_000)}, headers=A)
    assert response.status_code == 503
    small = await client.post("/v1/jobs", json={"body": chat("small")}, headers=A)
    assert small.status_code == 202  # a job that needs no claim check does not need S3


async def test_a_job_cancelled_while_queued_has_its_body_object_deleted_by_the_gateway(
    s3: MotoS3, bucket: str, queue: Queue, make_app: AppFactory,
    open_client: Callable[[FastAPI], httpx.AsyncClient],
) -> None:
    """Issue 40 leftovers, point 3: the cancel ends the job at the gateway, which deletes its own body object (and
    only it: another job with the same body keeps its own); a resent cancel answers 409 and deletes nothing more."""
    client = open_client(make_app(files_bucket=bucket, max_body_bytes=MIB))
    prompt = "cancel me " * 20_000
    doomed, other = await submit(client, chat(prompt)), await submit(client, chat(prompt))
    keys = s3.keys(bucket, "claims/requests/tenant-a/")
    assert len(keys) == 2
    cancelled = await client.post(f"/v1/jobs/{doomed['id']}/cancel", headers=A)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    [left] = s3.keys(bucket, "claims/requests/tenant-a/")
    record = await queue.get(other["id"], "tenant-a")
    assert record is not None and left == record.body[claimcheck.MARKER]["key"]
    again = await client.post(f"/v1/jobs/{doomed['id']}/cancel", headers=A)
    assert again.status_code == 409
    assert s3.keys(bucket, "claims/requests/tenant-a/") == [left]
    # another tenant cannot cancel (nor delete) it
    assert (await client.post(f"/v1/jobs/{other['id']}/cancel", headers=B)).status_code == 404
    assert s3.keys(bucket, "claims/requests/tenant-a/") == [left]
