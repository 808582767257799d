"""verify_webhook against signatures computed here by the Standard Webhooks specification itself (and its published
test vector), and the client's pure parts: the job object, Retry-After, error types."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import httpx
import pytest

from inferq.client import (
    IdempotencyConflict,
    InferqError,
    Job,
    JobStatus,
    JobTerminal,
    NotFound,
    QueueFull,
    ServerError,
    Unauthorized,
    Unavailable,
    WebhookVerificationError,
    error_from,
    retry_after_s,
    submit_request,
    verify_webhook,
)

# The Standard Webhooks specification's own example (its reference libraries test against it).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TS = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def spec_sign(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The spec, written out: base64(HMAC-SHA256(key, "id.timestamp.body")), prefixed "v1,"."""
    mac = hmac.new(key, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(webhook_id: str, timestamp: int, signature: str) -> dict[str, str]:
    return {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature}


JOB = {"id": "job_" + "a" * 26, "object": "job", "status": "succeeded", "url": "/v1/chat/completions", "attempts": 1,
       "created_at": 1.0, "started_at": 2.0, "finished_at": 3.0, "dead_lettered": False, "metadata": {"k": "v"},
       "result": {"status_code": 200, "body": {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}},
       "error": None}


def test_the_specifications_test_vector_verifies() -> None:
    verify_webhook(SPEC_SECRET, headers(SPEC_ID, SPEC_TS, SPEC_SIGNATURE), SPEC_BODY, now=SPEC_TS)
    assert spec_sign(base64.b64decode(SPEC_SECRET[6:]), SPEC_ID, SPEC_TS, SPEC_BODY) == SPEC_SIGNATURE


def test_a_delivery_signed_per_spec_verifies_and_returns_the_job() -> None:
    body = json.dumps(JOB).encode()
    now = int(time.time())
    signature = spec_sign(b"plain-secret", "evt_1", now, body)
    # header names in any case, as HTTP frameworks hand them over
    delivered = {"Webhook-Id": "evt_1", "Webhook-Timestamp": str(now), "Webhook-Signature": signature}
    assert verify_webhook("plain-secret", delivered, body) == JOB
    assert verify_webhook(b"plain-secret", delivered, body.decode()) == JOB


def test_one_matching_signature_among_several_is_enough() -> None:
    key = base64.b64decode(SPEC_SECRET[6:])
    wrong = spec_sign(b"old-secret", SPEC_ID, SPEC_TS, SPEC_BODY)
    several = f"{wrong} v1a,bm90LWEtc2ln {spec_sign(key, SPEC_ID, SPEC_TS, SPEC_BODY)}"
    verify_webhook(SPEC_SECRET, headers(SPEC_ID, SPEC_TS, several), SPEC_BODY, now=SPEC_TS + 10)


@pytest.mark.parametrize(
    ("secret", "hdrs", "body", "now", "why"),
    [
        (SPEC_SECRET, headers(SPEC_ID, SPEC_TS, SPEC_SIGNATURE), b'{"test": 2432232315}', SPEC_TS, "no signature"),
        ("whsec_" + base64.b64encode(b"another key").decode(), headers(SPEC_ID, SPEC_TS, SPEC_SIGNATURE), SPEC_BODY,
         SPEC_TS, "no signature"),
        (SPEC_SECRET, headers("msg_other", SPEC_TS, SPEC_SIGNATURE), SPEC_BODY, SPEC_TS, "no signature"),
        (SPEC_SECRET, headers(SPEC_ID, SPEC_TS, SPEC_SIGNATURE), SPEC_BODY, SPEC_TS + 301, "tolerance"),
        (SPEC_SECRET, headers(SPEC_ID, SPEC_TS, SPEC_SIGNATURE), SPEC_BODY, SPEC_TS - 301, "tolerance"),
        (SPEC_SECRET, {"webhook-id": SPEC_ID, "webhook-signature": SPEC_SIGNATURE}, SPEC_BODY, SPEC_TS, "missing"),
        (SPEC_SECRET, headers(SPEC_ID, SPEC_TS, SPEC_SIGNATURE) | {"webhook-timestamp": "soon"}, SPEC_BODY, SPEC_TS,
         "not an integer"),
        ("whsec_***", headers(SPEC_ID, SPEC_TS, SPEC_SIGNATURE), SPEC_BODY, SPEC_TS, "must be base64"),
    ],
    ids=["tampered-body", "wrong-secret", "other-id", "too-old", "from-the-future", "missing-timestamp",
         "bad-timestamp", "bad-secret"],
)
def test_anything_else_is_refused(secret: str, hdrs: dict[str, str], body: bytes, now: int, why: str) -> None:
    with pytest.raises(WebhookVerificationError, match=why):
        verify_webhook(secret, hdrs, body, now=now)


def test_the_job_object_is_typed() -> None:
    job = Job.from_api(JOB)
    assert job.status is JobStatus.SUCCEEDED and job.terminal
    assert job.text == "hi" and job.output == JOB["result"]["body"]  # type: ignore[index]
    assert job.metadata == {"k": "v"} and job.raw == JOB
    queued = Job.from_api({**JOB, "status": "queued", "result": None})
    assert not queued.terminal and queued.text is None and queued.output is None


def test_retry_after_reads_seconds_and_http_dates() -> None:
    def answer(value: str | None) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": value} if value is not None else {})

    assert retry_after_s(answer("2")) == 2.0
    assert retry_after_s(answer(None)) is None
    assert retry_after_s(answer("soon")) is None
    later = retry_after_s(answer("Wed, 21 Oct 2099 07:28:00 GMT"))
    assert later is not None and later > 1e9


@pytest.mark.parametrize(
    ("status", "type_", "cls"),
    [(404, "not_found", NotFound), (409, "idempotency_conflict", IdempotencyConflict), (429, "queue_full", QueueFull),
     (503, "unavailable", Unavailable), (409, "job_terminal", JobTerminal), (502, "bad_gateway", ServerError),
     (418, "teapot", InferqError)],
)
def test_each_error_type_has_its_class_carrying_status_and_envelope(status: int, type_: str, cls: type) -> None:
    envelope = {"error": {"type": type_, "message": "m"}, **({"job": JOB} if type_ == "job_terminal" else {})}
    error = error_from(httpx.Response(status, json=envelope, headers={"Retry-After": "3"}))
    assert type(error) is cls
    assert (error.status, error.type, error.message, error.envelope, error.retry_after_s) == (
        status, type_, "m", envelope, 3.0)
    if isinstance(error, JobTerminal):
        assert error.job is not None and error.job.id == JOB["id"]


def test_an_answer_without_the_envelope_still_has_a_type() -> None:
    error = error_from(httpx.Response(502, text="<html>bad gateway</html>"))
    assert isinstance(error, ServerError) and error.status == 502 and "bad gateway" in error.message


def test_the_deployed_authorizer_s_refusal_is_unauthorized_and_the_gateway_s_403s_keep_their_type() -> None:
    refused = error_from(httpx.Response(403, json={"message": "Forbidden"}))  # API Gateway's, no envelope
    assert isinstance(refused, Unauthorized) and (refused.status, refused.type) == (403, "unauthorized")
    envelope = {"error": {"type": "operator_only", "message": "m"}}
    operator_only = error_from(httpx.Response(403, json=envelope))
    assert not isinstance(operator_only, Unauthorized) and operator_only.type == "operator_only"


def test_only_given_fields_are_sent() -> None:
    assert submit_request({"model": "m"}, url=None, metadata=None, timeout_s=None, ttl_s=None, webhook_url=None,
                          priority=None) == {"body": {"model": "m"}}
    full = submit_request({"model": "m"}, url="/v1/completions", metadata={"a": "b"}, timeout_s=5, ttl_s=60,
                          webhook_url="https://example.com/h", priority="high")
    assert full["ttl_s"] == 60 and full["priority"] == "high" and full["metadata"] == {"a": "b"}


def test_a_wait_refused_for_the_keys_long_poll_limit_looks_without_waiting_pauses_and_waits_again() -> None:
    """A tenant holding all its waits (``INFERQ_TENANT_MAX_WAITS``: 429 ``rate_limited`` on a wait): ``wait`` reads
    the job without a wait (which takes no slot), pauses at most a second, then waits again; any other 429 is
    raised."""
    from inferq.client.calls import WAITS_BUSY_PAUSE_S, Call, Pause, Runner, wait

    queued = Job.from_api({**JOB, "status": "queued", "result": None})
    runner = Runner(wait(JOB["id"], 60))  # type: ignore[arg-type]
    steps = iter(runner)
    first = next(steps)
    assert isinstance(first, Call) and first.params == {"wait": 20}
    runner.fail(InferqError(429, "rate_limited", "10 waits running", retry_after_s=18.0))
    look = next(steps)
    assert isinstance(look, Call) and look.params is None  # no wait: no slot taken
    runner.answer(queued)
    pause = next(steps)
    assert isinstance(pause, Pause) and pause.seconds == WAITS_BUSY_PAUSE_S
    again = next(steps)
    assert isinstance(again, Call) and again.params == {"wait": 20}
    runner.answer(Job.from_api(JOB))
    with pytest.raises(StopIteration):
        next(steps)
    assert runner.result.terminal

    other = Runner(wait(JOB["id"], 60))  # type: ignore[arg-type]
    next(iter(other))
    other.fail(QueueFull(429, "queue_full", "full"))
    with pytest.raises(QueueFull):
        next(iter(other))
