"""The per-tenant bounds of a queue as the HTTP API answers them (G11): a tenant whose ended jobs' records hold its
quota gets 429 ``quota_exceeded`` with ``Retry-After``; one whose jobs killed the engine too often gets 429
``engine_cooloff`` with ``Retry-After``; an ``engine_died`` dead letter is 403 ``operator_only`` to redrive for a
tenant that is not an operator, and any tenant's to redrive for an operator named in ``INFERQ_ADMIN_TENANTS``."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from fastapi import FastAPI

from inferq.queue.holds import RECORD_OVERHEAD_BYTES
from inferq.queue.protocol import Outcome, Queue

from .conftest import AppFactory
from .support import CHAT, A, B
from .test_jobs import submit
from .test_submit import assert_envelope

ENGINE_DIED = {"type": "engine_died", "message": "the model server died running it"}


async def engine_death(queue: Queue, job_id: str) -> None:
    deliveries, _ = await queue.read("test-worker", 10)
    [delivery] = [d for d in deliveries if d.job.id == job_id]
    assert await queue.retry(delivery, delay_ms=0, error=ENGINE_DIED, dead_letter="engine_died") \
        is Outcome.DEAD_LETTERED


async def test_a_tenant_at_its_retained_quota_is_429_quota_exceeded_with_retry_after(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    client = open_client(make_app(tenant_max_retained_bytes=RECORD_OVERHEAD_BYTES))
    job_id = await submit(client)
    assert (await client.post(f"/v1/jobs/{job_id}/cancel", headers=A)).status_code == 200
    refused = await client.post("/v1/jobs", json=CHAT, headers=A)
    assert_envelope(refused, 429, "quota_exceeded")
    assert "INFERQ_TENANT_MAX_RETAINED_BYTES" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 86_400 + 3600
    assert (await client.post("/v1/jobs", json=CHAT, headers=B)).status_code == 202  # its own quota


async def test_a_tenant_whose_jobs_killed_the_engine_is_429_engine_cooloff_and_its_poison_is_an_operators(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    queue.settings = queue.settings.replace(engine_strikes=1, engine_cooloff_s=600)  # the worker's settings
    client = open_client(make_app(admin_tenants=frozenset({"tenant-b"})))
    poison = await submit(client)
    await engine_death(queue, poison)
    refused = await client.post("/v1/jobs", json=CHAT, headers=A)
    assert_envelope(refused, 429, "engine_cooloff")
    assert 590 <= int(refused.headers["Retry-After"]) <= 600
    assert (await client.post("/v1/jobs", json=CHAT, headers=B)).status_code == 202  # another tenant submits
    # its tenant may not redrive it (that would reset its strikes); a named operator may
    denied = await client.post(f"/v1/dlq/{poison}/redrive", headers=A)
    assert_envelope(denied, 403, "operator_only")
    assert (await queue.get(poison)).dead_lettered  # type: ignore[union-attr]
    redriven = await client.post(f"/v1/dlq/{poison}/redrive", headers=B)
    assert redriven.status_code == 202 and redriven.json()["status"] == "queued", redriven.text


async def test_without_named_operators_a_tenant_redrives_its_own_poison_but_never_another_tenants(
    client: httpx.AsyncClient, queue: Queue
) -> None:
    """INFERQ_ADMIN_TENANTS unset (one team, the emulator): every tenant is an operator of its own jobs only."""
    queue.settings = queue.settings.replace(engine_strikes=0)
    poison = await submit(client, B)
    await engine_death(queue, poison)
    assert_envelope(await client.post(f"/v1/dlq/{poison}/redrive", headers=A), 404)
    assert (await client.post(f"/v1/dlq/{poison}/redrive", headers=B)).status_code == 202
