"""``GET /v1/usage`` (docs/api.md) on the gateway with a real Valkey: a tenant's own rows, another tenant's only for
an operator (403 ``operator_only`` otherwise, whatever ``INFERQ_ADMIN_TENANTS`` says of queue-wide numbers), the
estimated cost for operators, buckets, the range's checks, a registry's models summed per tenant across queues, and
the budget check a submit makes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from functions.gateway import metering
from inferq.config.parsers import Budget
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from inferq.usage.budgets import RECHECK_S
from inferq.usage.spend import Spend
from tests.support.clock import FakeClock
from tests.support.queued import read_all
from tests.support.s3 import in_process_bucket

from .conftest import AppFactory
from .support import KEYS, A, B
from .test_submit import assert_envelope

OPS = {"Authorization": "Bearer key-operator-0003"}
WITH_OPERATOR = {**KEYS, "key-operator-0003": "ops"}


async def run_all(queue: Queue, spend: Spend, status: JobStatus = JobStatus.SUCCEEDED) -> None:
    deliveries, _ = await read_all(queue, "w", 100)
    for d in deliveries:
        await queue.finish(d, status, result={} if status is JobStatus.SUCCEEDED else None,
                           error=None if status is JobStatus.SUCCEEDED else {"type": "x", "message": "y"},
                           spend=spend)


async def submit(client: httpx.AsyncClient, headers: dict[str, str], model: str = "m") -> None:
    body = {"body": {"model": model, "messages": [{"role": "user", "content": "hi"}]}}
    response = await client.post("/v1/jobs", json=body, headers=headers)
    assert response.status_code == 202, response.text


@pytest.fixture
def operated(make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]) -> httpx.AsyncClient:
    return open_client(make_app(keys=WITH_OPERATOR, admin_tenants=frozenset({"ops"}), gpu_hour_usd=3.6))


async def test_each_tenant_reads_its_own_usage_and_only_an_operator_another_s(
    operated: httpx.AsyncClient, queue: Queue
) -> None:
    for _ in range(2):
        await submit(operated, A)
    await submit(operated, B)
    await run_all(queue, Spend(1500, 1000, 3, 4))
    mine = (await operated.get("/v1/usage", headers=A)).json()
    assert mine["object"] == "usage" and mine["tenant"] == "tenant-a" and mine["end"] - mine["start"] == 86400
    assert mine["data"] == [{"model": "m", "lane": "normal",
                             "jobs": {"succeeded": 2, "failed": 0, "cancelled": 0, "expired": 0},
                             "prompt_tokens": 6, "completion_tokens": 8, "run_seconds": 3.0, "gpu_seconds": 2.0}]
    for asked in ("tenant-b", "*"):
        refused = await operated.get("/v1/usage", params={"tenant": asked}, headers=A)
        assert_envelope(refused, 403, "operator_only")
    assert (await operated.get("/v1/usage", params={"tenant": "tenant-a"}, headers=A)).status_code == 200
    every = (await operated.get("/v1/usage", params={"tenant": "*"}, headers=OPS)).json()
    assert [(r["tenant"], r["jobs"]["succeeded"], r["estimated_cost_usd"]) for r in every["data"]] == [
        ("tenant-a", 2, 0.002), ("tenant-b", 1, 0.001)]
    assert every["data"][0]["usd_per_million_tokens"] == round(0.002 / 14 * 1e6, 4)
    other = (await operated.get("/v1/usage", params={"tenant": "tenant-b"}, headers=OPS)).json()
    assert other["tenant"] == "tenant-b" and other["data"][0]["jobs"]["succeeded"] == 1


async def test_with_no_operator_named_no_tenant_reads_another_s_usage(client: httpx.AsyncClient) -> None:
    """Unset, every tenant sees queue-wide numbers (one team); a bill is still each tenant's own."""
    assert_envelope(await client.get("/v1/usage", params={"tenant": "tenant-a"}, headers=B), 403, "operator_only")
    assert_envelope(await client.get("/v1/usage", params={"tenant": "*"}, headers=B), 403, "operator_only")


@pytest.mark.parametrize("params", [{"start": "10", "end": "5"}, {"start": "-1"}, {"end": "x"},
                                    {"bucket": "week"}, {"tenant": "no such/tenant"}])
async def test_a_bad_range_or_name_is_422(operated: httpx.AsyncClient, params: dict[str, str]) -> None:
    assert_envelope(await operated.get("/v1/usage", params=params, headers=OPS), 422, "invalid_request")


async def test_buckets_split_the_rows_and_a_range_without_jobs_has_none(
    operated: httpx.AsyncClient, queue: Queue
) -> None:
    await submit(operated, A)
    await run_all(queue, Spend(10, 10, 1, 1), JobStatus.FAILED)
    hourly = (await operated.get("/v1/usage", params={"bucket": "hour"}, headers=A)).json()["data"]
    assert len(hourly) == 1 and hourly[0]["start"] == int(time.time()) // 3600 * 3600
    assert hourly[0]["jobs"]["failed"] == 1 and "estimated_cost_usd" not in hourly[0]
    long_ago = {"start": "0", "end": str(int(time.time()) - 10 * 86400)}
    assert (await operated.get("/v1/usage", params=long_ago, headers=A)).json()["data"] == []


