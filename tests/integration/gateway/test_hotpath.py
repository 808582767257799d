"""The app-level fast path of submit and get (functions.gateway.hotpath.HotApp): taken for them, never for the other
routes, not while OpenTelemetry is configured, and answering exactly what the full FastAPI stack answers, errors
and declined requests included."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRouter

from functions.gateway import hotpath
from tests.support.clock import FakeClock

from .conftest import AppFactory
from .support import CHAT, A, B

UNKNOWN_ID = "job_aaaaaaaaaaaaaaaaaaaaaaaaaa"
_VOLATILE = re.compile(r'"(id|created_at|started_at|finished_at)":("job_[a-z2-7_]+"|[0-9.]+|null)')


@pytest.fixture
def router_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths of the requests that went through the app's router (the full stack). Ask for it before the app: the
    router binds its entry point when it is made."""
    calls: list[str] = []
    full = APIRouter.app

    async def app(self: APIRouter, scope: Any, receive: Any, send: Any) -> None:
        calls.append(f"{scope['method']} {scope['path']}")
        await full(self, scope, receive, send)

    monkeypatch.setattr(APIRouter, "app", app)
    return calls


def _comparable(response: httpx.Response) -> tuple[int, str, dict[str, str]]:
    headers = {k: v for k, v in response.headers.items() if k not in ("x-request-id", "location", "content-length")}
    return response.status_code, _VOLATILE.sub(r'"\1":"*"', response.text), headers


# (method, path, headers, body): every one answered by the hot stack and by the full one
REQUESTS: list[tuple[str, str, dict[str, str], Any]] = [
    ("POST", "/v1/jobs", A, CHAT),
    ("POST", "/v1/jobs", {**A, "Idempotency-Key": "same-key"}, CHAT),  # 202, then an idempotent replay (200)
    ("POST", "/v1/jobs", {**A, "Idempotency-Key": "same-key"}, CHAT),
    ("POST", "/v1/jobs", {**A, "Idempotency-Key": "same-key"}, {"body": {**CHAT["body"], "model": "other"}}),  # 409
    ("POST", "/v1/jobs", {**A, "Idempotency-Key": ""}, CHAT),  # declined by the fast path: FastAPI's 422
    ("POST", "/v1/jobs", {**A, "Idempotency-Key": "k" * 300}, CHAT),
    ("POST", "/v1/jobs", {**A, "Idempotency-Key": "x"}, {**CHAT, "idempotency_key": "y"}),  # header and body differ
    ("POST", "/v1/jobs", {}, CHAT),  # 401 before the body is read
    ("POST", "/v1/jobs", {"Authorization": "Bearer nope"}, CHAT),
    ("POST", "/v1/jobs", B, {"body": "not an object"}),  # 422
    ("POST", "/v1/jobs", A, b"{not json"),
    ("POST", "/v1/jobs", A, b"\xff\xfe"),
    ("POST", "/v1/jobs", A, b""),
    ("POST", "/v1/jobs", A, {"body": {"model": "m", "messages": []}, "priority": "urgent"}),
    ("POST", "/v1/jobs", A, {**CHAT, "webhook_url": "http://127.0.0.1/hook"}),  # a private webhook: 422
    ("POST", "/v1/jobs", A, {"body": {"model": "m", "prompt": "x" * 40_000}}),  # past the test's body limit: 413
    ("GET", "/v1/jobs/{id}", A, None),
    ("GET", "/v1/jobs/{id}?wait=0", A, None),
    ("GET", "/v1/jobs/{id}?wait=0.05", A, None),
    ("GET", "/v1/jobs/{id}?wait=0.05&wait=abc", A, None),
    ("GET", "/v1/jobs/{id}?wait=abc", A, None),  # declined: FastAPI's 422
    ("GET", "/v1/jobs/{id}?wait=-1", A, None),
    ("GET", "/v1/jobs/{id}?wait=1e-2", A, None),
    ("GET", "/v1/jobs/{id}?wait=21", A, None),
    ("GET", "/v1/jobs/{id}?wait=", A, None),
    ("GET", "/v1/jobs/{id}", B, None),  # another tenant's job: 404
    ("GET", "/v1/jobs/{id}", {}, None),
    ("GET", f"/v1/jobs/{UNKNOWN_ID}", A, None),
    ("GET", "/v1/jobs/nope", A, None),
    ("GET", "/v1/jobs/", A, None),
    ("HEAD", "/v1/jobs/{id}", A, None),  # no such route method: 405 from the router
    ("PUT", "/v1/jobs", A, CHAT),
]


