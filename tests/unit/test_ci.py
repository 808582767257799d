"""One decision of what runs in CI (tests/support/ci.py), and .ci/run making its run CI's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.ci import in_ci, missing

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("value", "ci"), [("true", True), ("TRUE", True), ("1", True), ("yes", True),
                                           ("jenkins", True), ("false", False), ("0", False), ("", False),
                                           ("no", False), (None, False)])
def test_ci_is_any_value_but_a_false_one(monkeypatch: pytest.MonkeyPatch, value: str | None, ci: bool) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert in_ci() is ci
    with pytest.raises(pytest.fail.Exception if ci else pytest.skip.Exception, match=r"no python3\.13"):
        missing("no python3.13 here")


def test_ci_run_marks_its_run_as_ci_and_runs_make_test() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in script.splitlines() if line.strip() and not line.startswith("#")]
    assert lines.index("export CI=true") < lines.index("make test") == len(lines) - 1
