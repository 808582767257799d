"""The key check of the HTTP API's Lambda authorizer (app.py runs it): the key read from a request's headers as the
gateway reads it, checked against the gateway's key store, answered as a simple response (payload format 2.0)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from functions.gateway.auth import KeyStore, KeysUnavailable

from .edge import OriginCheck

log = logging.getLogger("inferq.authorizer")

DENY: dict[str, Any] = {"isAuthorized": False}
KEYLESS_PAGES = frozenset({("GET", "/console/")})
"""Public pages that reach the authorizer: the console's page (docs/api.md, "GET /console") carries no data, and a
route may not end in "/", so it cannot be one of the public routes template.yaml exempts from the authorizer."""


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
    refresh runs in the loop's default executor, which lives as long as the loop). With ``origin`` (a stack with an
    edge), a request that did not come through the edge is refused first, whatever its key."""

    def __init__(self, keys: KeyStore, origin: OriginCheck | None = None) -> None:
        self.keys = keys
        self.origin = origin
        self._loop = asyncio.new_event_loop()

    def __call__(self, event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
        if self.origin is not None and not self.origin.allows(event.get("headers")):
            return DENY  # the execute-api address called directly: the edge's web ACL skipped
        key = presented_key(event.get("headers"))
        if not key:
            method = ((event.get("requestContext") or {}).get("http") or {}).get("method")
            return {"isAuthorized": True} if (method, event.get("rawPath")) in KEYLESS_PAGES else DENY
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
