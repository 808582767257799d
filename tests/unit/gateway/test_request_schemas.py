"""JobCreate: the submit body's validation, without Redis."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from functions.gateway.request_schemas import (
    JOB_CREATE_EXAMPLE,
    MAX_TTL_S,
    NO_SURROGATES,
    WEBHOOK_PORTS,
    JobCreate,
    surrogate_free,
)
from inferq.queue.jobs import JobRequest


def parse(value: Any) -> JobCreate:
    return JobCreate.model_validate_json(json.dumps(value))


def test_the_documented_example_is_valid() -> None:
    job = parse(JOB_CREATE_EXAMPLE)
    assert job.idempotency_key == "order-1234" and job.timeout_s == 120


def test_defaults_match_the_contract() -> None:
    job = parse({"body": {}})
    assert (job.url, job.metadata, job.timeout_s, job.ttl_s, job.webhook_url) == (
        "/v1/chat/completions", {}, None, None, None)


def test_nulls_mean_absent() -> None:
    job = parse({"body": {}, "idempotency_key": None, "timeout_s": None, "ttl_s": None, "webhook_url": None})
    assert job.idempotency_key is None and job.timeout_s is None


@pytest.mark.parametrize(("field", "value"), [
    ("timeout_s", 1), ("timeout_s", 3600), ("ttl_s", 1), ("ttl_s", MAX_TTL_S), ("idempotency_key", "k" * 255),
    ("metadata", {f"k{i}": "v" * 512 for i in range(16)}), ("webhook_url", "https://h.example.com"),
    ("webhook_url", "https://h.example.com:443/a/b?c=d#e"), ("idempotency_key", "ünïcode key with spaces"),
])
def test_bounds_are_inclusive(field: str, value: Any) -> None:
    assert getattr(parse({"body": {}, field: value}), field) == value


@pytest.mark.parametrize(("field", "value"), [
    ("timeout_s", 3601), ("ttl_s", MAX_TTL_S + 1), ("idempotency_key", "k" * 256), ("metadata", {"": "v"}),
    ("metadata", {"k" * 65: "v"}), ("metadata", {"k": "v" * 513}), ("metadata", {f"k{i}": "v" for i in range(17)}),
    ("webhook_url", "ftp://h.example.com"), ("webhook_url", "https://h example.com"), ("url", "/v1/chat"),
])
def test_past_the_bounds_is_invalid(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        parse({"body": {}, field: value})


def test_a_webhook_port_is_one_the_deployment_allows() -> None:
    """A path, a query and a fragment pass; the port is 443 unless INFERQ_WEBHOOK_PORTS (the validation context)
    names others (issue 47, L4: a tenant's URL must not make the scaler knock on any port of any host)."""
    url = "https://h.example.com:8443/a/b?c=d#e"
    with pytest.raises(ValidationError, match="allowed ports"):
        parse({"body": {}, "webhook_url": url})
    allowed = JobCreate.model_validate_json(json.dumps({"body": {}, "webhook_url": url}),
                                            context={WEBHOOK_PORTS: (443, 8443)})
    assert allowed.webhook_url == url


def test_lone_surrogates_are_refused_before_they_reach_redis() -> None:
    with pytest.raises(ValidationError):
        JobCreate.model_validate({"body": {"prompt": "\ud800"}})
    with pytest.raises(ValidationError):
        JobCreate.model_validate({"body": {}, "metadata": {"k": "\udfff"}})


@pytest.mark.parametrize("text", ['"\\ud800"', '"\\uDBFF x"', '"\\udfff"', '"a\\\\ud800"'])
def test_json_text_that_may_spell_a_lone_surrogate_is_walked(text: str) -> None:
    raw = b'{"body": {"prompt": %s}}' % text.encode()
    assert not surrogate_free(raw)
    if "\\\\" in text:  # an escaped backslash: only looks like one, and is valid
        assert JobCreate.model_validate_json(raw, context={NO_SURROGATES: False}).body["prompt"] == json.loads(text)
    else:
        with pytest.raises(ValidationError):
            JobCreate.model_validate_json(raw, context={NO_SURROGATES: surrogate_free(raw)})


@pytest.mark.parametrize("text", ['"\\u00e9t\\u00e9"', '"\\u4e2d\\u6587"', '"plain"'])
def test_json_text_without_a_surrogate_escape_skips_the_walk(text: str) -> None:
    raw = b'{"body": {"prompt": %s}}' % text.encode()
    assert surrogate_free(raw)
    assert JobCreate.model_validate_json(raw, context={NO_SURROGATES: True}).body["prompt"] == json.loads(text)


def test_a_valid_request_hashes_like_the_queue_expects() -> None:
    job = parse(JOB_CREATE_EXAMPLE)
    request = JobRequest(body=job.body, url=job.url, metadata=job.metadata, timeout_s=job.timeout_s,
                         ttl_s=job.ttl_s, webhook_url=job.webhook_url, idempotency_key=job.idempotency_key)
    same = parse(json.loads(json.dumps(JOB_CREATE_EXAMPLE)))
    assert request.digest() == JobRequest(body=same.body, url=same.url, metadata=same.metadata,
                                          timeout_s=same.timeout_s, ttl_s=same.ttl_s).digest()
