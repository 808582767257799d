"""The Lambda entry point ``functions/gateway/app.handler``, driven by real API Gateway HTTP API (v2) events from
tests/events/, many times in one process, as a warm Lambda sandbox does."""

from __future__ import annotations

import asyncio
import base64
import copy
import importlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest

from inferq.config.settings import Settings, SettingsError
from tests.conftest import load_event

MODULE = "functions.gateway.app"
EVENT_KEY = "dev-key-tenant-a"  # the key in the events' Authorization header


@dataclass
class LambdaContext:
    function_name: str = "inferq-GatewayFunction"
    memory_limit_in_mb: int = 1024
    invoked_function_arn: str = "arn:aws:lambda:eu-west-1:123456789012:function:inferq-GatewayFunction"
    aws_request_id: str = "c6af9ac6-7b61-11e6-9a41-93e812345678"

    def get_remaining_time_in_millis(self) -> int:
        return 29000


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("INFERQ_") or name.startswith("POWERTOOLS_METRICS"):
            monkeypatch.delenv(name)


def _fresh_import() -> ModuleType:
    sys.modules.pop(MODULE, None)
    return importlib.import_module(MODULE)


@pytest.fixture
def gateway_module(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Iterator[ModuleType]:
    """``functions.gateway.app`` imported as Lambda imports it: settings from the environment at import."""
    _clean_env(monkeypatch)
    monkeypatch.setenv("INFERQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("INFERQ_QUEUE", settings.queue)
    monkeypatch.setenv("INFERQ_API_KEYS", f"tenant-a:{EVENT_KEY}")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield _fresh_import()
    finally:
        sys.modules.pop(MODULE, None)
        loop.close()
        asyncio.set_event_loop(None)


def invoke(module: ModuleType, event: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    reply = module.handler(event, LambdaContext())
    body = reply["body"]
    if reply.get("isBase64Encoded"):
        body = base64.b64decode(body).decode()
    return reply["statusCode"], reply["headers"], json.loads(body) if body else None


def get_event(job_id: str, wait: str = "0") -> dict[str, Any]:
    event = copy.deepcopy(load_event("apiGatewayProxyV2GetJob.json"))
    path = f"/v1/jobs/{job_id}"
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["rawQueryString"] = f"wait={wait}"
    event["queryStringParameters"] = {"wait": wait}
    return event


def test_sixty_sequential_invocations_in_one_process_including_a_new_event_loop(
    gateway_module: ModuleType, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    gateway_module.app.state.telemetry.logger.setLevel(logging.DEBUG)  # a successful request's line is DEBUG
    submit = load_event("apiGatewayProxyV2SubmitJob.json")
    submit_b64 = load_event("apiGatewayProxyV2SubmitJobBase64.json")
    health = load_event("apiGatewayProxyV2Healthz.json")
    ids: list[str] = []
    for i in range(60):
        if i == 40:
            # A new loop for the rest (as after a closed one): the Redis client must follow, not break with
            # "attached to a different loop".
            asyncio.get_event_loop().close()
            asyncio.set_event_loop(asyncio.new_event_loop())
        kind = i % 4
        if kind in (0, 1):
            status, headers, job = invoke(gateway_module, submit if kind == 0 else submit_b64)
            assert status == 202, job
            assert headers["location"] == f"/v1/jobs/{job['id']}"
            assert headers["x-request-id"] == (submit if kind == 0 else submit_b64)["requestContext"]["requestId"]
            assert job["metadata"] == {"source": "lambda-event"}
            ids.append(job["id"])
        elif kind == 2:
            status, _, job = invoke(gateway_module, get_event(ids[-1]))
            assert status == 200 and job["id"] == ids[-1] and job["status"] == "queued"
        else:
            status, _, answer = invoke(gateway_module, health)
            assert status == 200 and answer == {"status": "ok"}
    assert len(set(ids)) == 30
    assert gateway_module.app.state.gateway.queues.created == 2  # one client per loop, not per invocation

    out = capsys.readouterr().out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    emf = [line for line in lines if "_aws" in line]
    assert emf, "no EMF line printed by the handler"
    assert {m["Name"] for m in emf[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"]} >= {"JobsEnqueued"}
    assert emf[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "inferq"
    assert sum(sum(line.get("JobsEnqueued", [])) for line in emf) == 30  # EMF values are lists
    access = [r.__dict__ for r in caplog.records if r.getMessage() == "request"]
    assert len(access) == 60
    assert all(r["request_id"] and r["lambda_request_id"] == LambdaContext.aws_request_id for r in access)
    assert {r["job_id"] for r in access if r.get("job_id")} == set(ids)
    logged = out + "\n".join(str(r.__dict__) for r in caplog.records)
    assert "hello" not in logged  # the prompt is never logged


def test_a_wait_through_lambda_blocks_on_the_jobs_wakeup_list_not_a_background_reader(
    gateway_module: ModuleType, settings: Settings
) -> None:
    """A sandbox is frozen between invocations, where a background reader would stall: the handler's waits block on
    ``done:<id>`` (BLMOVE), and a job that ends during the wait answers at once."""
    import redis

    from inferq.queue.keys import Keys

    status, _, job = invoke(gateway_module, load_event("apiGatewayProxyV2SubmitJob.json"))
    assert status == 202
    raw = redis.Redis.from_url(settings.redis_url)
    done = Keys(settings.queue).done(job["id"])
    raw.rpush(done, "succeeded")  # the wakeup alone: the record says queued, so the wait reads it and answers
    def blmoves() -> int:
        return int(raw.info("commandstats").get("cmdstat_blmove", {}).get("calls", 0))

    try:
        before = blmoves()
        status, _, answer = invoke(gateway_module, get_event(job["id"], wait="20"))
        # woken by the list: one BLMOVE on it, which found the wakeup (a shared reader would XREAD, and sit out
        # the 20 s on a wakeup it never reads)
        assert blmoves() - before == 1
    finally:
        raw.delete(done)
        raw.close()
    assert status == 200 and answer["id"] == job["id"]
    gateway = gateway_module.app.state.gateway
    assert gateway.shared_waits is False
    assert [q._waiters for q in gateway.queues._queues.values()] == [None]  # no reader was ever made


def test_the_trace_context_from_the_event_reaches_the_job(gateway_module: ModuleType) -> None:
    status, _, job = invoke(gateway_module, load_event("apiGatewayProxyV2SubmitJob.json"))
    assert status == 202
    trace = load_event("apiGatewayProxyV2SubmitJob.json")["headers"]["traceparent"]
    gateway = gateway_module.app.state.gateway

    async def stored() -> Any:
        return await gateway.queue.get(job["id"])

    assert asyncio.get_event_loop().run_until_complete(stored()).traceparent == trace


def test_errors_through_lambda_are_the_envelope(gateway_module: ModuleType) -> None:
    unauthenticated = copy.deepcopy(load_event("apiGatewayProxyV2SubmitJob.json"))
    del unauthenticated["headers"]["authorization"]
    status, headers, body = invoke(gateway_module, unauthenticated)
    assert status == 401 and body["error"]["type"] == "unauthorized"
    assert headers["www-authenticate"] == "Bearer"
    status, _, body = invoke(gateway_module, get_event("job_aaaaaaaaaaaaaaaaaaaaaaaaaa"))
    assert status == 404 and body["error"]["type"] == "not_found"
    status, _, body = invoke(gateway_module, get_event("job_aaaaaaaaaaaaaaaaaaaaaaaaaa", wait="99"))
    assert status == 422 and body["error"]["type"] == "invalid_request"
    lying = copy.deepcopy(load_event("apiGatewayProxyV2SubmitJob.json"))
    lying["headers"]["content-length"] = "a lot"
    status, _, body = invoke(gateway_module, lying)
    assert status == 400 and body["error"]["type"] == "bad_request"
    oversized = copy.deepcopy(load_event("apiGatewayProxyV2SubmitJob.json"))
    oversized["body"] = json.dumps({"body": {"prompt": "x" * 300_000}})
    oversized["headers"]["content-length"] = str(len(oversized["body"]))
    status, _, body = invoke(gateway_module, oversized)
    assert status == 413 and body["error"]["type"] == "request_too_large"


def test_no_api_keys_refuses_to_start_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    try:
        with pytest.raises(SettingsError) as excinfo:
            _fresh_import()
    finally:
        sys.modules.pop(MODULE, None)
    assert excinfo.value.variable == "INFERQ_API_KEYS"
    assert "INFERQ_API_KEYS_SECRET" in str(excinfo.value)


def test_a_bad_setting_fails_the_init_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_env(monkeypatch)
    monkeypatch.setenv("INFERQ_API_KEYS", f"tenant-a:{EVENT_KEY}")
    monkeypatch.setenv("INFERQ_MAX_BODY_BYTES", "lots")
    try:
        with pytest.raises(SettingsError) as excinfo:
            _fresh_import()
    finally:
        sys.modules.pop(MODULE, None)
    assert excinfo.value.variable == "INFERQ_MAX_BODY_BYTES"


def test_cold_import_loads_neither_boto3_nor_the_xray_sdk() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env["INFERQ_API_KEYS"] = f"tenant-a:{EVENT_KEY}"
    env["INFERQ_API_KEYS_SECRET"] = "inferq/api-keys"  # a secret is configured, yet read only on first use
    env["INFERQ_SCALER_FUNCTION"] = "inferq-scaler"
    code = (
        f"import sys, {MODULE}; "
        "heavy = [m for m in ('boto3', 'botocore.session', 'aws_xray_sdk') if m in sys.modules]; "
        "print(heavy)"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_import_freezes_what_it_made_out_of_the_cyclic_collectors_walks() -> None:
    # the app, its routes, models and libraries live as long as the process: a collection that walked them all
    # (a full one, every few thousand requests) was a pause in some request's answer
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env["INFERQ_API_KEYS"] = f"tenant-a:{EVENT_KEY}"
    code = f"import gc, {MODULE}; print(gc.get_freeze_count(), len(gc.get_objects()))"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    frozen, walked = map(int, result.stdout.split())
    assert frozen > 10_000 and walked < frozen / 10
