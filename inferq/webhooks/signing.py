"""Webhook signatures per Standard Webhooks (https://www.standardwebhooks.com), made and checked with the
specification's reference library (the ``standardwebhooks`` package): what the sender puts in the headers and what a
receiver checks (:func:`verify_webhook`).

Headers: ``webhook-id`` (stable across the attempts of one delivery: receivers de-duplicate on it),
``webhook-timestamp`` (unix seconds of the attempt) and ``webhook-signature: v1,<base64 HMAC-SHA256(key,
"<id>.<timestamp>.<body>")>``, one such signature per valid secret, space-separated: the tenant's own secret
(:mod:`inferq.webhooks.tenant_secrets`), during a rotation the one it replaced too, and the deployment's
``INFERQ_WEBHOOK_SECRET`` when one is set (single-tenant setups).

Secrets: a ``whsec_<base64>`` secret (the spec's form, every tenant secret) means the decoded bytes. For
``INFERQ_WEBHOOK_SECRET`` alone any other value is still accepted, as its UTF-8 bytes (the key a stack generated
before tenant secrets existed; receivers using the ``standardwebhooks`` library pass ``secret.encode()``).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hmac
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from standardwebhooks import Webhook

from inferq.config.settings import Settings, SettingsError

SECRET_PREFIX = "whsec_"  # noqa: S105 - the spec's prefix of a base64 secret, not a secret
TOLERANCE_S = 300
"""The spec's window for ``webhook-timestamp``: older or newer deliveries are refused (replays)."""

Secret = str | bytes
"""A ``whsec_`` secret (or, for ``INFERQ_WEBHOOK_SECRET``, any string), or the key's bytes."""


def signing_key(secret: str) -> bytes:
    """The HMAC key of a secret: ``whsec_<base64>`` decoded, as the spec has it; anything else (only
    ``INFERQ_WEBHOOK_SECRET`` may be) as its UTF-8 bytes. A ``whsec_`` secret that is not base64 is a configuration
    error."""
    if secret.startswith(SECRET_PREFIX):
        try:
            key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
        except (binascii.Error, ValueError):
            raise SettingsError(Settings.variable("webhook_secret"), "a whsec_ secret must be base64") from None
        if not key:
            raise SettingsError(Settings.variable("webhook_secret"), "the whsec_ secret is empty")
        return key
    return secret.encode("utf-8")


def webhook_id(job_id: str, entry_id: str) -> str:
    """The delivery's id: one terminal event of one job, the same for every attempt (entry ids alone repeat across
    queues)."""
    return f"{job_id}_{entry_id}"


def _signer(key: Secret) -> Webhook:
    return Webhook(signing_key(key) if isinstance(key, str) else key)  # bytes: the library takes them as the key


def sign(key: Secret, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "<msg_id>.<timestamp>.<body>">`` (``key`` a secret string or key bytes)."""
    return _signer(key).sign(msg_id, datetime.datetime.fromtimestamp(timestamp, datetime.UTC), body)


def signature_header(keys: Sequence[Secret], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one signature per key, space-separated (the spec's form for several)."""
    return " ".join(dict.fromkeys(sign(key, msg_id, timestamp, body) for key in keys))


class WebhookVerificationError(Exception):
    """The delivery is not authentic or not fresh: answer it 4xx and ignore it."""


def verify_webhook(
    secret: Secret | Sequence[Secret], headers: Mapping[str, str], body: bytes | str, *,
    tolerance_s: int = TOLERANCE_S, now: float | None = None,
) -> dict[str, Any]:
    """The receiver's check, returning the delivered body (the final job object): one of the ``v1`` signatures
    matches the secret (or one of several given, e.g. both while a rotation overlaps) and the timestamp is within
    ``tolerance_s`` of now (no replays of old deliveries). Header names in any case; ``body`` the raw bytes as
    received. Raises :class:`WebhookVerificationError` saying what is wrong."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp, signatures = (lower.get(n) for n in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    for name, value in (("webhook-id", msg_id), ("webhook-timestamp", stamp), ("webhook-signature", signatures)):
        if not value:
            raise WebhookVerificationError(f"missing header {name}")
    assert msg_id and stamp and signatures
    try:
        timestamp = int(stamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not an integer") from None
    if abs((now if now is not None else time.time()) - timestamp) > tolerance_s:
        raise WebhookVerificationError("webhook-timestamp is outside the tolerance (a replay, or a skewed clock)")
    raw = body.encode() if isinstance(body, str) else body
    secrets = [secret] if isinstance(secret, (str, bytes)) else list(secret)
    try:
        expected = [sign(one, msg_id, timestamp, raw) for one in secrets]
    except (SettingsError, ValueError) as exc:
        raise WebhookVerificationError(f"the secret cannot be used: {exc}") from None
    candidates = [got.encode("utf-8", "replace") for got in signatures.split()]  # bytes: any header compares
    if not any(hmac.compare_digest(want.encode(), got) for want in expected for got in candidates):
        raise WebhookVerificationError("no signature matches")
    try:
        parsed: dict[str, Any] = json.loads(raw)
    except ValueError:
        raise WebhookVerificationError("the body is not JSON") from None
    return parsed


def verify(
    secret: Secret | Sequence[Secret], headers: Mapping[str, str], body: bytes, *, tolerance_s: int = TOLERANCE_S,
    now: float | None = None,
) -> bool:
    """:func:`verify_webhook` as a yes or no."""
    try:
        verify_webhook(secret, headers, body, tolerance_s=tolerance_s, now=now)
    except WebhookVerificationError:
        return False
    return True
