"""The ``inferq`` command finds the commands other code registers (inferq/cli/main.py): ``up`` comes from the
repository's ``inferq_emulator-0.dist-info`` wherever the clone is on the path; where nothing registers it (the
wheel alone: tests/e2e/test_wheel.py runs that for real), ``inferq up`` says it needs a clone, exit 2."""

from __future__ import annotations

import importlib.metadata

import pytest

from inferq.cli import main as cli


def test_up_is_the_emulators_as_the_repository_registers_it() -> None:
    from emulator.up import main as emulator_up

    assert cli.registered("up") is emulator_up
    assert cli.registered("no-such-command") is None


def test_without_a_registered_up_the_command_says_it_needs_a_clone(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def nothing_registered(**selection: str) -> importlib.metadata.EntryPoints:
        return importlib.metadata.EntryPoints(())  # what an installation of the wheel alone finds

    monkeypatch.setattr(importlib.metadata, "entry_points", nothing_registered)
    assert cli.main(["up"]) == 2
    assert "clone of the inferq repository" in capsys.readouterr().err
