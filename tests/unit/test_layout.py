"""The protocol package stays the protocol: importing any module of ``inferq`` (the user-facing HTTP client
``inferq.client`` aside) loads no HTTP client, AWS SDK, web framework, or code of the emulator, the CLI, the
webhook sender, the handlers or the worker. Each module is imported in a fresh interpreter, so one that another
module happened to load first cannot hide what it drags in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_FACING = {"inferq.client"}  # the HTTP client for users (httpx); no protocol module imports it
PROTOCOL = sorted(
    name
    for name in (
        "inferq" if path.name == "__init__.py" else f"inferq.{path.stem}" for path in (ROOT / "inferq").glob("*.py")
    )
    if name not in USER_FACING
)
FORBIDDEN = ("httpx", "httpcore", "boto3", "botocore", "aiobotocore", "fastapi", "starlette", "mangum",
             "aws_lambda_powertools", "rich", "emulator", "inferq_cli", "inferq_webhooks", "functions", "gpu_worker",
             "bench", "inferq.client")


def loaded_by(module: str) -> set[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_the_protocol_package_is_found_whole() -> None:
    assert {"inferq", "inferq.queue", "inferq.scripting", "inferq.settings", "inferq.keys"} <= set(PROTOCOL)


@pytest.mark.parametrize("module", PROTOCOL)
def test_importing_a_protocol_module_loads_no_client_sdk_or_process_code(module: str) -> None:
    modules = loaded_by(module)
    dragged = sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert dragged == [], f"{module} loads {dragged}"


def test_the_check_sees_what_it_looks_for() -> None:
    """The user-facing client does load httpx: the check above would notice a protocol module that did."""
    assert "httpx" in loaded_by("inferq.client")
