"""``sam build`` without Docker: each function's artifact holds inferq (with its Lua scripts), functions/ and its
own third-party packages as Lambda arm64 / CPython 3.13 wheels, bytecode from a python3.13, and no boto3 (the
runtime's). The handler named in the template then imports from the artifact alone under python3.13, with the
environment the template gives it, the way the Lambda runtime loads it.

Slow (a minute or two the first time): aws-sam-cli's venv (.tools/sam), pip's wheel cache and the runtime venv
(.tools/lambda-python3.13) are reused across runs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.ci import missing

from .cfn import FUNCTIONS, LAMBDAS, ROOT, TEMPLATE, Resolver, host_platform, lambda_python, load, make, run, sam_env
from .test_template import ATTRIBUTES  # the stand-ins for the stack's attributes

pytestmark = pytest.mark.slow

ELF_MACHINE_AARCH64 = 183

NOT_SHIPPED = ("boto3", "botocore", "s3transfer")  # the python3.13 runtime has them


IMPORT_NAMES = {"pyyaml": "yaml"}
"""Distributions whose import name is not their name with dashes as underscores."""


def requirement_modules(name: str) -> set[str]:
    """Top-level import names of functions/NAME/requirements.txt (distribution name, dashes to underscores)."""
    modules = set()
    for line in (ROOT / "functions" / name / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            match = re.match(r"^([A-Za-z0-9_.-]+)(?:\[([^\]]+)\])?", line)
            assert match, line
            distribution = match.group(1).lower().replace("-", "_")
            modules.add(IMPORT_NAMES.get(distribution, distribution))
            modules.update(extra.strip() for extra in (match.group(2) or "").split(",") if extra.strip())
    return modules


def sam_build(sam: Path, build_dir: Path, platform: str | None = None) -> Path:
    env = sam_env()
    if platform:
        env["LAMBDA_PLATFORM"] = platform
    run([str(sam), "build", "--template", str(TEMPLATE), "--build-dir", str(build_dir)], env=env)
    return build_dir


def require_lambda_python() -> str:
    python = lambda_python()
    if python is None:
        missing("there is no python3.13 (the Lambda runtime's version) for the artifact checks on this machine")
    return python


@pytest.fixture(scope="module")
def built(sam: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real artifacts: what `sam deploy` would upload."""
    return sam_build(sam, tmp_path_factory.mktemp("sam") / "build")