async def test_a_registry_s_models_are_rows_of_their_own_priced_each_at_its_rate(
    tmp_path: Path, settings: Settings, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    from functions.gateway.api import create_app

    q = settings.queue
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"default": "chat", "models": [
        {"name": "chat", "queue": f"{q}-chat", "aliases": ["gpt-4o-mini"], "gpu_hour_usd": 7.2},
        {"name": "embed", "queue": f"{q}-embed"}]}))
    app = create_app(settings.replace(models=str(path), admin_tenants=frozenset({"ops"}), gpu_hour_usd=3.6),
                     keys=WITH_OPERATOR)
    client = open_client(app)
    for model in ("chat", "gpt-4o-mini", "embed"):
        await submit(client, A, model)
    for name in ("chat", "embed"):
        queue: Queue = app.state.gateway.queues.get(f"{q}-{name}")
        await run_all(queue, Spend(1000, 1000, 1, 1))
    rows = (await client.get("/v1/usage", params={"tenant": "tenant-a"}, headers=OPS)).json()["data"]
    assert [(r["model"], r["jobs"]["succeeded"], r["estimated_cost_usd"]) for r in rows] == [
        ("chat", 2, 0.004), ("embed", 1, 0.001)]


BUCKET = "inferq-usage-budgets"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
SUBMITS = {"/v1/jobs": {"body": BODY}, "/v1/chat/completions": BODY,
           "/v1/completions": {"model": "m", "prompt": "hi"}}


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with in_process_bucket(monkeypatch, BUCKET) as client:
        yield client


async def test_past_its_budget_every_submit_of_the_tenant_is_quota_exceeded_and_others_go_on(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    app = make_app(tenant_budgets={"tenant-a": Budget(tokens=10)}, files_bucket=BUCKET)
    client = open_client(app)
    clock = FakeClock(time.time())
    metering.budget_guard(app.state.gateway, clock=clock)
    uploaded = await client.post("/v1/files", headers=A, files={"file": ("in.jsonl", json.dumps(
        {"custom_id": "c0", "method": "POST", "url": "/v1/chat/completions", "body": BODY}).encode() + b"\n")},
                                 data={"purpose": "batch"})
    keyed = await client.post("/v1/jobs", json={"body": BODY}, headers={**A, "Idempotency-Key": "k1"})
    assert keyed.status_code == 202, keyed.text  # under its budget: accepted, and the guard holds that RECHECK_S
    await run_all(queue, Spend(1, 1, 4, 6))  # 10 tokens: the budget reached
    await submit(client, A)  # not read again before the recheck
    clock.advance(RECHECK_S)
    for path, body in SUBMITS.items():
        refused = await client.post(path, json=body, headers=A)
        assert_envelope(refused, 429, "quota_exceeded")
        message = refused.json()["error"]["message"]
        assert "monthly budget of 10 tokens (used: 10)" in message and "tenant-a" in message
        assert 0 < int(refused.headers["Retry-After"]) <= 31 * 86400
    batch = {"input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    assert_envelope(await client.post("/v1/batches", json=batch, headers=A), 429, "quota_exceeded")
    # a retry of the submit accepted before the budget was reached is no new job: it replays that job
    replayed = await client.post("/v1/jobs", json={"body": BODY}, headers={**A, "Idempotency-Key": "k1"})
    assert replayed.status_code == 200 and replayed.json()["id"] == keyed.json()["id"]
    assert_envelope(await client.post("/v1/jobs", json={"body": BODY}, headers={**A, "Idempotency-Key": "k2"}),
                    429, "quota_exceeded")
    await submit(client, B)  # no budget: nothing read, nothing refused
    assert (await client.post("/v1/batches", json=batch, headers=B)).status_code == 404  # A's file: not B's


async def test_a_budget_in_dollars_is_reached_by_gpu_time_at_the_model_s_price(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    app = make_app(tenant_budgets={"tenant-a": Budget(usd=0.01)}, gpu_hour_usd=3.6)  # $0.001 per GPU-second
    client = open_client(app)
    clock = FakeClock(time.time())
    metering.budget_guard(app.state.gateway, clock=clock)
    await submit(client, A)
    await run_all(queue, Spend(9_000, 9_000, 1, 1))  # 9 GPU-seconds: $0.009, under
    await submit(client, A)
    clock.advance(RECHECK_S)
    await submit(client, A)  # read again: still under
    await run_all(queue, Spend(2_000, 2_000, 1, 1))  # 13 GPU-seconds in all: $0.013
    clock.advance(RECHECK_S)
    refused = await client.post("/v1/jobs", json={"body": BODY}, headers=A)
    assert_envelope(refused, 429, "quota_exceeded")
    assert "$0.01" in refused.json()["error"]["message"]
