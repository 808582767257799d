"""When no Docker engine can be started: nothing is left behind, CI fails, and elsewhere the tests skip."""

from __future__ import annotations

import os

import pytest

from .conftest import unavailable
from .engine import Engine, EngineUnavailable


def test_without_root_no_engine_starts_and_nothing_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    engine = Engine()
    with pytest.raises(EngineUnavailable, match="root"):
        engine.start()
    assert engine.processes == []
    engine.stop()
    assert not engine.state.exists()


@pytest.mark.parametrize(("ci", "fails"), [("true", True), ("1", True), ("", False), ("false", False)])
def test_an_engine_that_cannot_start_fails_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch, ci: str,
                                                                  fails: bool) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception if fails else pytest.skip.Exception, match="no Docker engine"):
        unavailable("dockerd needs root")


def test_the_engine_environment_points_only_at_its_own_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///var/run/docker.sock")
    monkeypatch.setenv("DOCKER_CONTEXT", "default")
    monkeypatch.setenv("COMPOSE_FILE", "elsewhere.yaml")
    engine = Engine()
    try:
        env = engine.env
        assert env["DOCKER_HOST"] == f"unix://{engine.state}/docker.sock"
        assert env["DOCKER_CONFIG"].startswith(str(engine.state))
        assert "DOCKER_CONTEXT" not in env and "COMPOSE_FILE" not in env
    finally:
        engine.stop()
