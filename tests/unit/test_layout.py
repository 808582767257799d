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
# What may load an HTTP client: the users' client (httpx), the workstation command, and the webhook sender and its
# transport (httpx, run by the scaler and the workers). No other module of the package imports them.
USER_FACING = ("inferq.client", "inferq.cli", "inferq.webhooks.sender", "inferq.webhooks.post",
               "inferq.webhooks.guarded_http")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


PROTOCOL = sorted(
    name
    for name in (module_name(path) for path in (ROOT / "inferq").rglob("*.py"))
    if not any(name == u or name.startswith(u + ".") for u in USER_FACING)
)
FORBIDDEN = ("httpx", "httpcore", "boto3", "botocore", "aiobotocore", "fastapi", "starlette", "mangum",
             "aws_lambda_powertools", "rich", "emulator", "inferq.cli", "inferq.webhooks.sender", "functions",
             "gpu_worker", "bench", "inferq.client")


def loaded_by(module: str) -> set[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def test_the_protocol_package_is_found_whole() -> None:
    assert {"inferq", "inferq.queue.protocol", "inferq.redis.scripting", "inferq.config.settings",
            "inferq.queue.keys", "inferq.batches.driver", "inferq.webhooks.signing"} <= set(PROTOCOL)


@pytest.mark.parametrize("module", PROTOCOL)
def test_importing_a_protocol_module_loads_no_client_sdk_or_process_code(module: str) -> None:
    modules = loaded_by(module)
    dragged = sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert dragged == [], f"{module} loads {dragged}"


def test_the_check_sees_what_it_looks_for() -> None:
    """The user-facing client does load httpx: the check above would notice a protocol module that did."""
    assert "httpx" in loaded_by("inferq.client")
