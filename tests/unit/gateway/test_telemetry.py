"""Metrics are counted in process and printed as EMF only on flush (the Lambda handler's job)."""

from __future__ import annotations

import json
import logging

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
    assert all(sorted(line["_aws"]["CloudWatchMetrics"][0]["Dimensions"][0]) == ["reason", "service"]
               for line in lines if "reason" in line)
    assert telemetry.flush() == 0  # nothing new: nothing printed


def test_the_namespace_follows_powertools_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "custom")
    assert Telemetry().namespace == "custom"


def test_access_lines_are_info_for_refusals_and_debug_for_successes(caplog: pytest.LogCaptureFixture) -> None:
    # a service name of its own: Powertools configures the logger of a name once per process
    telemetry = Telemetry(level="INFO", service="gateway-access-info")
    caplog.set_level(logging.DEBUG)
    telemetry.access(202, {"request_id": "r1", "job_id": "job_1"})
    telemetry.access(200, {"request_id": "r2"})
    telemetry.access(429, {"request_id": "r3"})
    telemetry.access(500, {"request_id": "r4", "error": "internal_error"})
    lines = [(r.levelname, r.__dict__["request_id"]) for r in caplog.records if r.getMessage() == "request"]
    assert lines == [("INFO", "r3"), ("INFO", "r4")]

    caplog.clear()
    telemetry = Telemetry(level="DEBUG", service="gateway-access-debug")  # INFERQ_LOG_LEVEL=DEBUG: every request
    telemetry.access(202, {"request_id": "r1", "job_id": "job_1"})
    telemetry.access(404, {"request_id": "r2"})
    lines = [(r.levelname, r.__dict__["request_id"]) for r in caplog.records if r.getMessage() == "request"]
    assert lines == [("DEBUG", "r1"), ("INFO", "r2")]
    assert all(r.funcName == "test_access_lines_are_info_for_refusals_and_debug_for_successes"
               for r in caplog.records if r.getMessage() == "request")  # the caller's location, not telemetry's
