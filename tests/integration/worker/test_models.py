"""``python -m gpu_worker`` under a model registry: INFERQ_MODEL picks the entry it serves (its queue, window,
backend), and a registry of several models without it stops the worker at start naming INFERQ_MODEL."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_worker.backends.base import FatalError
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue

from .support import REPO, chat, status_is, submit, terminal, worker_env, worker_processes

EXAMPLE = str(REPO / "models.example.yaml")


def test_several_models_and_no_inferq_model_stops_the_worker_naming_it(settings: Settings) -> None:
    env = worker_env(settings, INFERQ_MODELS=EXAMPLE)
    done = subprocess.run([sys.executable, "-m", "gpu_worker"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "INFERQ_MODEL:" in line and "chat, embed" in line


def test_a_bad_registry_stops_the_worker_naming_inferq_models(settings: Settings, tmp_path: Path) -> None:
    bad = tmp_path / "models.yaml"
    bad.write_text("models:\n  - name: chat\n    backend: {kind: tgi}\n")
    done = subprocess.run([sys.executable, "-m", "gpu_worker"], cwd=REPO, capture_output=True, text=True,
                          env=worker_env(settings, INFERQ_MODELS=str(bad), INFERQ_MODEL="chat"), timeout=30)
    assert done.returncode == 2 and "INFERQ_MODELS" in done.stderr and "backend.kind" in done.stderr


async def test_a_worker_serves_the_queue_window_and_served_name_of_its_model(
    settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "models.json"
    q = settings.queue
    path.write_text(json.dumps({"models": [{"name": "chat", "queue": f"{q}-chat"},
                                           {"name": "embed", "queue": f"{q}-embed", "window": 3,
                                            "backend": {"kind": "mock", "served_model": "e5-served"}}]}))
    registry_settings = settings.replace(models=str(path))
    embed = Queue.connect(registry_settings.replace(queue=f"{q}-embed"))
    await embed.ensure_groups()
    with worker_processes(registry_settings, tmp_path) as spawn:
        worker = spawn("embed-1", INFERQ_MODEL="embed")
        await worker.started(embed)
        job = await submit(embed, {**chat("hello"), "model": "embed"})
        assert job.id.endswith(f"_{q}-embed")
        done = await terminal(embed, job.id)
        assert done.status is JobStatus.SUCCEEDED
        assert done.result is not None
        assert done.result["body"]["model"] == "e5-served"  # the client said "embed": the server gets its served name
        # a job naming another model that reached this queue (a batch line) fails instead of running on this one
        stray = await terminal(embed, (await submit(embed, {**chat("hi"), "model": "chat"})).id)
        assert stray.status is JobStatus.FAILED and stray.error is not None
        assert stray.error["type"] == "model_error" and "not served by this fleet" in stray.error["message"]
        chat_queue = Queue(embed.redis, registry_settings.replace(queue=f"{q}-chat"))
        assert await embed.redis.hexists(chat_queue.keys.workers, "embed-1") == 0  # it serves embed only
        slow = [await submit(embed, {**chat("slow", latency_ms=4000), "model": "embed"}) for _ in range(5)]
        await status_is(embed, slow[2].id, "running")
        await asyncio.sleep(0.5)  # proves a negative: no fourth job starts beside the three
        statuses = [(await embed.get(j.id)).status for j in slow]  # type: ignore[union-attr]
        assert statuses.count(JobStatus.RUNNING) == 3  # embed's window, not the default 8
        worker.kill()
    await embed.close()


async def test_the_served_name_wrapper_keeps_the_backends_load_signals_and_leaves_the_job_body_alone() -> None:
    from gpu_worker.served import ServedModel

    seen: list[dict[str, object]] = []

    class Engine:
        name = "engine"

        async def complete(self, url: str, body: dict[str, object], **_: object) -> tuple[int, object]:
            seen.append(body)
            return 200, {}

        async def aclose(self) -> None:
            return None

        async def load(self) -> str:
            return "gauges"

    wrapped = ServedModel(Engine(), "served", frozenset({"alias"}))  # type: ignore[arg-type]
    body = {"model": "alias", "messages": []}
    await wrapped.complete("/v1/chat/completions", body, timeout_s=1, traceparent="", job=None)  # type: ignore[arg-type]
    assert seen == [{"model": "served", "messages": []}] and body["model"] == "alias"
    assert wrapped.name == "engine" and await wrapped.load() == "gauges"
    with pytest.raises(FatalError):
        await wrapped.complete("/v1/chat/completions", {"model": "other"}, timeout_s=1, traceparent="",
                               job=None)  # type: ignore[arg-type]
    assert len(seen) == 1
