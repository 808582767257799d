"""Routing by model under a registry (docs/models.md): body.model picks the queue, an unknown model is OpenAI's
404 model_not_found, job ids find their queue for get/cancel/redrive, lists merge across models, /v1/models."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from functions.gateway.api import create_app
from inferq.config.settings import Settings, SettingsError
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from tests.support.queued import read_all

from .support import KEYS, A, B, FakeWaker
from .test_jobs import complete, dead_letter
from .test_submit import assert_envelope


def chat(model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
    if model is not None:
        body["model"] = model
    return {"body": body}


@pytest.fixture
def two_models(tmp_path: Path, settings: Settings) -> Settings:
    """A registry of two models on this test's own queue names; ``default`` names the first."""
    q = settings.queue
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"default": "chat", "models": [
        {"name": "chat", "queue": f"{q}-chat", "aliases": ["gpt-4o-mini"], "window": 4},
        {"name": "embed", "queue": f"{q}-embed", "aliases": ["text-embedding-3-small"], "window": 8}]}))
    return settings.replace(models=str(path))


@pytest.fixture
def app(two_models: Settings, waker: FakeWaker) -> FastAPI:
    return create_app(two_models, waker=waker, keys=KEYS)


@pytest.fixture
def gw_client(app: FastAPI, open_client: Callable[[FastAPI], httpx.AsyncClient]) -> httpx.AsyncClient:
    return open_client(app)


def queue_of(app: FastAPI, name: str) -> Queue:
    queue: Queue = app.state.gateway.queues.get(name)
    return queue


async def test_a_job_to_an_alias_lands_in_its_models_queue(gw_client: httpx.AsyncClient, app: FastAPI,
                                                           two_models: Settings) -> None:
    await queue_of(app, f"{two_models.queue}-embed").ensure_groups()
    response = await gw_client.post("/v1/jobs", json=chat("text-embedding-3-small"), headers=A)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    assert job_id.startswith("job_") and job_id.endswith(f"_{two_models.queue}-embed")
    embed = queue_of(app, f"{two_models.queue}-embed")
    assert await embed.redis.exists(embed.keys.job(job_id)) == 1
    chat_queue = queue_of(app, f"{two_models.queue}-chat")
    assert await chat_queue.redis.exists(chat_queue.keys.job(job_id)) == 0
    assert (await embed.observe()).lag == 1 and (await chat_queue.observe()).lag == 0


async def test_no_model_goes_to_the_default_and_an_unknown_one_is_model_not_found(
    gw_client: httpx.AsyncClient, two_models: Settings
) -> None:
    default = await gw_client.post("/v1/jobs", json=chat(None), headers=A)
    assert default.status_code == 202 and default.json()["id"].endswith(f"_{two_models.queue}-chat")
    unknown = await gw_client.post("/v1/jobs", json=chat("gpt-5"), headers=A)
    assert unknown.status_code == 404
    assert_envelope(unknown, 404, "model_not_found")
    assert "gpt-5" in unknown.json()["error"]["message"]
    assert (await gw_client.post("/v1/jobs", json=chat(7), headers=A)).status_code == 422  # type: ignore[arg-type]


async def test_without_a_default_body_model_is_required(tmp_path: Path, settings: Settings,
                                                         open_client: Callable[[FastAPI], httpx.AsyncClient]) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"models": [{"name": "a", "queue": f"{settings.queue}-a"}]}))
    client = open_client(create_app(settings.replace(models=str(path)), keys=KEYS))
    response = await client.post("/v1/jobs", json=chat(None), headers=A)
    assert response.status_code == 422
    assert "body.model" in response.json()["error"]["message"]