async def _answers(client: httpx.AsyncClient, job_id: str, key_prefix: str) -> list[tuple[int, str, dict[str, str]]]:
    """The answers to REQUESTS, idempotency keys prefixed (both stacks share the queue)."""
    answers = []
    for method, path, given, body in REQUESTS:
        headers = {k: key_prefix + v if k == "Idempotency-Key" and v == "same-key" else v for k, v in given.items()}
        content = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
        sent = {**headers, **({"content-type": "application/json"} if content is not None else {})}
        response = await client.request(method, path.replace("{id}", job_id), headers=sent, content=content)
        answers.append(_comparable(response))
    return answers


async def test_the_hot_stack_answers_every_request_as_the_full_stack_does(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], router_calls: list[str]
) -> None:
    answers = {}
    for hot in (True, False):
        app = make_app(max_body_bytes=32_768)
        app.hot_paths = hot  # type: ignore[attr-defined]
        client = open_client(app)
        first = await client.post("/v1/jobs", json=CHAT, headers=A)
        assert first.status_code == 202
        router_calls.clear()
        answers[hot] = await _answers(client, first.json()["id"], key_prefix=f"{hot}-")
        if hot:  # only the other routes and methods reach the router (what a fast path declines takes its route)
            assert router_calls == ["GET /v1/jobs/", f"HEAD /v1/jobs/{first.json()['id']}", "PUT /v1/jobs"]
        else:
            assert len(router_calls) == len(REQUESTS) - 1  # the 413 is Edge's, before any route
    for request, hot_answer, full_answer in zip(REQUESTS, answers[True], answers[False], strict=True):
        assert hot_answer == full_answer, request
    statuses = {status for status, _, _ in answers[True]}
    assert {200, 202, 401, 404, 405, 409, 413, 422} <= statuses


async def test_submit_and_get_skip_the_router_and_nothing_else_does(
    router_calls: list[str], client: httpx.AsyncClient
) -> None:
    submitted = await client.post("/v1/jobs", json=CHAT, headers=A)
    assert submitted.status_code == 202 and submitted.headers["x-request-id"]
    job_id = submitted.json()["id"]
    got = await client.get(f"/v1/jobs/{job_id}?wait=0.01", headers=A)
    assert got.status_code == 200 and got.json()["id"] == job_id
    assert router_calls == []
    await client.post(f"/v1/jobs/{job_id}/cancel", headers=A)
    await client.get("/healthz")
    assert router_calls == [f"POST /v1/jobs/{job_id}/cancel", "GET /healthz"]


async def test_with_opentelemetry_configured_every_request_takes_the_full_stack(
    router_calls: list[str], app: FastAPI, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app._native_telemetry, "enabled", lambda: True)  # type: ignore[attr-defined]
    for _ in range(2):
        submitted = await client.post("/v1/jobs", json=CHAT, headers=A)
        assert submitted.status_code == 202
    assert router_calls == ["POST /v1/jobs"] * 2


async def test_a_provider_configured_while_the_app_runs_is_found_within_the_recheck_interval(
    router_calls: list[str], app: FastAPI, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(app, "telemetry_clock", clock)
    assert (await client.post("/v1/jobs", json=CHAT, headers=A)).status_code == 202
    monkeypatch.setattr(app._native_telemetry, "enabled", lambda: True)  # type: ignore[attr-defined]
    clock.advance(hotpath.TELEMETRY_RECHECK_S - 0.01)
    assert (await client.post("/v1/jobs", json=CHAT, headers=A)).status_code == 202  # FastAPI's "no" still kept
    assert router_calls == []
    clock.advance(0.01)
    assert (await client.post("/v1/jobs", json=CHAT, headers=A)).status_code == 202
    assert router_calls == ["POST /v1/jobs"]
