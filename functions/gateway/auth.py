"""API keys -> tenants (G7).

Keys are compared as SHA-256 digests with :func:`hmac.compare_digest`, against every stored digest, so the time
taken does not depend on which key (if any) matched. In AWS only digests exist: the Secrets Manager secret named
by ``INFERQ_API_KEYS_SECRET`` holds ``{"<sha256 hex of key>": "<tenant>", ...}``, read with boto3 (imported on
first use, off the cold-start path) and cached for ``INFERQ_API_KEYS_CACHE_S`` seconds. A key added to the secret
is accepted, and a key removed from it refused, once the cache expires. A failed refresh keeps serving the last
good copy for at most ``INFERQ_API_KEYS_MAX_STALE_S`` seconds past its expiry; after that every request is 503 until
the secret can be read again (fail closed: a removed key cannot live on while Secrets Manager is unreachable).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
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
    """Digests from a Secrets Manager secret, cached for ``cache_s`` seconds."""

    def __init__(self, secret_id: str, cache_s: float, *, client: Any = None, max_stale_s: float = 900.0) -> None:
        self.secret_id = secret_id
        self.cache_s = cache_s
        self.max_stale_s = max_stale_s
        self._read_at = 0.0
        self._down_until = 0.0
        """When the cached copy was read (monotonic): it is served at most ``cache_s + max_stale_s`` after."""
        self._client = client
        self._digests: list[tuple[bytes, str]] | None = None
        self._fresh_until = 0.0
        self._lock = threading.Lock()

    def _secrets_manager(self) -> Any:
        if self._client is None:
            import boto3  # lazily: boto3 costs ~0.2 s of import, paid only when a secret is used
            from botocore.config import Config

            self._client = boto3.client(
                "secretsmanager", config=Config(connect_timeout=2, read_timeout=3, retries={"max_attempts": 2})
            )
        return self._client

    def _refresh(self) -> list[tuple[bytes, str]]:
        with self._lock:  # one reader at a time; the others find the fresh copy
            if self._digests is not None and time.monotonic() < self._fresh_until and not self._too_stale():
                return self._digests
            try:
                reply = self._secrets_manager().get_secret_value(SecretId=self.secret_id)
                digests = parse_secret(reply.get("SecretString") or "")
            except Exception as exc:
                if self._digests is None or self._too_stale():
                    self._down_until = time.monotonic() + REFRESH_BACKOFF_S  # 503 at once meanwhile, no pile-up
                    raise KeysUnavailable(f"cannot read the API keys secret: {type(exc).__name__}") from exc
                log.warning("API keys secret refresh failed; serving the cached copy", exc_info=True)
                self._fresh_until = time.monotonic() + min(REFRESH_BACKOFF_S, max(self.cache_s, 1.0))
                return self._digests
            self._digests = digests
            self._read_at = time.monotonic()
            self._fresh_until = self._read_at + self.cache_s
            return digests

    def _too_stale(self) -> bool:
        return time.monotonic() - self._read_at > self.cache_s + self.max_stale_s

    async def tenant_for(self, key: str) -> str | None:
        digests = self._digests
        if time.monotonic() < self._down_until:
            raise KeysUnavailable("the API keys secret could not be read a moment ago")
        if digests is None or time.monotonic() >= self._fresh_until or self._too_stale():
            digests = await asyncio.to_thread(self._refresh)
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
