"""API keys -> tenants (G7).

Keys are compared as SHA-256 digests with :func:`hmac.compare_digest`, against every stored digest, so the time
taken does not depend on which key (if any) matched. In AWS only digests exist: the Secrets Manager secret named
by ``INFERQ_API_KEYS_SECRET`` holds ``{"<sha256 hex of key>": "<tenant>", ...}``, read with Powertools' parameters
utility (it and boto3 imported on first use, off the cold-start path: :mod:`inferq.aws`) and cached for
``INFERQ_API_KEYS_CACHE_S`` seconds. A key added to the secret is accepted, and a key removed from it refused, once
the cache expires. A failed refresh keeps serving the last good copy for at most ``INFERQ_API_KEYS_MAX_STALE_S``
seconds past its expiry; after that every request is 503 until the secret can be read again (fail closed: a removed
key cannot live on while Secrets Manager is unreachable).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from inferq.config.settings import Settings, SettingsError
from inferq.queue.keys import TENANT, TENANT_RULE

log = logging.getLogger("inferq.gateway.auth")

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
REFRESH_BACKOFF_S = 10.0
"""After a failed refresh, the stale copy is served this long before the next try."""


class KeysUnavailable(Exception):
    """The key store cannot answer (the secret could not be read and nothing is cached): a 503, not a 401."""


class KeyStore(Protocol):
    async def tenant_for(self, key: str) -> str | None:
        """The tenant owning ``key``, or None."""
        ...


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def _match(presented: bytes, digests: Sequence[tuple[bytes, str]]) -> str | None:
    found = None
    for stored, tenant in digests:  # no early exit: every digest is compared
        if hmac.compare_digest(presented, stored):
            found = tenant
    return found


class StaticKeys:
    """Keys from ``INFERQ_API_KEYS`` (development) or a test: {key: tenant}. Only digests are kept."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self._digests = [(digest(key), tenant) for key, tenant in keys.items()]

    async def tenant_for(self, key: str) -> str | None:
        return _match(digest(key), self._digests)


def parse_secret(raw: str) -> list[tuple[bytes, str]]:
    """``{"<sha256 hex>": "tenant"}`` -> digests. A malformed secret is an error, never a silently empty key set."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"the API keys secret is not JSON: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise ValueError("the API keys secret must be a non-empty JSON object {sha256_hex: tenant}")
    digests = []
    for hex_digest, tenant in data.items():
        if not isinstance(hex_digest, str) or not _DIGEST_RE.match(hex_digest.lower()):
            raise ValueError("every key of the API keys secret must be a SHA-256 hex digest (64 hex characters)")
        if not isinstance(tenant, str) or not TENANT.match(tenant):
            raise ValueError(f"tenant {tenant!r} must be {TENANT_RULE}")
        digests.append((bytes.fromhex(hex_digest), tenant))
    return digests


class SecretKeys:
    """Digests from a Secrets Manager secret, read through Powertools' parameters utility and cached for
    ``cache_s`` seconds on ``clock`` (:class:`inferq.aws.CachedSecret`, with its stale bound)."""

    def __init__(self, secret_id: str, cache_s: float, *, client: Any = None, max_stale_s: float = 900.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from inferq.aws import CachedSecret  # boto3 and Powertools load at the first read, not here

        self.secret = CachedSecret(secret_id, cache_s, max_stale_s=max_stale_s, clock=clock,
                                   retry_after_s=min(REFRESH_BACKOFF_S, max(cache_s, 1.0)), client=client)
        self._parsed: tuple[str, list[tuple[bytes, str]]] | None = None
        """The last good copy: the secret's string and its digests (parsed once per copy)."""
        self._good_at = 0.0
        """When the last good copy was read (on the secret's clock)."""
        self._malformed: str | None = None

    @property
    def secret_id(self) -> str:
        return self.secret.secret_id

    def forget_client(self) -> None:
        self.secret.forget_client()

    def _digests(self, *, wait: bool = True) -> list[tuple[bytes, str]]:
        from inferq.aws import SecretUnavailable

        try:
            raw = self.secret.get(wait=wait)
        except SecretUnavailable as exc:
            raise KeysUnavailable(f"cannot read the API keys secret: {exc}") from exc
        parsed = self._parsed
        if parsed is not None and parsed[0] is raw:
            return parsed[1]  # the same copy as last time: parsed once
        try:
            if raw is self._malformed:
                raise ValueError("unchanged since it was found malformed")
            digests = parse_secret(raw)
        except ValueError as exc:
            # never a silently empty key set: the last good keys within the stale bound, else 503
            self._malformed = raw
            bound = self.secret.max_age_s + self.secret.max_stale_s
            if parsed is not None and self.secret.clock() - self._good_at <= bound:
                log.warning("API keys secret is malformed; serving the last good keys")
                return parsed[1]
            raise KeysUnavailable(f"the API keys secret is malformed: {exc}") from exc
        self._parsed = (raw, digests)
        self._good_at = self.secret.read_at
        return digests

    async def tenant_for(self, key: str) -> str | None:
        if self.secret.cached():
            digests = self._digests(wait=False)  # from the cache: no read, no thread
        else:
            digests = await asyncio.to_thread(self._digests)
        return _match(digest(key), digests)


class KeyRing:
    """Several stores, asked in order (dev keys and the secret may both be configured)."""

    def __init__(self, stores: Sequence[KeyStore]) -> None:
        self.stores = list(stores)

    async def tenant_for(self, key: str) -> str | None:
        for store in self.stores:
            tenant = await store.tenant_for(key)
            if tenant is not None:
                return tenant
        return None


def key_store(settings: Settings, keys: KeyStore | Mapping[str, str] | None = None) -> KeyStore:
    """The key store for ``settings``; with no keys anywhere the gateway refuses to start (docs/configuration.md)."""
    if keys is not None:
        return StaticKeys(keys) if isinstance(keys, Mapping) else keys
    stores: list[KeyStore] = []
    if settings.api_keys:
        stores.append(StaticKeys(settings.api_keys))
    if settings.api_keys_secret:
        stores.append(SecretKeys(settings.api_keys_secret, settings.api_keys_cache_s,
                                 max_stale_s=settings.api_keys_max_stale_s))
    if not stores:
        raise SettingsError(
            Settings.variable("api_keys"),
            "no API keys configured: set INFERQ_API_KEYS (development) or INFERQ_API_KEYS_SECRET (Secrets Manager)",
        )
    return stores[0] if len(stores) == 1 else KeyRing(stores)