async def test_get_wait_cancel_and_isolation_find_a_second_models_job(
    gw_client: httpx.AsyncClient, app: FastAPI, two_models: Settings
) -> None:
    embed = queue_of(app, f"{two_models.queue}-embed")
    await embed.ensure_groups()
    job_id = (await gw_client.post("/v1/jobs", json=chat("embed"), headers=A)).json()["id"]
    got = await gw_client.get(f"/v1/jobs/{job_id}", headers=A)
    assert got.status_code == 200 and got.json()["status"] == "queued"
    assert (await gw_client.get(f"/v1/jobs/{job_id}", headers=B)).status_code == 404  # another tenant's
    cancelled = await gw_client.post(f"/v1/jobs/{job_id}/cancel", headers=A)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    waited = await gw_client.get(f"/v1/jobs/{job_id}?wait=1", headers=A)
    assert waited.json()["status"] == "cancelled"
    foreign = job_id.rsplit("_", 1)[0] + "_nosuchqueue"
    assert (await gw_client.get(f"/v1/jobs/{foreign}", headers=A)).status_code == 404


async def test_events_and_dlq_merge_across_models(gw_client: httpx.AsyncClient, app: FastAPI,
                                                  two_models: Settings) -> None:
    queues = [queue_of(app, f"{two_models.queue}-{m}") for m in ("chat", "embed")]
    for q in queues:
        await q.ensure_groups()
    ids = [(await gw_client.post("/v1/jobs", json=chat(m), headers=A)).json()["id"] for m in ("chat", "embed")]
    for q, job_id in zip(queues, ids, strict=True):
        await complete(q, job_id)
    page = (await gw_client.get("/v1/events", headers=A)).json()
    assert sorted(job["id"] for job in page["data"]) == sorted(ids)
    assert "." not in page["cursor"]  # opaque: sealed for its tenant, one position per model inside
    again = (await gw_client.get("/v1/events", params={"after": page["cursor"], "wait": 0.3}, headers=A)).json()
    assert again["data"] == []
    assert (await gw_client.get("/v1/events", params={"after": "1-0"}, headers=A)).status_code == 422

    dead = [(await gw_client.post("/v1/jobs", json=chat(m), headers=A)).json()["id"] for m in ("chat", "embed")]
    for q, job_id in zip(queues, dead, strict=True):
        await dead_letter(q, job_id)
    listed = (await gw_client.get("/v1/dlq", headers=A)).json()["data"]
    assert sorted(job["id"] for job in listed) == sorted(dead)
    redriven = await gw_client.post(f"/v1/dlq/{dead[1]}/redrive", headers=A)
    assert redriven.status_code == 202 and redriven.json()["status"] == "queued"


async def test_the_feed_cursor_round_trips_when_one_model_fills_the_page(gw_client: httpx.AsyncClient, app: FastAPI,
                                                                        two_models: Settings) -> None:
    chat_q, embed_q = (queue_of(app, f"{two_models.queue}-{m}") for m in ("chat", "embed"))
    for q in (chat_q, embed_q):
        await q.ensure_groups()
    start = (await gw_client.get("/v1/events", headers=A)).json()["cursor"]
    chats = [(await gw_client.post("/v1/jobs", json=chat("chat"), headers=A)).json()["id"] for _ in range(3)]
    embed = (await gw_client.post("/v1/jobs", json=chat("embed"), headers=A)).json()["id"]
    deliveries, _ = await read_all(chat_q, "test-worker", 10)
    by_id = {d.job.id: d for d in deliveries}
    for job_id in chats:  # they end in this order
        await chat_q.finish(by_id[job_id], JobStatus.SUCCEEDED, result={"status_code": 200, "body": {}})
    await complete(embed_q, embed)
    seen: list[str] = []
    cursor = start
    for _ in range(4):
        page = await gw_client.get("/v1/events", params={"after": cursor, "limit": 2}, headers=A)
        assert page.status_code == 200, page.text  # every cursor it gave is taken back as it was
        seen += [job["id"] for job in page.json()["data"]]
        cursor = page.json()["cursor"]
        if not page.json()["has_more"]:
            break
    assert seen == [*chats, embed]  # each model's jobs in the order they ended, models in the registry's order
    # with no cursor at all, the first page filled by the first model alone still gives a cursor that reads on
    first = (await gw_client.get("/v1/events", params={"limit": 3}, headers=A)).json()
    assert [j["id"] for j in first["data"]] == chats and first["has_more"] is True
    rest = (await gw_client.get("/v1/events", params={"after": first["cursor"]}, headers=A)).json()
    assert [j["id"] for j in rest["data"]] == [embed]


