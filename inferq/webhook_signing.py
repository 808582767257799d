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
import time
from collections.abc import Mapping

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


def verify(
    secret: str | bytes, headers: Mapping[str, str], body: bytes, *, tolerance_s: int = TOLERANCE_S,
    now: float | None = None,
) -> bool:
    """The receiver's check: one of the ``v1`` signatures matches, and the timestamp is within ``tolerance_s`` of
    now (no replays of old deliveries). Header names in any case."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp, signatures = (lower.get(n) for n in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not (msg_id and stamp and signatures):
        return False
    try:
        timestamp = int(stamp)
    except ValueError:
        return False
    if abs((now if now is not None else time.time()) - timestamp) > tolerance_s:
        return False
    expected = sign(secret, msg_id, timestamp, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in signatures.split(" "))