@pytest.fixture(scope="module")
def loadable(sam: Path, built: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Artifacts whose compiled wheels load on this machine: the real ones on arm64, else the same build for
    this machine's platform (only compiled wheels differ; code and bytecode are the same)."""
    if host_platform() == "manylinux2014_aarch64":
        return built
    return sam_build(sam, tmp_path_factory.mktemp("sam-host") / "build", platform=host_platform())


@pytest.fixture(scope="module")
def runtime_python() -> Path:
    """python3.13 with boto3: what Lambda's python3.13 runtime adds to an artifact."""
    require_lambda_python()
    make("lambda-runtime")
    return ROOT / ".tools" / "lambda-python3.13" / "bin" / "python"


@pytest.mark.parametrize("logical_id", LAMBDAS)
def test_artifact_holds_inferq_its_function_and_its_packages_but_no_boto3(built: Path, logical_id: str) -> None:
    name = LAMBDAS[logical_id]
    artifact = built / logical_id
    scripts = sorted(p.relative_to(ROOT / "inferq") for p in (ROOT / "inferq" / "queue" / "scripts").rglob("*.lua"))
    assert scripts
    shipped = (artifact / "inferq" / "queue" / "scripts").rglob("*.lua")
    assert sorted(p.relative_to(artifact / "inferq") for p in shipped) == scripts
    # the users' HTTP client and the workstation command: no function runs them; the webhook sender runs in the
    # scaler, not the gateway (tests/infra/test_artifacts.py)
    not_shipped = [ROOT / "inferq" / "client", ROOT / "inferq" / "cli"]
    if name in ("gateway", "authorizer"):
        not_shipped += [ROOT / "inferq" / "webhooks" / f for f in ("sender.py", "post.py", "guarded_http.py")]
    sources = sorted(p.relative_to(ROOT) for p in (ROOT / "inferq").rglob("*.py")
                     if not any(n == p or n in p.parents for n in not_shipped))
    assert sorted(p.relative_to(artifact) for p in (artifact / "inferq").rglob("*.py")) == sources
    for path in (ROOT / "functions" / name).glob("*.py"):
        assert (artifact / path.relative_to(ROOT)).read_bytes() == path.read_bytes()
    present = {p.name for p in artifact.iterdir()}
    assert requirement_modules(name) <= present
    if name == "gateway":
        assert {"fastapi", "mangum", "pydantic", "pydantic_core", "starlette"} <= present
    if name == "authorizer":  # the key check alone: no framework, no Redis client, nothing compiled
        assert not present & {"fastapi", "mangum", "pydantic", "starlette", "redis", "hiredis", "orjson", "yaml"}
        assert not list(artifact.rglob("*.so"))
    assert not present & set(NOT_SHIPPED)
    assert not (artifact / "bin").exists()


@pytest.mark.parametrize("logical_id", FUNCTIONS)
def test_compiled_wheels_are_for_lambda_arm64_python313(built: Path, logical_id: str) -> None:
    extensions = list((built / logical_id).rglob("*.so"))
    assert extensions, "expected compiled wheels (hiredis, pydantic-core)"
    for path in extensions:
        header = path.read_bytes()[:20]
        assert header[:4] == b"\x7fELF", path
        assert int.from_bytes(header[18:20], "little") == ELF_MACHINE_AARCH64, path
        if "cpython-" in path.name:
            assert "cpython-313-aarch64" in path.name, path


@pytest.mark.parametrize("logical_id", LAMBDAS)
def test_artifact_ships_python313_bytecode(built: Path, logical_id: str) -> None:
    require_lambda_python()
    artifact = built / logical_id
    missing = [
        str(py.relative_to(artifact))
        for package in ("inferq", "functions", "redis", "aws_lambda_powertools")
        for py in (artifact / package).rglob("*.py")
        if not (py.parent / "__pycache__" / f"{py.stem}.cpython-313.pyc").exists()
    ]
    assert missing == []


def test_built_template_points_at_the_artifacts_and_the_nested_templates(built: Path) -> None:
    template = load(built / "template.yaml")
    for logical_id in LAMBDAS:
        assert template["Resources"][logical_id]["Properties"]["CodeUri"] == logical_id
    for stack in ("Network", "Cache", "Gpu", "Observability"):
        url = template["Resources"][stack]["Properties"]["TemplateURL"]
        assert (built / url).is_file(), url


def _handler_environment(translated: dict[str, Any], logical_id: str, artifact: Path) -> dict[str, str]:
    env = Resolver(translated, attributes=ATTRIBUTES).value(
        translated["Resources"][logical_id]["Properties"]["Environment"]["Variables"]
    )
    return {
        **{k: str(v) for k, v in env.items()},
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_LAMBDA_FUNCTION_NAME": logical_id,
        "LAMBDA_TASK_ROOT": str(artifact),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }


IMPORT_HANDLER = """
import importlib, sys
artifact, handler = sys.argv[1], sys.argv[2]
sys.path.insert(0, artifact)
module_name, attribute = handler.rsplit(".", 1)
module = importlib.import_module(module_name.replace("/", "."))
assert callable(getattr(module, attribute)), handler
for name in ("inferq", module_name.replace("/", ".")):
    assert sys.modules[name].__file__.startswith(artifact), sys.modules[name].__file__
print(module.__file__)
"""


@pytest.mark.parametrize("logical_id", LAMBDAS)
def test_handler_imports_from_its_artifact_under_python313(
    loadable: Path, runtime_python: Path, translated: dict[str, Any], logical_id: str
) -> None:
    artifact = loadable / logical_id
    handler = translated["Resources"][logical_id]["Properties"]["Handler"]
    env = _handler_environment(translated, logical_id, artifact)
    # -I: no PYTHONPATH, no user site, no current directory; the artifact and the runtime's boto3 only.
    result = run([str(runtime_python), "-I", "-c", IMPORT_HANDLER, str(artifact), handler], cwd=artifact, env=env)
    assert result.stdout.strip().startswith(str(artifact))
