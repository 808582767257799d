"""POST /v1/jobs against a real Valkey: 202, replay 200, 409, 413, 422, 429, 401 — all in the error envelope."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from inferq.config.settings import Settings
from inferq.queue.protocol import Queue
from tests.support.queued import queued

from .conftest import AppFactory
from .support import CHAT, A, B


def assert_envelope(response: httpx.Response, status: int, type_: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    data = response.json()
    assert set(data["error"]) == {"type", "message"}
    assert isinstance(data["error"]["message"], str) and data["error"]["message"]
    if type_ is not None:
        assert data["error"]["type"] == type_
    return data


async def test_submit_answers_202_with_the_job_and_its_location(client: httpx.AsyncClient, queue: Queue) -> None:
    request = {"body": {"model": "m", "prompt": "hi"}, "url": "/v1/completions", "metadata": {"k": "v"},
               "timeout_s": 30, "ttl_s": 60,
               "webhook_url": "https://hooks.example.com/done"}
    response = await client.post("/v1/jobs", json=request, headers=A)
    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert set(job) == {"id", "object", "status", "url", "attempts", "created_at", "started_at", "finished_at",
                        "result", "error", "dead_lettered", "metadata", "priority"}
    assert job["object"] == "job" and job["status"] == "queued" and job["url"] == "/v1/completions"
    assert job["priority"] == "normal"
    assert job["metadata"] == {"k": "v"} and job["attempts"] == 1 and job["dead_lettered"] is False
    stored = await queue.get(job["id"])
    assert stored is not None
    assert stored.tenant == "tenant-a" and stored.body == request["body"]
    assert (stored.timeout_s, stored.ttl_s, stored.webhook_url) == (30, 60, "https://hooks.example.com/done")
    assert await queue.redis.xlen(queue.keys.stream) == 1


async def test_a_job_may_opt_out_of_continuation_and_a_replay_must_say_the_same(
    client: httpx.AsyncClient, queue: Queue
) -> None:
    default = (await client.post("/v1/jobs", json=CHAT, headers=A)).json()
    assert (await queue.get(default["id"])).continuation is True  # type: ignore[union-attr]
    assert "continuation" not in await queue.redis.hgetall(queue.keys.job(default["id"]))  # the default costs nothing
    request = {**CHAT, "continuation": False, "idempotency_key": "restart-me"}
    opted = await client.post("/v1/jobs", json=request, headers=A)
    assert opted.status_code == 202, opted.text
    assert (await queue.get(opted.json()["id"])).continuation is False  # type: ignore[union-attr]
    assert (await client.post("/v1/jobs", json=request, headers=A)).status_code == 200  # the same request
    other = await client.post("/v1/jobs", json={**request, "continuation": True}, headers=A)
    assert_envelope(other, 409)  # the same key with another request
    assert_envelope(await client.post("/v1/jobs", json={**CHAT, "continuation": "no"}, headers=A), 422)


async def test_submit_forwards_a_valid_traceparent_and_drops_a_malformed_one(
    client: httpx.AsyncClient, queue: Queue
) -> None:
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    good = (await client.post("/v1/jobs", json=CHAT, headers={**A, "traceparent": trace})).json()
    bad = (await client.post("/v1/jobs", json=CHAT, headers={**A, "traceparent": "not-a-trace"})).json()
    assert (await queue.get(good["id"])).traceparent == trace  # type: ignore[union-attr]
    assert (await queue.get(bad["id"])).traceparent is None  # type: ignore[union-attr]


async def test_replay_with_the_same_key_answers_200_with_the_same_job(client: httpx.AsyncClient) -> None:
    request = {**CHAT, "idempotency_key": "order-1"}
    first = await client.post("/v1/jobs", json=request, headers=A)
    again = await client.post("/v1/jobs", json=request, headers=A)
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]


async def test_the_idempotency_key_header_works_like_the_body_field(client: httpx.AsyncClient) -> None:
    by_header = await client.post("/v1/jobs", json=CHAT, headers={**A, "Idempotency-Key": "k-1"})
    by_body = await client.post("/v1/jobs", json={**CHAT, "idempotency_key": "k-1"}, headers=A)
    both = await client.post("/v1/jobs", json={**CHAT, "idempotency_key": "k-1"},
                             headers={**A, "Idempotency-Key": "k-1"})
    assert by_header.status_code == 202
    assert by_body.status_code == both.status_code == 200
    assert by_header.json()["id"] == by_body.json()["id"] == both.json()["id"]


async def test_header_and_body_keys_that_differ_are_422(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/jobs", json={**CHAT, "idempotency_key": "a"},
                                 headers={**A, "Idempotency-Key": "b"})
    assert_envelope(response, 422, "invalid_request")


async def test_same_key_with_another_request_is_409(client: httpx.AsyncClient) -> None:
    await client.post("/v1/jobs", json={**CHAT, "idempotency_key": "k"}, headers=A)
    other = {"body": {**CHAT["body"], "model": "other"}, "idempotency_key": "k"}
    assert_envelope(await client.post("/v1/jobs", json=other, headers=A), 409, "idempotency_conflict")


async def test_idempotency_keys_are_per_tenant(client: httpx.AsyncClient) -> None:
    request = {**CHAT, "idempotency_key": "shared"}
    a = await client.post("/v1/jobs", json=request, headers=A)
    b = await client.post("/v1/jobs", json={"body": {**CHAT["body"], "n": 2}, "idempotency_key": "shared"}, headers=B)
    assert a.status_code == b.status_code == 202
    assert a.json()["id"] != b.json()["id"]


async def test_concurrent_identical_submits_make_exactly_one_job_and_one_entry(
    client: httpx.AsyncClient, queue: Queue
) -> None:
    request = {**CHAT, "idempotency_key": "burst"}
    responses = await asyncio.gather(*(client.post("/v1/jobs", json=request, headers=A) for _ in range(24)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 23 + [202]
    assert len({r.json()["id"] for r in responses}) == 1
    assert await queue.redis.xlen(queue.keys.stream) == 1
    assert (await queue.stats())["enqueued"] == 1
    job_keys = [k async for k in queue.redis.scan_iter(match=queue.keys.prefix + "job:*")]
    assert len(job_keys) == 1


INVALID: list[tuple[str, Any]] = [
    ("body missing", {"url": "/v1/chat/completions"}),
    ("body not an object", {"body": [1, 2]}),
    ("body a string", {"body": "hello"}),
    ("request not an object", [CHAT]),
    ("request null", None),
    ("unknown url", {**CHAT, "url": "/v1/embeddings"}),
    ("unknown field", {**CHAT, "priority": 1}),
    ("empty idempotency key", {**CHAT, "idempotency_key": ""}),
    ("idempotency key too long", {**CHAT, "idempotency_key": "k" * 256}),
    ("metadata not strings", {**CHAT, "metadata": {"a": 1}}),
    ("too many metadata pairs", {**CHAT, "metadata": {f"k{i}": "v" for i in range(17)}}),
    ("metadata key too long", {**CHAT, "metadata": {"k" * 65: "v"}}),
    ("metadata key empty", {**CHAT, "metadata": {"": "v"}}),
    ("metadata value too long", {**CHAT, "metadata": {"k": "v" * 513}}),
    ("timeout zero", {**CHAT, "timeout_s": 0}),
    ("timeout too long", {**CHAT, "timeout_s": 3601}),
    ("timeout a string", {**CHAT, "timeout_s": "30"}),
    ("timeout a float", {**CHAT, "timeout_s": 30.5}),
    ("timeout a bool", {**CHAT, "timeout_s": True}),
    ("ttl zero", {**CHAT, "ttl_s": 0}),
    ("ttl huge", {**CHAT, "ttl_s": 10**30}),
    ("webhook http", {**CHAT, "webhook_url": "http://hooks.example.com/x"}),
    ("webhook no host", {**CHAT, "webhook_url": "https:///x"}),
    ("webhook with credentials", {**CHAT, "webhook_url": "https://user:pw@hooks.example.com/"}),
    ("webhook not a string", {**CHAT, "webhook_url": 42}),
]


@pytest.mark.parametrize(("case", "request_body"), INVALID, ids=[c for c, _ in INVALID])
async def test_invalid_requests_are_422_in_the_envelope(
    client: httpx.AsyncClient, queue: Queue, case: str, request_body: Any
) -> None:
    response = await client.post("/v1/jobs", content=json.dumps(request_body), headers=A)
    assert_envelope(response, 422, "invalid_request")
    assert await queue.redis.xlen(queue.keys.stream) == 0


METADATA_BOUNDS: list[tuple[Any, str]] = [
    ({f"k{i}": "v" for i in range(17)}, "body.metadata: at most 16 pairs (OpenAI's limit); this has 17"),
    ({"k" * 65: "v"}, "body.metadata: keys are 1-64 characters (OpenAI's limit); one has 65"),
    ({"k": "é" * 513}, "body.metadata: values are at most 512 characters (OpenAI's limit); the value of key 'k' has "
                       "513"),
]


@pytest.mark.parametrize(("metadata", "message"), METADATA_BOUNDS, ids=["pairs", "key", "value"])
async def test_metadata_past_openais_bounds_is_422_naming_the_bound_and_never_echoing_the_text(
    client: httpx.AsyncClient, metadata: Any, message: str
) -> None:
    response = await client.post("/v1/jobs", json={**CHAT, "metadata": metadata}, headers=A)
    assert assert_envelope(response, 422, "invalid_request")["error"]["message"] == message


async def test_metadata_at_openais_bounds_is_kept_whole_characters_not_bytes(client: httpx.AsyncClient) -> None:
    # 16 pairs, 64-character keys, 512-character values of a four-byte character: at the bounds, in characters
    metadata = {f"{i:02d}" + "k" * 62: "\U0001f600" * 512 for i in range(16)}
    response = await client.post("/v1/jobs", json={**CHAT, "metadata": metadata}, headers=A)
    assert response.status_code == 202, response.text
    assert response.json()["metadata"] == metadata
    read = await client.get(f"/v1/jobs/{response.json()['id']}", headers=A)
    assert read.json()["metadata"] == metadata


async def test_a_batch_api_line_and_null_defaults_are_accepted(client: httpx.AsyncClient) -> None:
    line = {"custom_id": "request-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "hi"}}
    response = await client.post("/v1/jobs", json=line, headers=A)
    assert response.status_code == 202, response.text
    assert response.json()["url"] == "/v1/completions"
    response = await client.post("/v1/jobs", json={**CHAT, "url": None, "metadata": None}, headers=A)
    assert response.status_code == 202, response.text
    assert response.json()["url"] == "/v1/chat/completions" and response.json()["metadata"] == {}
    assert (await client.post("/v1/jobs", json={**line, "method": "GET"}, headers=A)).status_code == 422


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"", b'{"body": {}', b"\xff\xfe", b'{"body": {"a": "\\ud800"}}', b"[" * 5000],
    ids=["syntax", "empty", "truncated", "not utf-8", "lone surrogate", "deep nesting"],
)
async def test_undecodable_bodies_are_client_errors_never_500(client: httpx.AsyncClient, raw: bytes) -> None:
    response = await client.post("/v1/jobs", content=raw, headers={**A, "content-type": "application/json"})
    assert response.status_code in (400, 422), response.text
    assert_envelope(response, response.status_code)


async def test_the_error_never_echoes_the_prompt(client: httpx.AsyncClient) -> None:
    secret = "my secret prompt text"
    response = await client.post("/v1/jobs", json={"body": {"messages": secret}, "timeout_s": secret}, headers=A)
    assert_envelope(response, 422)
    assert secret not in response.text


async def test_over_the_body_limit_is_413_by_content_length_without_parsing(
    make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient], queue: Queue
) -> None:
    client = open_client(make_app(max_body_bytes=1024))
    # Not JSON at all: a parser would say 422. 413 proves the size was checked first.
    response = await client.post("/v1/jobs", content=b"x" * 1025, headers=A)
    assert_envelope(response, 413, "request_too_large")
    fits = {"url": "/v1/completions", "body": {"prompt": "y" * 900}}
    assert (await client.post("/v1/jobs", json=fits, headers=A)).status_code == 202


async def test_over_the_body_limit_is_413_when_streamed_without_content_length(
    make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    client = open_client(make_app(max_body_bytes=1024))
    sent = []

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(100):
            sent.append(1)
            yield b"z" * 100

    response = await client.post("/v1/jobs", content=chunks(), headers=A)
    assert "content-length" not in response.request.headers
    assert_envelope(response, 413, "request_too_large")
    assert len(sent) < 100  # reading stopped at the limit


async def test_a_declared_length_past_the_limit_is_refused_before_reading(
    make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    client = open_client(make_app(max_body_bytes=1024))
    response = await client.post("/v1/jobs", content=b"{}", headers={**A, "content-length": "999999"})
    assert_envelope(response, 413)


async def test_full_queue_is_429_with_retry_after(
    make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient], queue: Queue
) -> None:
    client = open_client(make_app(max_queue_depth=2))
    for _ in range(2):
        assert (await client.post("/v1/jobs", json=CHAT, headers=A)).status_code == 202
    response = await client.post("/v1/jobs", json=CHAT, headers=A)
    assert_envelope(response, 429, "queue_full")
    assert int(response.headers["retry-after"]) > 0
    assert len(await queued(queue)) == 2


async def test_auth_is_checked_before_the_body(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/jobs", content=b"{not json")
    assert_envelope(response, 401, "unauthorized")
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-key-000"}, {"x-api-key": "wrong-key-000"},
     {"Authorization": "Basic a2V5LXRlbmFudC1hLTAwMDE="}, {"Authorization": "Bearer "}],
    ids=["none", "bad bearer", "bad x-api-key", "basic scheme", "empty bearer"],
)
async def test_missing_or_unknown_keys_are_401(client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    assert_envelope(await client.post("/v1/jobs", json=CHAT, headers=headers), 401, "unauthorized")


async def test_metrics_count_enqueued_replays_and_rejections_by_reason(
    client: httpx.AsyncClient, app: Any
) -> None:
    await client.post("/v1/jobs", json={**CHAT, "idempotency_key": "m"}, headers=A)
    await client.post("/v1/jobs", json={**CHAT, "idempotency_key": "m"}, headers=A)
    await client.post("/v1/jobs", json={"body": 1}, headers=A)
    await client.post("/v1/jobs", json=CHAT)
    totals = app.state.telemetry.totals
    assert totals["JobsEnqueued"] == 1
    assert totals["IdempotentReplays"] == 1
    assert totals["JobsRejected.invalid"] == 1
    assert totals["JobsRejected.unauthorized"] == 1


async def test_an_unexpected_failure_is_500_in_the_envelope(
    make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient], settings: Settings
) -> None:
    class Broken(Queue):
        async def enqueue(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("bug")

    client = open_client(make_app(queue=Broken(None, settings)))
    assert_envelope(await client.post("/v1/jobs", json=CHAT, headers=A), 500, "internal_error")

