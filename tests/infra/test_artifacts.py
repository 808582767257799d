"""What each deployable ships of our own code, listed: the gateway zip has no CLI, emulator, bench, worker or
webhook sender; the scaler zip no gateway, emulator or worker; the authorizer zip only the gateway's key check; the
worker image no functions/ or emulator/. And
each ships every repository module its entry point imports (lazily or not), so nothing it runs is left out.

The zips are listed from mk/sam.mk's own copy step (``make sources-<Function>``, what ``sam build`` runs after
the wheels); the image from gpu_worker/Dockerfile's build stage and emulator/compose.yaml's build arguments.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from .cfn import ROOT, make
from .test_containers import instructions
from .test_environment_is_read import ENTRY_POINTS, import_closure

OURS = ("inferq", "functions", "gpu_worker", "emulator", "bench")
# the protocol's packages both functions run; neither runs the users' client or the workstation command
SERVER_PACKAGES = {"inferq", "inferq.queue", "inferq.redis", "inferq.batches", "inferq.webhooks", "inferq.scaling",
                   "inferq.config", "inferq.usage"}


def copied(function: str, tmp_path: Path) -> Path:
    artifact = tmp_path / function
    make(f"sources-{function}", env={**os.environ, "ARTIFACTS_DIR": str(artifact)})
    return artifact


def packages(artifact: Path) -> set[str]:
    """Every package of ours in an artifact, as a dotted name (``functions.gateway``)."""
    return {
        ".".join(init.parent.relative_to(artifact).parts)
        for init in artifact.rglob("__init__.py")
        if init.relative_to(artifact).parts[0] in OURS
    }


def missing_modules(entry: str, artifact: Path) -> list[str]:
    """Repository modules the entry point imports that the artifact lacks."""
    lacking = []
    for module in sorted(import_closure(entry)):
        base = artifact.joinpath(*module.split("."))
        if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            lacking.append(module)
    return lacking


def test_the_gateway_zip_ships_the_protocol_and_the_gateway_only(tmp_path: Path) -> None:
    artifact = copied("GatewayFunction", tmp_path)
    assert packages(artifact) == SERVER_PACKAGES | {"functions", "functions.gateway", "functions.gateway.routers"}
    assert sorted(p.name for p in (artifact / "functions").iterdir()) == ["__init__.py", "gateway", "storage.py"]
    assert (artifact / "inferq" / "queue" / "scripts" / "enqueue.lua").is_file()
    assert not (artifact / "inferq" / "client").exists()  # the users' HTTP client: the gateway never runs it
    # the webhook sender runs in the scaler and the workers, not in the gateway (which signs and guards only)
    assert sorted(p.name for p in (artifact / "inferq" / "webhooks").glob("*.py")) == [
        "__init__.py", "envelope.py", "netguard.py", "signing.py", "tenant_secrets.py"]
    assert list((artifact / "functions" / "gateway" / "console").glob("*.html"))
    assert not list(artifact.rglob("__pycache__")) and not list(artifact.rglob("requirements.*"))
    assert missing_modules(ENTRY_POINTS["GatewayFunction"], artifact) == []


def test_the_scaler_zip_ships_the_protocol_the_webhook_sender_and_the_scaler_only(tmp_path: Path) -> None:
    artifact = copied("ScalerFunction", tmp_path)
    assert packages(artifact) == SERVER_PACKAGES | {"functions", "functions.scaler"}  # no inferq.client
    assert (artifact / "inferq" / "webhooks" / "sender.py").is_file()
    assert sorted(p.name for p in (artifact / "functions").iterdir()) == ["__init__.py", "scaler", "storage.py"]
    assert missing_modules(ENTRY_POINTS["ScalerFunction"], artifact) == []


def test_the_authorizer_zip_ships_the_key_check_and_nothing_else_of_the_gateway(tmp_path: Path) -> None:
    artifact = copied("AuthorizerFunction", tmp_path)
    assert packages(artifact) == SERVER_PACKAGES | {"functions", "functions.gateway", "functions.authorizer"}
    assert sorted(p.name for p in (artifact / "functions").iterdir()) == ["__init__.py", "authorizer", "gateway"]
    assert sorted(p.name for p in (artifact / "functions" / "gateway").iterdir()) == ["__init__.py", "auth.py"]
    assert not (artifact / "inferq" / "client").exists()
    assert not (artifact / "inferq" / "webhooks" / "sender.py").exists()  # it delivers nothing
    assert not list(artifact.rglob("__pycache__")) and not list(artifact.rglob("requirements.*"))
    assert missing_modules(ENTRY_POINTS["AuthorizerFunction"], artifact) == []


@pytest.mark.parametrize("function", ["GatewayFunction", "ScalerFunction", "AuthorizerFunction"])
def test_a_second_copy_replaces_the_first(function: str, tmp_path: Path) -> None:
    """sam build reuses an artifacts dir: a package of an earlier layout must not stay behind in it."""
    artifact = tmp_path / function
    (artifact / "inferq" / "old_module.py").parent.mkdir(parents=True)
    (artifact / "inferq" / "old_module.py").write_text("")
    (artifact / "functions" / "gone").mkdir(parents=True)
    make(f"sources-{function}", env={**os.environ, "ARTIFACTS_DIR": str(artifact)})
    assert not (artifact / "inferq" / "old_module.py").exists() and not (artifact / "functions" / "gone").exists()


def image_sources(extra_sources: str, tmp_path: Path) -> set[str]:
    """The top-level paths of /src when the build stage runs pip, for a value of EXTRA_SOURCES: the build stage's
    COPY lines laid out in a folder, then the shell of its RUN up to the install run there, as docker runs it."""
    lines = instructions(ROOT / "gpu_worker" / "Dockerfile")
    build = lines[next(i for i, line in enumerate(lines) if line.endswith(" AS build")) :]
    build = build[: next(i for i, line in enumerate(build) if line.startswith("RUN ")) + 1]
    assert "WORKDIR /src" in build and 'ARG EXTRA_SOURCES=""' in build
    src = tmp_path / "src"
    src.mkdir()
    for line in build:
        if line.startswith("COPY ") and "--from=" not in line:
            *sources, dest = line.split()[1:]
            targets = [src / Path(s).name for s in sources] if dest.endswith("/") else [src / dest]
            for target in targets:
                target.mkdir(parents=True)
    before_install = " ".join(build[-1].removeprefix("RUN ").split()).split(" && python3 -m venv")[0]
    subprocess.run(["sh", "-ec", before_install], cwd=src, env={"EXTRA_SOURCES": extra_sources}, check=True)
    return {path.name for path in src.iterdir()}


def compose_build_args(service: str) -> dict[str, str]:
    compose = yaml.safe_load((ROOT / "emulator" / "compose.yaml").read_text())
    return {k: str(v) for k, v in (compose["services"][service]["build"].get("args") or {}).items()}


def test_the_worker_image_ships_the_protocol_the_webhook_sender_and_the_worker_only(tmp_path: Path) -> None:
    worker_args = compose_build_args("worker")
    assert "EXTRA_SOURCES" not in worker_args, "compose's worker image must be the worker image"
    sources = image_sources("", tmp_path)
    assert sources == {"pyproject.toml", "README.md", "inferq", "gpu_worker"}
    closure = import_closure(ENTRY_POINTS["worker"])
    assert {module.split(".")[0] for module in closure} <= sources


def test_compose_s_gateway_and_scaler_image_adds_the_handlers_and_the_emulator(tmp_path: Path) -> None:
    args = compose_build_args("gateway")
    assert image_sources(args["EXTRA_SOURCES"], tmp_path) >= {"functions", "emulator", "inferq", "gpu_worker"}
