"""The OpenAPI document, checked against the app itself: schemathesis generates valid and invalid requests for every
operation and sends them in process to the ASGI app, with a real Valkey behind it. No answer may be a 5xx, and
every answer must match the document (status, content type, headers, body schema).

INFERQ_SCHEMATHESIS_EXAMPLES raises the examples per operation (default 25; generation is deterministic).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.s3 import in_process_bucket

from .conftest import AppFactory
from .support import A
from .test_files import BUCKET

EXAMPLES = int(os.environ.get("INFERQ_SCHEMATHESIS_EXAMPLES", "25"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture
def gateway(make_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[FastAPI]:
    with in_process_bucket(monkeypatch, BUCKET):  # moto's S3 in process: the Files routes answer, not 503
        yield make_app(files_bucket=BUCKET)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_every_answer_matches_the_openapi_document_and_none_is_5xx(gateway: FastAPI, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", gateway)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 30  # the jobs API's 8, the history, Files/Uploads/Batches' 13, the events feed, models,
    # the webhook secret's 2, usage, a job's output stream, the OpenAI front door's 2 (their body, OpenAI's request, is
    # read by hand and not in the document: every generated call is refused before a job is queued)
    # GET /v1/events long-polls for up to `wait` seconds when nothing arrives, which every generated case would:
    # tests/integration/gateway/test_files.py covers it
    operations = [op for op in operations if op.path != "/v1/events"]

    doc = gateway.openapi()
    seen: dict[str, set[int]] = {}
    for operation in operations:
        spec = doc["paths"][operation.path][operation.method.lower()]
        if mode is GenerationMode.NEGATIVE and not (spec.get("parameters") or spec.get("requestBody")):
            continue  # nothing to make invalid (e.g. /healthz)

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def answers_conform(case: Any) -> None:
            response = case.call_and_validate(headers=A, checks=CHECKS)
            seen.setdefault(f"{case.method} {case.operation.path}", set()).add(response.status_code)

        answers_conform()

    # The run reached the handlers, not just the auth or validation layers.
    if mode is GenerationMode.POSITIVE:
        assert 202 in seen["POST /v1/jobs"], seen
        assert 404 in seen["GET /v1/jobs/{job_id}"], seen
        assert seen["GET /v1/scale"] == {200}, seen
        assert seen["GET /v1/stats/history"] == {200}, seen
    else:
        assert 422 in seen["POST /v1/jobs"], seen


def test_the_document_has_examples_for_the_request_and_the_job(gateway: FastAPI) -> None:
    doc = gateway.openapi()
    submit = doc["paths"]["/v1/jobs"]["post"]
    assert submit["requestBody"]["content"]["application/json"]["examples"]["chat"]["value"]["body"]["messages"]
    components = doc["components"]["schemas"]
    assert components["JobCreate"]["examples"][0]["body"]
    assert {e["status"] for e in components["JobObject"]["examples"]} == {"queued", "succeeded"}
    assert set(submit["responses"]) >= {"200", "202", "401", "409", "413", "422", "429", "503"}
    assert {scheme["type"] for scheme in doc["components"]["securitySchemes"].values()} == {"http", "apiKey"}
    assert all(op.get("security") for path, ops in doc["paths"].items() if path.startswith("/v1/")
               for op in ops.values())
