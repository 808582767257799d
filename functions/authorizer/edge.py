"""The origin check of a stack with an edge (``EdgeProtection: waf``; DEPLOY.md, "An edge with AWS WAF"): CloudFront
adds a secret header, :data:`HEADER`, to every request it sends the HTTP API, and the authorizer refuses a request
without it, so the API's own ``execute-api`` address answers nobody who skipped the web ACL.

The value lives in a Secrets Manager secret the stack generates (``INFERQ_EDGE_ORIGIN_SECRET`` names it): JSON
``{"current": "<value>"}``, which CloudFront's origin reads through a dynamic reference; during a rotation it holds
``"previous"`` too, and either value passes (DEPLOY.md, "Rotating the origin secret"). It is read at the first
request and kept :data:`MAX_AGE_S`, served stale for :data:`MAX_STALE_S` while Secrets Manager fails, then the check
fails closed (:class:`inferq.aws.SecretUnavailable`: the invocation fails, API Gateway answers 500). The comparison
takes the same time whatever the header holds.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping

from inferq.aws import CachedSecret, SecretUnavailable

HEADER = "x-inferq-origin-verify"
"""The header CloudFront adds (template.yaml, EdgeDistribution), as API Gateway's payload 2.0 names it."""
MAX_AGE_S = 300.0
"""A new value reaches every authorizer sandbox within five minutes (the rotation waits that long)."""
MAX_STALE_S = 900.0
STAGES = ("current", "previous")


class OriginCheck:
    """Whether a request came through the stack's edge: its :data:`HEADER` holds one of the secret's values."""

    def __init__(self, secret: CachedSecret) -> None:
        self.secret = secret

    @classmethod
    def of(cls, secret_id: str) -> OriginCheck:
        return cls(CachedSecret(secret_id, MAX_AGE_S, max_stale_s=MAX_STALE_S))

    def values(self) -> list[bytes]:
        """The values that pass now: the secret's ``current`` and, during a rotation, ``previous``."""
        raw = self.secret.get()
        try:
            document = json.loads(raw)
        except ValueError:
            raise SecretUnavailable(f"secret {self.secret.secret_id} is not the JSON the edge writes") from None
        found = [document.get(stage) for stage in STAGES] if isinstance(document, dict) else []
        values = [v.encode() for v in found if isinstance(v, str) and v]
        if not values:
            raise SecretUnavailable(f"secret {self.secret.secret_id} holds no value under 'current'")
        return values

    def allows(self, headers: Mapping[str, str] | None) -> bool:
        """Whether the request's :data:`HEADER` holds a value that passes (a repeated header, comma-joined, holds
        none). Raises :class:`SecretUnavailable` when the secret cannot be read: fail closed."""
        presented = next((v for k, v in (headers or {}).items() if k.lower() == HEADER), "")
        if not presented:
            return False
        given = presented.encode()
        return any([hmac.compare_digest(given, value) for value in self.values()])
