"""Metrics are counted in process and printed as EMF only on flush (the Lambda handler's job)."""

from __future__ import annotations

import json

import pytest

from functions.gateway.telemetry import Telemetry


def emf_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"_aws"')]


def test_counting_prints_nothing_until_flush(capsys: pytest.CaptureFixture[str]) -> None:
    telemetry = Telemetry()
    for _ in range(250):  # past Powertools' 100-values auto-flush: we do not use it
        telemetry.count("JobsEnqueued")
    assert emf_lines(capsys.readouterr().out) == []
    assert telemetry.totals["JobsEnqueued"] == 250


def test_flush_writes_one_emf_line_per_dimension_set(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POWERTOOLS_METRICS_NAMESPACE", raising=False)
    telemetry = Telemetry(service="gateway")
    telemetry.count("JobsEnqueued")
    telemetry.count("JobsEnqueued")
    telemetry.count("IdempotentReplays")
    telemetry.count("JobsRejected", "queue_full")
    telemetry.count("JobsRejected", "invalid")
    assert telemetry.flush() == 3
    lines = emf_lines(capsys.readouterr().out)
    plain = next(line for line in lines if "JobsEnqueued" in line)
    assert plain["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "inferq"
    assert plain["JobsEnqueued"] == [2.0] and plain["IdempotentReplays"] == [1.0]
    rejected = {line["reason"]: line["JobsRejected"] for line in lines if "JobsRejected" in line}
    assert rejected == {"queue_full": [1.0], "invalid": [1.0]}
    assert all(["reason", "service"] in line["_aws"]["CloudWatchMetrics"][0]["Dimensions"]
               for line in lines if "reason" in line)
    assert telemetry.flush() == 0  # nothing new: nothing printed


def test_the_namespace_follows_powertools_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "custom")
    assert Telemetry().namespace == "custom"
