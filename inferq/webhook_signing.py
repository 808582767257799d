"""Webhook signatures per Standard Webhooks (https://www.standardwebhooks.com): what the sender puts in the headers
and what a receiver checks (:func:`verify`).

Headers: ``webhook-id`` (stable across the attempts of one delivery: receivers de-duplicate on it),
``webhook-timestamp`` (unix seconds of the attempt) and ``webhook-signature: v1,<base64 HMAC-SHA256(key,
"<id>.<timestamp>.<body>")>`` (several space-separated signatures may come, e.g. during a key rotation).

The key is ``INFERQ_WEBHOOK_SECRET``: a ``whsec_<base64>`` secret (the spec's form) means the decoded bytes; any
other value is used as its UTF-8 bytes (receivers using the ``standardwebhooks`` library pass ``secret.encode()``:
the library would otherwise base64-decode it too).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from .settings import Settings, SettingsError

SECRET_PREFIX = "whsec_"  # noqa: S105 - the spec's prefix of a base64 secret, not a secret
TOLERANCE_S = 300
"""The spec's window for ``webhook-timestamp``: older or newer deliveries are refused (replays)."""


def signing_key(secret: str) -> bytes:
    """The HMAC key of ``INFERQ_WEBHOOK_SECRET``: ``whsec_<base64>`` decoded, as the spec has it; anything else as
    its UTF-8 bytes. A ``whsec_`` secret that is not base64 is a configuration error."""
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


def sign(key: bytes | str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "<msg_id>.<timestamp>.<body>">`` (``key`` a secret string or key bytes)."""
    raw = signing_key(key) if isinstance(key, str) else key
    digest = hmac.new(raw, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


class WebhookVerificationError(Exception):
    """The delivery is not authentic or not fresh: answer it 4xx and ignore it."""


def verify_webhook(
    secret: str | bytes, headers: Mapping[str, str], body: bytes | str, *, tolerance_s: int = TOLERANCE_S,
    now: float | None = None,
) -> dict[str, Any]:
    """The receiver's check, returning the delivered body (the final job object): one of the ``v1`` signatures
    matches and the timestamp is within ``tolerance_s`` of now (no replays of old deliveries). Header names in any
    case; ``body`` the raw bytes as received. Raises :class:`WebhookVerificationError` saying what is wrong."""
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
    try:
        expected = sign(secret, msg_id, timestamp, raw)
    except SettingsError as exc:
        raise WebhookVerificationError(f"the secret cannot be used: {exc}") from None
    if not any(hmac.compare_digest(expected, candidate) for candidate in signatures.split()):
        raise WebhookVerificationError("no signature matches")
    parsed: dict[str, Any] = json.loads(raw)
    return parsed


def verify(
    secret: str | bytes, headers: Mapping[str, str], body: bytes, *, tolerance_s: int = TOLERANCE_S,
    now: float | None = None,
) -> bool:
    """:func:`verify_webhook` as a yes or no."""
    try:
        verify_webhook(secret, headers, body, tolerance_s=tolerance_s, now=now)
    except (WebhookVerificationError, ValueError):
        return False
    return True
