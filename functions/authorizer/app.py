"""The HTTP API's Lambda authorizer: ``functions/authorizer/app.handler`` (template.yaml, AuthorizerFunction).

API Gateway calls it before every route but the public ones (``/healthz``, ``/readyz``, ``/openapi.json``, the
console's static files), with payload format 2.0, and reads a simple response: ``{"isAuthorized": true, "context":
{"tenant": ...}}`` lets the request on to the gateway, ``{"isAuthorized": false}`` refuses it there, so a request
without a valid key never runs the gateway function (docs/operations.md, "Security findings").

The key is read from the headers exactly as the gateway reads it (``Authorization: Bearer <key>``, else
``x-api-key``) and checked against the same key store (:func:`functions.gateway.auth.key_store`: the SHA-256
digests of ``INFERQ_API_KEYS_SECRET``, cached for ``INFERQ_API_KEYS_CACHE_S``, served stale for at most
``INFERQ_API_KEYS_MAX_STALE_S`` while Secrets Manager fails). Past that bound the store cannot answer and the
invocation fails, which API Gateway answers with a 500: fail closed, as the gateway's 503 is. The gateway checks the
key again itself (defence in depth; ``inferq up`` has no authorizer).

The authorizer has no identity sources, so API Gateway cannot cache its answers: an identity source must be present
for API Gateway to call the authorizer at all, and a client may send its key in either of two headers. The cache is
this module's: the key store lives as long as the sandbox.

Settings are read at import, so a bad variable (or no API keys at all) fails the init naming it. The import is
small on purpose: the standard library, ``inferq``'s settings and the key check; boto3 only at the first Secrets
Manager read; no FastAPI, no Redis (tests/unit/test_authorizer.py holds the line).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from functions.gateway.auth import KeyStore, KeysUnavailable, key_store
from inferq.settings import Settings

log = logging.getLogger("inferq.authorizer")

DENY: dict[str, Any] = {"isAuthorized": False}


def presented_key(headers: Mapping[str, str] | None) -> str | None:
    """The API key of a request's headers as the gateway reads it (``functions/gateway/api.py``, ``tenant_from``):
    the credentials of an ``Authorization: Bearer`` header (scheme in any case), else ``x-api-key``. Payload 2.0
    gives header names in lower case; a repeated header arrives comma-joined and then matches no key."""
    lowered = {name.lower(): value for name, value in (headers or {}).items()}
    authorization = lowered.get("authorization") or ""
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    if scheme and credentials and scheme.lower() == "bearer":
        return credentials
    return lowered.get("x-api-key") or None


class Authorizer:
    """The key check of one sandbox: one key store, and one event loop to run its coroutine on (the store's
    refresh runs in the loop's default executor, which lives as long as the loop)."""

    def __init__(self, keys: KeyStore) -> None:
        self.keys = keys
        self._loop = asyncio.new_event_loop()

    def __call__(self, event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
        key = presented_key(event.get("headers"))
        if not key:
            return DENY
        try:
            tenant = self._loop.run_until_complete(self.keys.tenant_for(key))
        except KeysUnavailable:
            # the store fails closed; raising makes API Gateway answer 500 rather than a 403 that tells a client with
            # a good key that its key is wrong
            log.error("API keys unavailable: request refused (the secret could not be read within its staleness bound)")
            raise
        if tenant is None:
            return DENY
        return {"isAuthorized": True, "context": {"tenant": tenant}}

    def close(self) -> None:
        self._loop.close()


settings = Settings.from_env()
logging.getLogger("inferq").setLevel(settings.log_level)
handler = Authorizer(key_store(settings))