async def test_models_lists_every_model_with_its_fleet(gw_client: httpx.AsyncClient, app: FastAPI,
                                                       two_models: Settings) -> None:
    embed = queue_of(app, f"{two_models.queue}-embed")
    await embed.ensure_groups()
    await gw_client.post("/v1/jobs", json=chat("embed"), headers=A)
    await embed.record_decision(1, "scale_up")
    listed = await gw_client.get("/v1/models", headers=A)
    assert listed.status_code == 200
    body = listed.json()
    assert body["object"] == "list"
    by_id = {m["id"]: m for m in body["data"]}
    assert list(by_id) == ["chat", "embed"]
    for model in body["data"]:
        assert model["object"] == "model" and isinstance(model["created"], int) and model["owned_by"] == "inferq"
    assert by_id["embed"]["inferq"] == {"queue": f"{two_models.queue}-embed", "desired": 1, "running": 0,
                                        "lag": 1, "pending": 0}
    assert by_id["chat"]["inferq"]["lag"] == 0
    assert (await gw_client.get("/v1/models")).status_code == 401


async def test_without_a_registry_models_lists_the_one_queue(
    settings: Settings, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    client = open_client(create_app(settings, keys=KEYS))
    body = (await client.get("/v1/models", headers=A)).json()
    assert [m["id"] for m in body["data"]] == [settings.queue]
    assert body["data"][0]["inferq"]["queue"] == settings.queue
    job = (await client.post("/v1/jobs", json=chat("anything"), headers=A)).json()  # any model: the one queue
    assert len(job["id"]) == 30


def test_a_bad_registry_stops_the_gateway_naming_inferq_models(tmp_path: Path, settings: Settings) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - name: chat\n    window: lots\n")
    with pytest.raises(SettingsError) as caught:
        create_app(settings.replace(models=str(path)), keys=KEYS)
    assert caught.value.variable == "INFERQ_MODELS" and "model 'chat' window" in str(caught.value)


async def test_a_submit_wakes_the_fleet_of_its_own_model(gw_client: httpx.AsyncClient, app: FastAPI,
                                                         two_models: Settings, waker: FakeWaker) -> None:
    chat_queue = queue_of(app, f"{two_models.queue}-chat")
    embed = queue_of(app, f"{two_models.queue}-embed")
    await chat_queue.record_decision(2, "busy")  # chat's fleet is up, embed's at zero
    await gw_client.post("/v1/jobs", json=chat("chat"), headers=A)
    assert waker.calls == 0 and await embed.redis.exists(embed.keys.wake) == 0
    await gw_client.post("/v1/jobs", json=chat("embed"), headers=A)
    assert waker.calls == 1 and await embed.redis.exists(embed.keys.wake) == 1


async def test_scale_shows_the_default_model_or_the_one_named_by_name_or_alias(
    gw_client: httpx.AsyncClient, app: FastAPI, two_models: Settings
) -> None:
    for name in ("chat", "embed"):
        await queue_of(app, f"{two_models.queue}-{name}").ensure_groups()
    for _ in range(3):
        assert (await gw_client.post("/v1/jobs", json=chat("embed"), headers=A)).status_code == 202
    default = await gw_client.get("/v1/scale", headers=A)
    assert default.status_code == 200 and default.json()["lag"] == 0  # the default model's queue: chat's
    by_alias = await gw_client.get("/v1/scale", params={"model": "text-embedding-3-small"}, headers=A)
    by_name = await gw_client.get("/v1/scale", params={"model": "embed"}, headers=A)
    assert by_alias.status_code == by_name.status_code == 200
    assert by_alias.json()["lag"] == by_name.json()["lag"] == 3
    assert set(by_name.json()) == set(default.json()), "the same view, of another queue"
    unknown = await gw_client.get("/v1/scale", params={"model": "gpt-5"}, headers=A)
    assert_envelope(unknown, 404, "model_not_found")
    twice = await gw_client.get("/v1/scale", params=[("model", "chat"), ("model", "embed")], headers=A)
    assert_envelope(twice, 422)
