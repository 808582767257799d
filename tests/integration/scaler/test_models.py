"""The scaler with a model registry: one invocation evaluates every model with its own policy and ECS service
(moto), updates only the service whose count changes, and tags each model's metrics with a ``model`` dimension."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from functions.scaler import app
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue
from inferq.redis.connection import connect
from tests.support.ecs import create_service

from .test_handler import CLUSTER, LambdaContext, emf, enqueue, scheduled


@pytest.fixture
def registry_env(tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch,
                 scaler_env: None) -> Iterator[dict[str, Settings]]:
    q = settings.queue
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"default": "chat", "models": [
        {"name": "chat", "queue": f"{q}-chat", "service": "svc-chat", "window": 4,
         "scale": {"max": 3, "target_per_worker": 4}},
        {"name": "embed", "queue": f"{q}-embed", "service": "svc-embed", "window": 8,
         "scale": {"max": 2, "target_per_worker": 8}}]}))
    monkeypatch.setenv("INFERQ_MODELS", str(path))
    monkeypatch.delenv("INFERQ_ECS_SERVICE")  # each model names its own
    app.reset()
    yield {"chat": settings.replace(queue=f"{q}-chat", models=str(path)),
           "embed": settings.replace(queue=f"{q}-embed", models=str(path))}
    app.reset()


@pytest.fixture
def two_services(ecs: Any, registry_env: Any) -> Any:
    for service in ("svc-chat", "svc-embed"):
        create_service(ecs, service)
    return ecs


@pytest.fixture
def service_updates(two_services: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    calls: list[tuple[str, int]] = []
    real = app.ecs_client
    spied: set[int] = set()

    def ecs_client() -> Any:
        client = real()
        if id(client) not in spied:
            spied.add(id(client))
            client.meta.events.register(
                "before-parameter-build.ecs.UpdateService",
                lambda params, **_: calls.append((params["service"], params["desiredCount"])))
        return client

    monkeypatch.setattr(app, "ecs_client", ecs_client)
    return calls


def desired(ecs: Any, service: str) -> int:
    return int(ecs.describe_services(cluster=CLUSTER, services=[service])["services"][0]["desiredCount"])


async def test_one_invocation_sizes_every_model_and_updates_only_what_changed(
    registry_env: dict[str, Settings], two_services: Any, service_updates: list[tuple[str, int]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = connect(registry_env["chat"])
    chat, embed = Queue(client, registry_env["chat"]), Queue(client, registry_env["embed"])
    try:
        for q in (chat, embed):
            await q.ensure_groups()
        await enqueue(chat, 10)  # 10 jobs / 4 per worker -> 3 (its max)
        capsys.readouterr()
        answer = app.handler(scheduled(), LambdaContext())
        assert answer["models"]["chat"]["desired"] == 3 and answer["models"]["embed"]["desired"] == 0
        assert answer["changes"] == 1 and answer["errors"] == []
        assert service_updates == [("svc-chat", 3)]  # embed stays at zero: no UpdateService for it
        assert (desired(two_services, "svc-chat"), desired(two_services, "svc-embed")) == (3, 0)
        docs = emf(capsys.readouterr().out)
        by_model = {doc["model"]: doc for doc in docs}
        assert set(by_model) == {"chat", "embed"}
        for doc in docs:
            assert doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["queue", "model"]]
        assert (by_model["chat"]["Lag"], by_model["chat"]["queue"]) == (10, chat.settings.queue)
        assert by_model["embed"]["Lag"] == 0

        await enqueue(embed, 9)  # the other model gets work: 9 / 8 -> 2; chat unchanged
        app.handler({"source": "inferq.gateway", "detail": {"queue": embed.settings.queue}}, LambdaContext())
        assert service_updates == [("svc-chat", 3), ("svc-embed", 2)]
        assert (await embed.scale_state())["desired"] == "2" and (await chat.scale_state())["desired"] == "3"
    finally:
        await client.aclose()


def test_a_bad_registry_fails_the_scaler_naming_inferq_models(registry_env: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: chat\n    scale: {min: 3, max: 1}\n")
    monkeypatch.setenv("INFERQ_MODELS", str(bad))
    app.reset()
    with pytest.raises(Exception, match="INFERQ_MODELS"):
        app.load_settings()
