"""Whether this run is CI's, decided in one place: ``.ci/run`` sets ``CI=true`` itself (as GitHub Actions, GitLab and
most CI services do), and ``CI=false``, ``0`` or unset is a developer's run. A part of the suite that needs a tool
this machine may lack (a Docker engine, a python3.13) fails in CI, which must run it, and skips elsewhere saying
why (docs/development.md, "Tests")."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

NOT_CI = frozenset({"", "0", "false", "no", "off"})


def in_ci() -> bool:
    """``CI`` set to anything but a false value (``false``, ``0``, ``no``, ``off``, empty): an unknown value counts
    as CI, so a misspelt setting fails a missing tool rather than skipping it."""
    return os.environ.get("CI", "").strip().lower() not in NOT_CI


def missing(reason: str) -> NoReturn:
    """What a test needs is not on this machine: a failure in CI (which must run it), a skip elsewhere."""
    if in_ci():
        pytest.fail(f"CI must run this, but {reason}")
    pytest.skip(reason)
