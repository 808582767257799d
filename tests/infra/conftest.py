"""Fixtures of the deployment tests: the SAM CLI in its own venv (created once by ``mk/sam.mk``, then reused),
the root template as the SAM translator expands it, and the nested templates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .cfn import NESTED, ROOT, SAM_VENV, TEMPLATE, load, make, run, sam_env


@pytest.fixture(scope="session")
def sam() -> Path:
    """``.tools/sam/bin/sam``; ``make sam-tools`` installs aws-sam-cli there the first time (about a minute)."""
    make("sam-tools")
    return SAM_VENV / "bin" / "sam"


@pytest.fixture(scope="session")
def translated(sam: Path) -> dict[str, Any]:
    """template.yaml as CloudFormation after the SAM transform (Globals merged, roles and events generated)."""
    result = run(
        [str(SAM_VENV / "bin" / "python"), str(ROOT / "tests" / "infra" / "sam_translate.py"), str(TEMPLATE)],
        env=sam_env(),
    )
    return json.loads(result.stdout)


@pytest.fixture(scope="session")
def source() -> dict[str, Any]:
    """template.yaml as written (before the transform)."""
    return load(TEMPLATE)


@pytest.fixture(scope="session")
def nested() -> dict[str, dict[str, Any]]:
    return {name: load(path) for name, path in NESTED.items()}
