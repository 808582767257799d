"""Each tenant's webhook signing secret (docs/api.md, "Webhooks"): made on first use, by the tenant's first
``GET /v1/webhooks/secret`` or the first webhook sent for it, whichever comes first; rotated by the tenant
(``POST /v1/webhooks/secret/rotate``), the replaced secret staying valid for a while (24 hours unless the tenant
asks otherwise), during which deliveries carry a signature with each.

Stored in Redis (``inferq:tenant:{<tenant>}:webhook-secret``, ``webhooksecret.lua``), the one store the gateway,
the workers and the scaler all reach, so a secret made or rotated through the gateway signs the next delivery of
any sender, with no deploy. A tenant's secret is only ever answered to that tenant's API key; the senders read it
to sign. Secrets are in the Standard Webhooks form, ``whsec_<base64 of 32 random bytes>``.

Sealed at rest when ``INFERQ_WEBHOOK_SECRETS_KEY`` is set (:mod:`.envelope`: a KMS data key, or a local key file):
the script stores and answers sealed values, and only this module, in the process that signs or answers, opens
them. Opening and sealing run inline when their data key is cached, on a thread when the master key must be asked.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from dataclasses import dataclass
from typing import Any

from inferq.queue.keys import tenant_webhook_secret
from inferq.queue.protocol import Queue

from .envelope import SecretsCipher, SecretsUnavailable, cipher_for, is_sealed

KEEP_PREVIOUS_S = 86_400
"""How long a rotated-out secret keeps signing, unless the rotation asks for another time."""
MAX_KEEP_PREVIOUS_S = 7 * 86_400
SECRET_BYTES = 32


def new_secret() -> str:
    """A fresh secret in the Standard Webhooks form."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


@dataclass(frozen=True)
class TenantSecret:
    secret: str
    created_at: float
    previous: str | None
    previous_expires_at: float | None

    def signing(self, now: float | None = None) -> list[str]:
        """The secrets a delivery is signed with now: the current one, and the replaced one while it is valid."""
        now = time.time() if now is None else now
        if self.previous and self.previous_expires_at is not None and now < self.previous_expires_at:
            return [self.secret, self.previous]
        return [self.secret]

    def to_api(self, now: float | None = None) -> dict[str, Any]:
        valid = len(self.signing(now)) == 2
        return {
            "object": "webhook_secret",
            "secret": self.secret,
            "created_at": self.created_at,
            "previous": {"secret": self.previous, "expires_at": self.previous_expires_at} if valid else None,
        }


def _parse(reply: list[Any]) -> TenantSecret:
    secret, created_at, previous, previous_expires_at = (str(v) for v in reply)
    return TenantSecret(secret, float(created_at), previous or None,
                        float(previous_expires_at) if previous_expires_at else None)


async def tenant_secret(queue: Queue, tenant: str, *, replicated: bool = True) -> TenantSecret:
    """The tenant's secret, made now if it has none (atomic: every caller gets the same one). ``replicated=False``
    for a sender signing a delivery: a secret it makes that a failover then loses was never shown to anyone."""
    return await _call(queue, tenant, "ensure", 0, replicated=replicated)


async def rotate_secret(queue: Queue, tenant: str, keep_previous_s: int = KEEP_PREVIOUS_S) -> TenantSecret:
    """A new secret for the tenant; the one it replaces keeps signing for ``keep_previous_s`` seconds."""
    return await _call(queue, tenant, "rotate", int(keep_previous_s), replicated=True)


async def _call(queue: Queue, tenant: str, mode: str, keep_previous_s: int, *, replicated: bool) -> TenantSecret:
    # replicated: with INFERQ_REDIS_WAIT_REPLICAS, a secret answered to a tenant survives a failover (or the call
    # fails, 503, and is safe to make again)
    cipher = cipher_for(queue.settings.webhook_secrets_key)
    fresh = new_secret()
    stored = fresh if cipher is None else await _blocking(cipher.ready_to_seal(), cipher.seal, tenant, fresh)
    call = ("webhooksecret", [tenant_webhook_secret(tenant)], [mode, stored, repr(time.time()), keep_previous_s])
    [reply] = await queue._write([call], replicated=replicated)
    secret, created_at, previous, previous_expires_at = (str(v) for v in reply)
    return _parse([await _open(cipher, tenant, secret), created_at,
                   await _open(cipher, tenant, previous) if previous else "", previous_expires_at])


async def _open(cipher: SecretsCipher | None, tenant: str, stored: str) -> str:
    if cipher is None:
        if is_sealed(stored):
            raise SecretsUnavailable("a webhook secret is sealed, and INFERQ_WEBHOOK_SECRETS_KEY is unset here")
        return stored
    return await _blocking(cipher.ready_to_open(stored), cipher.open, tenant, stored)


async def _blocking(ready: bool, call: Any, *args: Any) -> str:
    """``call(*args)`` inline when it will not block (its data key is cached), on a thread when it asks KMS."""
    result: str = call(*args) if ready else await asyncio.to_thread(call, *args)
    return result
