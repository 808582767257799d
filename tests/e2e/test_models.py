"""Two models through ``inferq up`` with the repository's own ``models.example.yaml``: a fleet per model, each
scaled on its own (one at zero while the other is busy, then woken by one job), routing by name and alias, the
OpenAI-shaped 404 for an unknown model, ``/v1/models``, get/cancel of the second model's jobs, ``inferq status``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.waiting import eventually

from .conftest import ROOT, Emulator, chat


def models(emulator: Emulator) -> dict[str, dict[str, Any]]:
    response = emulator.client.get("/v1/models")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    return {m["id"]: m for m in body["data"]}


def to(model: str, text: str, **mock: Any) -> dict[str, Any]:
    request = chat(text, **mock)
    request["body"]["model"] = model
    return request


@pytest.mark.timeout(300)
def test_two_fleets_scale_apart_and_route_by_model(own_stack: Callable[..., Emulator]) -> None:
    emulator = own_stack(INFERQ_MODELS="models.example.yaml")
    assert '"model": "chat"' in emulator.logs() and "--model chat" in emulator.logs()  # the hint names a real model
    listed = models(emulator)
    assert list(listed) == ["chat", "embed"]
    assert listed["chat"]["object"] == "model" and listed["chat"]["inferq"]["queue"] == "chat"
    assert set(listed["embed"]["inferq"]) == {"queue", "desired", "running", "lag", "pending"}

    unknown = emulator.client.post("/v1/jobs", json=to("gpt-5", "hi"))
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "model_not_found"

    # chat gets busy (8 jobs of 4 s, window 4): its fleet grows; embed's stays at zero
    busy = [emulator.submit(to("gpt-4o-mini", f"busy {i}", latency_ms=4000)) for i in range(8)]
    assert all(job["id"].endswith("_chat") for job in busy)
    eventually(lambda: (models(emulator)["chat"]["inferq"]["running"] or 0) >= 1, what="chat's fleet to start",
               timeout=60)
    now = models(emulator)
    assert (now["embed"]["inferq"]["desired"] or 0) == 0 and now["embed"]["inferq"]["running"] == 0
    assert [m for m in emulator.workers()], "chat's workers run"

    # one job to embed (by alias) wakes its fleet while chat is still busy
    woke = emulator.submit(to("text-embedding-3-small", "wake up"))
    assert woke["id"].endswith("_embed")
    done = emulator.finish(woke["id"], timeout=60)
    assert done["status"] == "succeeded", done
    assert done["result"]["body"]["choices"][0]["message"]["content"]
    assert models(emulator)["embed"]["inferq"]["desired"] >= 1

    # the second model's jobs: get and cancel
    hung = emulator.submit(to("embed", "hang", hang=True))
    eventually(lambda: emulator.job(hung["id"])["status"] == "running", what="the hung job to start", timeout=30)
    cancelled = emulator.client.post(f"/v1/jobs/{hung['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert emulator.finish(hung["id"], timeout=30)["status"] == "cancelled"

    for job in busy:
        assert emulator.finish(job["id"], timeout=90)["status"] == "succeeded"

    status = subprocess.run(
        [sys.executable, "-m", "inferq.cli.main", "status", "--once", "--url", emulator.url, "--data-dir",
         str(emulator.data_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert status.returncode == 0, status.stderr
    assert "chat" in status.stdout and "embed" in status.stdout and "models" in status.stdout


def test_a_bad_registry_stops_inferq_up_naming_inferq_models(tmp_path: Any) -> None:
    bad = tmp_path / "models.yaml"
    bad.write_text("models:\n  - name: chat\n    scale: {max: -1}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    done = subprocess.run(
        [sys.executable, "-m", "inferq.cli.main", "up", "--data-dir", str(tmp_path / "data"), "--port", "0"],
        cwd=ROOT, env={**env, "INFERQ_MODELS": str(bad)}, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "INFERQ_MODELS" in done.stderr and "model 'chat' scale.max" in done.stderr  # at start, within the 60 s
