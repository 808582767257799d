"""``GET /v1/usage`` (docs/api.md) on the gateway with a real Valkey: a tenant's own rows, another tenant's only for
an operator (403 ``operator_only`` otherwise, whatever ``INFERQ_ADMIN_TENANTS`` says of queue-wide numbers), the
estimated cost for operators, buckets, the range's checks, a registry's models summed per tenant across queues, and
the budget check a submit makes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
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
from inferq.usage.spend import Spend

from .conftest import AppFactory
from .support import KEYS, A, B
from .test_submit import assert_envelope

OPS = {"Authorization": "Bearer key-operator-0003"}
WITH_OPERATOR = {**KEYS, "key-operator-0003": "ops"}


async def run_all(queue: Queue, spend: Spend, status: JobStatus = JobStatus.SUCCEEDED) -> None:
    deliveries, _ = await queue.read("w", 100)
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


async def test_past_its_budget_a_tenant_s_submits_are_quota_exceeded_and_others_go_on(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(tenant_budgets={"tenant-a": Budget(tokens=10)})
    client = open_client(app)
    gw = app.state.gateway
    await submit(client, A)
    await run_all(queue, Spend(1, 1, 4, 6))
    guard = metering.budget_guard(gw)
    guard._known.clear()  # the month to date read again now, as after RECHECK_S
    with pytest.raises(Exception) as refused:
        await metering.check_budget(gw, "tenant-a")
    response: Any = refused.value
    assert response.status == 429 and response.type == "quota_exceeded" and "10 tokens" in response.message
    assert int(response.headers["Retry-After"]) > 0
    await metering.check_budget(gw, "tenant-b")  # no budget: nothing read, nothing refused
