"""The gateway's half of issue 40, against a real Valkey: a body the engine cannot take is a 422 naming the field
(and nothing is queued); a priority above the tenant's ceiling is 403; queue-wide numbers are for operator tenants;
the per-tenant rate limit is a 429 with ``Retry-After``, shared by every gateway instance."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from inferq.queue.jobs import Priority
from inferq.queue.protocol import Queue
from tests.support.queued import queued

from .conftest import AppFactory
from .support import CHAT, A, B
from .test_submit import assert_envelope

Open = Callable[[FastAPI], httpx.AsyncClient]


def _job(**body: Any) -> dict[str, Any]:
    return {"body": {**CHAT["body"], **body}}


async def _queued(queue: Queue) -> int:
    return sum([len(await queued(queue, lane)) for lane in Priority])


# ---------------------------------------------------------------- the body the engine receives


@pytest.mark.parametrize(("body", "field"), [
    ({"guided_json": {"type": "object", "properties": {"a": {"type": 12}}}}, "guided_json"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_regex": "a" * 5000}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": ""}, "guided_grammar"),
    ({"guided_json": {"type": "string"}, "guided_regex": "a+"}, "guided_regex"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "[z-a]"}}, "structured_outputs.regex"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"required": "a"}}}]},
     "tools[0].function.parameters"),
    ({"n": 1000}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"logprobs": 5}, "logprobs"),
    ({"top_logprobs": 50}, "top_logprobs"),
    ({"stop": ["x"] * 100}, "stop"),
    ({"temperature": "hot"}, "temperature"),
    ({"stream": True}, "stream"),
    ({"chat_template": "{{ 7*7 }}"}, "chat_template"),
    ({"messages": "hi"}, "messages"),
])
async def test_a_body_the_engine_cannot_take_is_422_naming_the_field_and_nothing_is_queued(
    client: httpx.AsyncClient, queue: Queue, body: dict[str, Any], field: str
) -> None:
    response = await client.post("/v1/jobs", json=_job(**body), headers=A)
    data = assert_envelope(response, 422, "invalid_request")
    assert data["error"]["message"].startswith(f"body.{field}:"), data
    assert await _queued(queue) == 0


@pytest.mark.parametrize("depth", [40, 3000])
async def test_a_deeply_nested_schema_is_refused_without_a_server_error(
    client: httpx.AsyncClient, queue: Queue, depth: int
) -> None:
    schema = '{"type": "array", "items": ' * depth + '{"type": "string"}' + "}" * depth
    raw = '{"body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "guided_json": ' + schema + "}}"
    response = await client.post("/v1/jobs", content=raw, headers={**A, "content-type": "application/json"})
    assert_envelope(response, 422, "invalid_request")
    assert await _queued(queue) == 0


@pytest.mark.parametrize("body", [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}},
    {"response_format": {"type": "json_object"}},
    {"structured_outputs": {"json": {"type": "number"}}},
    {"n": 2, "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "seed": 7, "stop": ["\n"], "user": "u-1",
     "stream": False, "logprobs": True, "top_logprobs": 3},
    # vLLM's sampling extras (issue 47)
    {"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "seed": 1234, "response_format": {"type": "json_object"}},
    {"mock": {"latency_ms": 5, "fail_attempts": 1}},
])
async def test_ordinary_openai_requests_and_the_mock_controls_are_accepted_as_they_are(
    client: httpx.AsyncClient, queue: Queue, body: dict[str, Any]
) -> None:
    response = await client.post("/v1/jobs", json=_job(**body), headers=A)
    assert response.status_code == 202, response.text
    stored = await queue.get(response.json()["id"], "tenant-a")
    assert stored is not None and stored.body == {**CHAT["body"], **body}


@pytest.mark.parametrize(("body", "outputs"), [
    ({"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}},
     {"json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}),
    ({"guided_json": '{"type": "string"}'}, {"json": '{"type": "string"}'}),
    ({"guided_regex": r"\d{3}-[a-z]+"}, {"regex": r"\d{3}-[a-z]+"}),
    ({"guided_choice": ["yes", "no"]}, {"choice": ["yes", "no"]}),
])
async def test_the_guided_fields_are_queued_as_the_structured_outputs_vllm_reads(
    client: httpx.AsyncClient, queue: Queue, body: dict[str, Any], outputs: dict[str, Any]
) -> None:
    response = await client.post("/v1/jobs", json=_job(**body), headers=A)
    assert response.status_code == 202, response.text
    stored = await queue.get(response.json()["id"], "tenant-a")
    assert stored is not None and stored.body == {**CHAT["body"], "structured_outputs": outputs}


@pytest.mark.parametrize(("body", "field"), [
    ({"guided_grammar": "((((("}, "guided_grammar"),
    ({"guided_json": {"type": "object"}, "guided_whitespace_pattern": "(["}, "guided_whitespace_pattern"),
    ({"guided_regex": "(a{65535}){65535}"}, "guided_regex"),
    ({"guided_json": {"type": "string", "minLength": 1e8}}, "guided_json"),
    ({"chat_template_kwargs": {"chat_template": "{{ 7*7 }}"}}, "chat_template_kwargs.chat_template"),
    ({"structural_tag": {"structures": [], "triggers": []}}, "structural_tag"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "https://example.com/cat.png"}}]}]}, "messages[0].content[0].image_url"),
    ({"some_engine_extra": {"kept": True}}, "some_engine_extra"),
])
async def test_what_the_review_found_accepted_is_now_422_naming_the_field(
    client: httpx.AsyncClient, queue: Queue, body: dict[str, Any], field: str
) -> None:
    response = await client.post("/v1/jobs", json=_job(**body), headers=A)
    data = assert_envelope(response, 422, "invalid_request")
    assert data["error"]["message"].startswith(f"body.{field}:"), data
    assert await _queued(queue) == 0


async def test_a_completions_request_takes_logprobs_as_a_count(client: httpx.AsyncClient) -> None:
    job = {"url": "/v1/completions", "body": {"model": "m", "prompt": "hi", "logprobs": 5}}
    assert (await client.post("/v1/jobs", json=job, headers=A)).status_code == 202
    job["body"]["logprobs"] = True
    assert (await client.post("/v1/jobs", json=job, headers=A)).status_code == 422


# ---------------------------------------------------------------- priority ceiling


async def test_a_priority_above_the_tenants_ceiling_is_403_and_at_or_below_it_is_accepted(
    make_app: AppFactory, open_client: Open, queue: Queue
) -> None:
    from inferq.queue.jobs import Priority

    client = open_client(make_app(max_priority=Priority.NORMAL, tenant_max_priority={"tenant-b": Priority.HIGH}))
    refused = await client.post("/v1/jobs", json={**CHAT, "priority": "high"}, headers=A)
    assert "ceiling" in assert_envelope(refused, 403, "priority_not_allowed")["error"]["message"]
    assert await _queued(queue) == 0
    for lane in ("normal", "low"):
        assert (await client.post("/v1/jobs", json={**CHAT, "priority": lane}, headers=A)).status_code == 202
    allowed = await client.post("/v1/jobs", json={**CHAT, "priority": "high"}, headers=B)
    assert allowed.status_code == 202 and allowed.json()["priority"] == "high"


async def test_a_tenants_default_lane_above_its_ceiling_is_capped(
    make_app: AppFactory, open_client: Open
) -> None:
    from inferq.queue.jobs import Priority

    client = open_client(make_app(max_priority=Priority.LOW, tenant_priorities={"tenant-a": Priority.HIGH}))
    response = await client.post("/v1/jobs", json=CHAT, headers=A)
    assert response.status_code == 202 and response.json()["priority"] == "low"


async def test_by_default_every_tenant_may_pick_any_lane(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/jobs", json={**CHAT, "priority": "high"}, headers=B)
    assert response.status_code == 202 and response.json()["priority"] == "high"


# ---------------------------------------------------------------- operator views


async def test_queue_wide_numbers_are_for_operator_tenants_only(
    make_app: AppFactory, open_client: Open
) -> None:
    client = open_client(make_app(admin_tenants=frozenset({"tenant-b"})))
    for _ in range(3):
        assert (await client.post("/v1/jobs", json=CHAT, headers=B)).status_code == 202
    assert (await client.post("/v1/jobs", json=CHAT, headers=A)).status_code == 202

    for path in ("/v1/scale", "/v1/stats/history"):
        assert_envelope(await client.get(path, headers=A), 403, "operator_only")
        assert (await client.get(path, headers=B)).status_code == 200
    assert (await client.get("/v1/scale", headers=B)).json()["lag"] == 4
    # fair share: tenant-b's first job is the stream's one entry; the rest wait for their turn, shown per tenant
    view = (await client.get("/v1/scale", params={"by_tenant": "true"}, headers=B)).json()
    assert view["lag"] == 4 and view["waiting"] == {"tenant-b": {"normal": 2}, "tenant-a": {"normal": 1}}
    assert_envelope(await client.get("/v1/scale", params={"by_tenant": "true"}, headers=A), 403, "operator_only")

    tenant_view = (await client.get("/v1/models", headers=A)).json()["data"][0]["inferq"]
    assert tenant_view["unfinished"] == 1  # its own job, nothing of tenant-b's three
    assert tenant_view["lag"] is tenant_view["pending"] is tenant_view["desired"] is tenant_view["running"] is None
    operator_view = (await client.get("/v1/models", headers=B)).json()["data"][0]["inferq"]
    assert operator_view["lag"] == 4 and "unfinished" not in operator_view
    assert "waiting" not in operator_view  # asked for only
    by_tenant = (await client.get("/v1/models", params={"by_tenant": "true"}, headers=B)).json()
    assert by_tenant["data"][0]["inferq"]["waiting"] == {"tenant-b": 2, "tenant-a": 1}
    mine = (await client.get("/v1/models", params={"by_tenant": "true"}, headers=A)).json()
    assert "waiting" not in mine["data"][0]["inferq"]  # the others' volume is not a tenant's to see


async def test_without_operator_tenants_configured_every_tenant_sees_the_queue(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v1/jobs", json=CHAT, headers=B)).status_code == 202
    assert (await client.get("/v1/scale", headers=A)).json()["lag"] == 1


# ---------------------------------------------------------------- rate limit


async def test_the_rate_limit_is_429_with_retry_after_shared_by_every_gateway_and_per_tenant(
    make_app: AppFactory, open_client: Open, queue: Queue
) -> None:
    one = open_client(make_app(rate_limit_per_s=0.5, rate_limit_burst=3))
    two = open_client(make_app(rate_limit_per_s=0.5, rate_limit_burst=3))  # another gateway instance
    statuses = [(await client.post("/v1/jobs", json=CHAT, headers=A)).status_code for client in (one, two, one)]
    assert statuses == [202, 202, 202]
    for client in (two, one):
        refused = await client.get("/v1/dlq", headers=A)  # every authenticated route counts
        data = assert_envelope(refused, 429, "rate_limited")
        assert "rate limit" in data["error"]["message"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 2
    assert (await two.post("/v1/jobs", json=CHAT, headers=B)).status_code == 202  # another tenant: its own
    assert await _queued(queue) == 4
    assert (await one.get("/healthz")).status_code == 200  # health stays free


async def test_no_rate_limit_by_default(client: httpx.AsyncClient, queue: Queue) -> None:
    for _ in range(30):
        assert (await client.get("/v1/dlq", headers=A)).status_code == 200
    assert await queue.redis.keys(queue.keys.rate("*")) == []


async def test_image_parts_go_only_to_a_model_the_registry_marks_multimodal(
    make_app: AppFactory, open_client: Open, settings: Any, tmp_path: Any
) -> None:
    import json

    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [
        {"name": "vision", "queue": f"{settings.queue}-v", "multimodal": True},
        {"name": "text", "queue": f"{settings.queue}-t"}]}))
    client = open_client(make_app(models=str(path)))
    png = "data:image/png;base64,iVBORw0KGgo="
    parts = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": png}}]
    image = {"messages": [{"role": "user", "content": parts}]}
    assert (await client.post("/v1/jobs", json={"body": {"model": "vision", **image}}, headers=A)).status_code == 202
    refused = await client.post("/v1/jobs", json={"body": {"model": "text", **image}}, headers=A)
    message = assert_envelope(refused, 422, "invalid_request")["error"]["message"]
    assert message.startswith("body.messages[0].content[1].image_url:"), message
    remote = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "https://169.254.169.254/latest/meta-data/"}}]}]}
    refused = await client.post("/v1/jobs", json={"body": {"model": "vision", **remote}}, headers=A)
    assert assert_envelope(refused, 422)["error"]["message"].startswith("body.messages[0].content[0].image_url.url:")
