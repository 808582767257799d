"""Standard Webhooks signatures: the spec's published example, the reference library, the secret forms."""

from __future__ import annotations

import base64

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from inferq.config.settings import SettingsError
from inferq.webhooks.signing import sign, signing_key, verify, webhook_id

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
    # a whsec_ secret is given to the library as it is; a plain one as its UTF-8 bytes (see inferq.webhooks.sender)
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


def test_a_header_with_several_keys_verifies_under_each_and_a_receiver_may_hold_several() -> None:
    """During a rotation the sender signs with both secrets, space-separated; the reference library accepts the
    delivery under either, and ``verify_webhook`` takes both at once (a receiver mid-switch)."""
    import time

    from inferq.webhooks.signing import signature_header, verify_webhook
    from inferq.webhooks.tenant_secrets import new_secret

    old, new, stranger = new_secret(), new_secret(), new_secret()
    now = int(time.time())
    body = b'{"id":"job_x","status":"succeeded"}'
    header = signature_header([new, old], "job_x_1-0", now, body)
    assert header.count(" ") == 1 and all(part.startswith("v1,") for part in header.split(" "))
    for secret in (old, new):
        assert Webhook(secret).verify(body, headers("job_x_1-0", now, header))["id"] == "job_x"
    with pytest.raises(WebhookVerificationError):
        Webhook(stranger).verify(body, headers("job_x_1-0", now, header))
    assert verify_webhook([stranger, new], headers("job_x_1-0", now, header), body)["status"] == "succeeded"
    assert not verify([stranger], headers("job_x_1-0", now, header), body)
    assert signature_header([new, new], "job_x_1-0", now, body).count("v1,") == 1  # one key, one signature


def test_a_hostile_signature_header_is_refused_not_raised() -> None:
    now = SPEC_TIMESTAMP + 1
    for signature in ("v1,\u00e9\u00e9", "v1,\ud800", "", " ", "v2,abc"):
        assert not verify(SPEC_SECRET, headers(SPEC_ID, SPEC_TIMESTAMP, signature), SPEC_BODY, now=now)
    signed_text = sign(SPEC_SECRET, SPEC_ID, SPEC_TIMESTAMP, b"not json")  # authentic, but no job object
    assert not verify(SPEC_SECRET, headers(SPEC_ID, SPEC_TIMESTAMP, signed_text), b"not json", now=now)
