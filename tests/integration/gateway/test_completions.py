"""The OpenAI front door (POST /v1/chat/completions, /v1/completions) in-process: the body queued as a job and the
answer the model server's response, the job's error with its status, 504 naming the job that goes on and a retry with
the same Idempotency-Key that waits for it, `stream: true` as OpenAI's chunks, the priority header, the body checks.
tests/e2e/test_openai_front_door.py drives the same through `inferq up` with the official client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from inferq.queue.jobs import JobStatus, Priority
from inferq.queue.protocol import Queue
from tests.support.waiting import eventually_async

from .conftest import AppFactory
from .support import A
from .test_streams import Worker, chat_result
from .test_submit import assert_envelope

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def served(queue: Queue, text: str = "Hello world", *, pieces: tuple[str, ...] = ()) -> str:
    """Play the worker: wait for the job, write ``pieces`` as output, end it with ``text``. Returns the job id."""
    worker = Worker(queue)
    while True:
        deliveries, _ = await queue.read("test-worker", 1)
        if deliveries:
            worker.delivery = deliveries[0]
            break
        await asyncio.sleep(0.01)
    for piece in pieces:
        await worker.say(piece)
    await worker.end(text)
    return worker.delivery.job.id


def events(raw: str) -> list[Any]:
    return [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
            for line in raw.split("\n") if line.startswith("data: ")]


async def test_a_chat_completion_is_answered_through_the_queue(client: httpx.AsyncClient, queue: Queue) -> None:
    call = asyncio.create_task(client.post("/v1/chat/completions", json=BODY, headers=A))
    job_id = await served(queue)
    response = await call
    assert response.status_code == 200
    assert response.headers["inferq-job-id"] == job_id
    assert response.json() == chat_result("Hello world")["body"]
    job = await queue.get(job_id)
    assert job is not None and job.body == {} and job.priority is Priority.NORMAL  # ended: the body is dropped


async def test_a_job_that_does_not_end_in_time_is_504_and_a_retry_with_its_key_waits_for_it(
        make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue) -> None:
    client = open_client(make_app(sync_wait_s=1.0))
    headers = {**A, "Idempotency-Key": "retry-me"}
    first = await client.post("/v1/chat/completions", json=BODY, headers=headers)
    assert_envelope(first, 504, "timeout")
    job_id = first.headers["inferq-job-id"]
    assert job_id in first.json()["error"]["message"] and first.json()["job_id"] == job_id
    assert first.headers["x-should-retry"] == "true"  # the official client retries it, with its key
    assert (await queue.get(job_id)).status is JobStatus.QUEUED  # type: ignore[union-attr]  # it goes on
    again = asyncio.create_task(client.post("/v1/chat/completions", json=BODY, headers=headers))
    assert await served(queue, "done") == job_id
    response = await again
    assert response.status_code == 200 and response.headers["inferq-job-id"] == job_id
    unkeyed = await client.post("/v1/chat/completions", json=BODY, headers=A)
    assert unkeyed.status_code == 504 and unkeyed.headers["x-should-retry"] == "false"  # a retry: a second job


async def test_a_failed_job_answers_its_error_with_the_model_servers_status(client: httpx.AsyncClient,
                                                                           queue: Queue) -> None:
    call = asyncio.create_task(client.post("/v1/completions", json={"model": "m", "prompt": "x"}, headers=A))
    while not (deliveries := (await queue.read("test-worker", 1))[0]):
        await asyncio.sleep(0.01)
    error = {"type": "model_error", "message": "model server answered 400: max_tokens is too large"}
    await queue.finish(deliveries[0], JobStatus.FAILED, error=error)
    response = await call
    assert response.status_code == 400 and response.headers["inferq-job-id"] == deliveries[0].job.id
    assert response.json()["error"]["type"] == "model_error"
    assert response.json()["error"]["message"] == error["message"]


async def test_stream_true_answers_openais_chunks_then_done(client: httpx.AsyncClient, queue: Queue) -> None:
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    call = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers=A))
    job_id = await served(queue, "Hello world", pieces=("Hel", "lo"))
    response = await call
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["inferq-job-id"] == job_id
    chunks = events(response.text)
    assert chunks[-1] == "[DONE]"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == f"chatcmpl-{job_id}" for c in chunks[:-1])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1] if c["choices"])
    assert content == "Hello world"
    finish = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"]]
    assert finish[-1] == "stop" and set(finish[:-1]) == {None}
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"]["total_tokens"] == 3
    job = await queue.get(job_id)
    assert job is not None and job.watched  # its worker streamed it from the start


async def test_a_completion_streams_text_chunks(client: httpx.AsyncClient, queue: Queue) -> None:
    call = asyncio.create_task(client.post("/v1/completions", json={"model": "m", "prompt": "x", "stream": True},
                                           headers=A))
    worker = Worker(queue)
    while not (deliveries := (await queue.read("test-worker", 1))[0]):
        await asyncio.sleep(0.01)
    worker.delivery = deliveries[0]
    await worker.say("ab")
    result = {"status_code": 200, "body": {"object": "text_completion", "choices": [
        {"index": 0, "text": "abc", "finish_reason": "length"}], "usage": {"total_tokens": 2}}}
    await queue.finish(worker.delivery, JobStatus.SUCCEEDED, result=result)
    chunks = events((await call).text)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == "abc"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-1] == "[DONE]"
    assert all(c["object"] == "text_completion" for c in chunks[:-1])


async def test_stream_and_no_stream_with_one_key_are_one_job(client: httpx.AsyncClient, queue: Queue) -> None:
    headers = {**A, "Idempotency-Key": "same"}
    call = asyncio.create_task(client.post("/v1/chat/completions", json={**BODY, "stream": True}, headers=headers))
    job_id = await served(queue)
    await call
    again = await client.post("/v1/chat/completions", json={**BODY, "stream": False}, headers=headers)
    assert again.status_code == 200 and again.headers["inferq-job-id"] == job_id


async def test_the_priority_header_picks_the_lane(client: httpx.AsyncClient, queue: Queue) -> None:
    call = asyncio.create_task(client.post("/v1/chat/completions", json=BODY,
                                           headers={**A, "inferq-priority": "high"}))
    await asyncio.sleep(0.1)
    [entry] = await queue.redis.xrange(queue.keys.stream_of(Priority.HIGH))
    await served(queue)
    assert (await call).headers["inferq-job-id"] == entry[1]["job"]
    assert_envelope(await client.post("/v1/chat/completions", json=BODY, headers={**A, "inferq-priority": "top"}),
                    422, "invalid_request")


async def test_the_continuation_header_opts_the_job_out(client: httpx.AsyncClient, queue: Queue) -> None:
    call = asyncio.create_task(client.post("/v1/chat/completions", json=BODY,
                                           headers={**A, "inferq-continuation": "off"}))
    job_id = await served(queue)
    assert (await call).headers["inferq-job-id"] == job_id
    assert (await queue.redis.hget(queue.keys.job(job_id), "continuation")) == "0"
    assert_envelope(await client.post("/v1/chat/completions", json=BODY, headers={**A, "inferq-continuation": "no"}),
                    422, "invalid_request")


@pytest.mark.parametrize("body,field", [
    (b"not json", "body"), (b"[1]", "body"), (json.dumps({**BODY, "stream": "yes"}).encode(), "body.stream"),
    (json.dumps({**BODY, "stream_options": {"include_usage": 1}}).encode(), "include_usage"),
    (json.dumps({**BODY, "n": 99}).encode(), "body.n"), (b'{"prompt": "\\ud800"}', "body"),
])
async def test_a_bad_body_is_422_and_queues_nothing(client: httpx.AsyncClient, queue: Queue, body: bytes,
                                                    field: str) -> None:
    response = await client.post("/v1/chat/completions", content=body, headers=A)
    assert_envelope(response, 422, "invalid_request")
    assert field in response.json()["error"]["message"]
    assert "inferq-job-id" not in response.headers
    assert await queue.redis.xlen(queue.keys.stream) == 0


async def test_the_front_door_needs_a_key(client: httpx.AsyncClient) -> None:
    assert_envelope(await client.post("/v1/chat/completions", json=BODY), 401, "unauthorized")


async def test_a_call_past_the_tenants_waits_is_429_and_queues_nothing(
        make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue) -> None:
    client = open_client(make_app(tenant_max_waits=1))
    submitted = await client.post("/v1/jobs", json={"body": BODY}, headers=A)
    job_id = submitted.json()["id"]
    holding = asyncio.create_task(client.get(f"/v1/jobs/{job_id}/stream", params={"wait": 20}, headers=A))

    async def slot_taken() -> bool:
        return bool(await queue.redis.zcard(queue.keys.waits("tenant-a")) == 1)

    await eventually_async(slot_taken, what="the stream's wait holding the tenant's one slot")
    assert not holding.done()
    for stream in (False, True):
        refused = await client.post("/v1/chat/completions", json={**BODY, "stream": stream}, headers=A)
        assert_envelope(refused, 429, "rate_limited")
        assert "Retry-After" in refused.headers
    assert await queue.redis.xlen(queue.keys.stream) == 1  # only the first job
    assert_envelope(await client.get(f"/v1/jobs/{job_id}/stream", params={"wait": 5}, headers=A), 429,
                    "rate_limited")
    await client.post(f"/v1/jobs/{job_id}/cancel", headers=A)
    assert (await asyncio.wait_for(holding, 10.0)).json()["done"]
