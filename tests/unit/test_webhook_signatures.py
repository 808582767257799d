"""Standard Webhooks signatures: the spec's published example, the reference library, the secret forms."""

from __future__ import annotations

import base64

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from inferq.settings import SettingsError
from inferq.webhook_signing import sign, signing_key, verify, webhook_id

# The example of the Standard Webhooks specification (and of its reference libraries' test suites)
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def headers(msg_id: str, timestamp: int, signature: str) -> dict[str, str]:
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature}


def test_the_spec_example_signs_to_the_published_signature() -> None:
    assert sign(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE
    assert verify(SPEC_SECRET, headers(SPEC_ID, SPEC_TIMESTAMP, SPEC_SIGNATURE), SPEC_BODY, now=SPEC_TIMESTAMP + 10)


def test_verify_refuses_tampering_other_secrets_replays_and_missing_headers() -> None:
    good = headers(SPEC_ID, SPEC_TIMESTAMP, SPEC_SIGNATURE)
    now = SPEC_TIMESTAMP + 10
    assert not verify(SPEC_SECRET, good, SPEC_BODY + b" ", now=now)
    assert not verify("whsec_" + base64.b64encode(b"other key").decode(), good, SPEC_BODY, now=now)
    assert not verify(SPEC_SECRET, {**good, "webhook-id": "msg_other"}, SPEC_BODY, now=now)
    assert not verify(SPEC_SECRET, good, SPEC_BODY, now=SPEC_TIMESTAMP + 301)  # older than the tolerance
    assert not verify(SPEC_SECRET, good, SPEC_BODY, now=SPEC_TIMESTAMP - 301)  # from the future
    assert not verify(SPEC_SECRET, {k: v for k, v in good.items() if k != "webhook-id"}, SPEC_BODY, now=now)
    assert not verify(SPEC_SECRET, {**good, "webhook-timestamp": "soon"}, SPEC_BODY, now=now)


def test_verify_accepts_any_of_several_signatures_and_any_header_case() -> None:
    rotated = {"Webhook-Id": SPEC_ID, "Webhook-Timestamp": str(SPEC_TIMESTAMP),
               "Webhook-Signature": f"v1,bm90IGl0 {SPEC_SIGNATURE}"}
    assert verify(SPEC_SECRET, rotated, SPEC_BODY, now=SPEC_TIMESTAMP)


@pytest.mark.parametrize("secret", ["whsec_" + base64.b64encode(b"\x00\x01 random key bytes").decode(),
                                    "a plain secret, not base64"])
def test_the_reference_library_verifies_our_signatures(secret: str) -> None:
    import time

    now = int(time.time())
    body = b'{"id":"job_x","status":"succeeded"}'
    signature = sign(secret, "job_x_1-0", now, body)
    # a whsec_ secret is given to the library as it is; a plain one as its UTF-8 bytes (see inferq_webhooks.sender)
    library = Webhook(secret if secret.startswith("whsec_") else secret.encode())
    assert library.verify(body, headers("job_x_1-0", now, signature)) == {"id": "job_x", "status": "succeeded"}
    with pytest.raises(WebhookVerificationError):
        library.verify(body + b" ", headers("job_x_1-0", now, signature))


def test_a_whsec_secret_that_is_not_base64_stops_the_process_naming_the_variable() -> None:
    with pytest.raises(SettingsError) as err:
        signing_key("whsec_not base64!")
    assert err.value.variable == "INFERQ_WEBHOOK_SECRET"
    with pytest.raises(SettingsError):
        signing_key("whsec_")
    assert signing_key("plain") == b"plain"


def test_the_webhook_id_names_the_job_and_its_terminal_event() -> None:
    assert webhook_id("job_abc", "1764400000123-0") == "job_abc_1764400000123-0"
