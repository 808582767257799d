"""Standard Webhooks signatures (https://www.standardwebhooks.com/), the receiver's side: headers ``webhook-id``,
``webhook-timestamp`` and ``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``.
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

WEBHOOK_TOLERANCE_S = 300
"""How far ``webhook-timestamp`` may be from now, either way (the specification's recommendation)."""


class WebhookVerificationError(Exception):
    """The delivery is not authentic or not fresh: answer it 4xx and ignore it."""


def _signing_key(secret: str | bytes) -> bytes:
    # Standard Webhooks secrets are "whsec_" + base64 of the key. Any other string is used as its own bytes, so a
    # plain INFERQ_WEBHOOK_SECRET works as is.
    if isinstance(secret, bytes):
        return secret
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_"):], validate=True)
        except (binascii.Error, ValueError):
            raise WebhookVerificationError("the secret has the whsec_ prefix but is not base64") from None
    return secret.encode()


def sign_webhook(secret: str | bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    """One ``webhook-signature`` entry, ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``."""
    digest = hmac.new(_signing_key(secret), f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify_webhook(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    tolerance_s: int = WEBHOOK_TOLERANCE_S,
    now: float | None = None,
) -> dict[str, Any]:
    """Check a delivery per the Standard Webhooks specification and return its body (the final job object).

    ``headers`` are the request's (any case); ``body`` the raw bytes as received, before any JSON parsing. Raises
    :class:`WebhookVerificationError` when a header is missing, the timestamp is more than ``tolerance_s`` away
    from now (a replay), or no ``v1`` entry of ``webhook-signature`` matches.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    try:
        webhook_id = lowered["webhook-id"]
        raw_timestamp = lowered["webhook-timestamp"]
        signatures = lowered["webhook-signature"]
    except KeyError as exc:
        raise WebhookVerificationError(f"missing header {exc.args[0]}") from None
    try:
        timestamp = int(raw_timestamp)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not an integer") from None
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance_s:
        raise WebhookVerificationError("webhook-timestamp is outside the tolerance (a replay, or a skewed clock)")
    raw = body.encode() if isinstance(body, str) else body
    expected = sign_webhook(secret, webhook_id, timestamp, raw)
    # The header may carry several space-separated signatures (during a secret rotation): one match is enough.
    if not any(hmac.compare_digest(expected.encode(), c.encode()) for c in signatures.split()):
        raise WebhookVerificationError("no signature matches")
    parsed: dict[str, Any] = json.loads(raw)
    return parsed
