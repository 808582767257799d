"""Tenant webhook secrets encrypted at rest (``INFERQ_WEBHOOK_SECRETS_KEY``): what the cache holds, its snapshots
and its replicas, and what every role could read with a cache user, is ciphertext.

Envelope encryption. A secret is sealed with AES-256-GCM under a **data key**; the data key travels with it, wrapped
by a **master key** the cache never sees: a KMS key in AWS (``GenerateDataKey`` / ``Decrypt`` with the encryption
context ``purpose=inferq-webhook-secrets``, which the roles' grants require), or a key file on local disk for
``inferq up`` (``file:<path>``, 32 random bytes made on first use, mode 0600), which wraps the same way with
AES-256-GCM. One format for both::

    enc1.<kms|file>.<base64url wrapped data key>.<base64url 12-byte nonce + ciphertext + tag>

The tenant's name is the authenticated data: a sealed secret copied into another tenant's record does not open.

Cached, so KMS is called rarely: a writer makes one data key and seals with it for :data:`DATA_KEY_MAX_AGE_S` (one
``GenerateDataKey`` per process per hour), a reader keeps the data keys it unwrapped (one ``Decrypt`` per wrapped key
per process per hour, however many tenants). Plaintext data keys live in memory only, never in the cache or a log.

A stored value that is not sealed (``whsec_...``, written before encryption was configured) is read as it is; the
tenant's next rotation stores it sealed. ``cryptography`` is imported at the first seal or open.
"""

from __future__ import annotations

import base64
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

PREFIX = "enc1"
CONTEXT = {"purpose": "inferq-webhook-secrets"}
"""The KMS encryption context of every data key: the roles' grants are conditioned on it."""
DATA_KEY_MAX_AGE_S = 3600.0
DATA_KEY_MAX_USES = 1 << 20
"""Seals under one data key, well below AES-GCM's bound for random 96-bit nonces."""
UNWRAPPED_KEPT = 64
NONCE_BYTES = 12


class SecretsUnavailable(Exception):
    """A sealed secret cannot be opened (no key configured here, the master key refused, or a tampered value)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _aead(key: bytes) -> Any:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # lazily: only sealing and opening pay for it

    return AESGCM(key)


class KeyWrapper(Protocol):
    kind: str

    def new_data_key(self) -> tuple[bytes, bytes]:
        """(plaintext data key, its wrapped form)."""
        ...

    def unwrap(self, wrapped: bytes) -> bytes:
        ...


class KmsWrapper:
    """Data keys from a KMS key (its ARN or alias): blocking boto3 calls, each with the encryption context."""

    kind = "kms"

    def __init__(self, key_id: str, client: Any = None) -> None:
        self.key_id = key_id
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            from inferq.aws import kms_client

            self._client = kms_client()
        return self._client

    def new_data_key(self) -> tuple[bytes, bytes]:
        reply = self.client.generate_data_key(KeyId=self.key_id, KeySpec="AES_256", EncryptionContext=CONTEXT)
        return bytes(reply["Plaintext"]), bytes(reply["CiphertextBlob"])

    def unwrap(self, wrapped: bytes) -> bytes:
        reply = self.client.decrypt(KeyId=self.key_id, CiphertextBlob=wrapped, EncryptionContext=CONTEXT)
        return bytes(reply["Plaintext"])


class FileWrapper:
    """Data keys wrapped by a 32-byte master key in a local file (``inferq up``: its ``--data-dir``), made on first
    use with mode 0600. The wrapped form is ``nonce + AES-256-GCM(master, data key)``, the context as its AAD."""

    kind = "file"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._master: bytes | None = None
        self._lock = threading.Lock()

    def master(self) -> bytes:
        with self._lock:
            if self._master is None:
                self._master = self._read_or_make()
            return self._master

    def _read_or_make(self) -> bytes:
        try:
            key = self.path.read_bytes()
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            key = secrets.token_bytes(32)
            try:  # created exclusively, owner-only: two processes starting together agree on one key
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                key = self.path.read_bytes()
            else:
                with os.fdopen(fd, "wb") as file:
                    file.write(key)
        if len(key) != 32:
            raise SecretsUnavailable(f"the webhook secrets key file {self.path} does not hold a 32-byte key")
        return key

    def new_data_key(self) -> tuple[bytes, bytes]:
        data_key = secrets.token_bytes(32)
        nonce = secrets.token_bytes(NONCE_BYTES)
        return data_key, nonce + _aead(self.master()).encrypt(nonce, data_key, b"purpose=inferq-webhook-secrets")

    def unwrap(self, wrapped: bytes) -> bytes:
        return bytes(_aead(self.master()).decrypt(wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:],
                                                  b"purpose=inferq-webhook-secrets"))


class SecretsCipher:
    """Seals and opens tenant secrets (the module's format), caching data keys. Thread-safe; :meth:`seal` and
    :meth:`open` may block on the master key (KMS): :meth:`ready_to_seal` and :meth:`ready_to_open` say when they
    will not, so an event loop calls them inline then and on a thread otherwise."""

    def __init__(self, wrapper: KeyWrapper, *, clock: Callable[[], float] = time.monotonic,
                 data_key_max_age_s: float = DATA_KEY_MAX_AGE_S, kept: int = UNWRAPPED_KEPT) -> None:
        self.wrapper = wrapper
        self.clock = clock
        self.max_age_s = data_key_max_age_s
        self.kept = kept
        self._sealing: tuple[bytes, bytes, float, int] | None = None
        """(data key, wrapped, made at, seals so far)."""
        self._unwrapped: OrderedDict[bytes, tuple[bytes, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.wraps = 0
        self.unwraps = 0
        """Calls of the master key so far (diagnostics and tests; never the keys)."""

    # ------------------------------------------------------------------ sealing

    def ready_to_seal(self) -> bool:
        sealing = self._sealing
        return sealing is not None and self._fresh(sealing[2]) and sealing[3] < DATA_KEY_MAX_USES

    def _fresh(self, since: float) -> bool:
        return self.clock() - since < self.max_age_s

    def seal(self, tenant: str, plaintext: str) -> str:
        with self._lock:
            if not self.ready_to_seal():
                data_key, wrapped = self.wrapper.new_data_key()
                self.wraps += 1
                self._sealing = (data_key, wrapped, self.clock(), 0)
                self._unwrapped[wrapped] = (data_key, self.clock())
            assert self._sealing is not None
            data_key, wrapped, made_at, uses = self._sealing
            self._sealing = (data_key, wrapped, made_at, uses + 1)
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = nonce + _aead(data_key).encrypt(nonce, plaintext.encode(), _aad(tenant))
        return ".".join((PREFIX, self.wrapper.kind, _b64(wrapped), _b64(sealed)))

    # ------------------------------------------------------------------ opening

    def ready_to_open(self, stored: str) -> bool:
        if not is_sealed(stored):
            return True
        parts = stored.split(".")
        cached = self._unwrapped.get(_unb64(parts[2])) if len(parts) == 4 else None
        return cached is not None and self._fresh(cached[1])

    def open(self, tenant: str, stored: str) -> str:
        if not is_sealed(stored):
            return stored
        parts = stored.split(".")
        if len(parts) != 4 or parts[1] != self.wrapper.kind:
            raise SecretsUnavailable(f"a webhook secret sealed by {parts[1] if len(parts) > 1 else '?'} keys cannot "
                                     f"be opened with this process's ({self.wrapper.kind})")
        try:
            wrapped, sealed = _unb64(parts[2]), _unb64(parts[3])
            data_key = self._data_key(wrapped)
            plaintext = _aead(data_key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], _aad(tenant))
        except SecretsUnavailable:
            raise
        except Exception as exc:  # InvalidTag (tampered, another tenant's), a refused Decrypt, bad base64
            raise SecretsUnavailable(f"a webhook secret could not be opened: {type(exc).__name__}") from None
        return bytes(plaintext).decode()

    def _data_key(self, wrapped: bytes) -> bytes:
        with self._lock:
            cached = self._unwrapped.get(wrapped)
            if cached is not None and self._fresh(cached[1]):
                self._unwrapped.move_to_end(wrapped)
                return cached[0]
        data_key = self.wrapper.unwrap(wrapped)  # outside the lock: a slow KMS call holds up no cached opening
        with self._lock:
            self.unwraps += 1
            self._unwrapped[wrapped] = (data_key, self.clock())
            while len(self._unwrapped) > self.kept:
                self._unwrapped.popitem(last=False)
        return data_key


def _aad(tenant: str) -> bytes:
    return b"inferq webhook secret of tenant " + tenant.encode()


def is_sealed(stored: str) -> bool:
    return stored.startswith(PREFIX + ".")


def wrapper_for(key: str) -> KeyWrapper:
    """``INFERQ_WEBHOOK_SECRETS_KEY``'s value as a key wrapper: ``file:<path>``, or a KMS key ARN or alias."""
    if key.startswith("file:"):
        return FileWrapper(key[len("file:"):])
    return KmsWrapper(key)


_CIPHERS: dict[str, SecretsCipher] = {}
_CIPHERS_LOCK = threading.Lock()


def cipher_for(key: str | None) -> SecretsCipher | None:
    """The process's cipher for ``INFERQ_WEBHOOK_SECRETS_KEY`` (one per key, so its data keys are shared by every
    queue and sender of the process); None when it is unset."""
    if not key:
        return None
    with _CIPHERS_LOCK:
        cipher = _CIPHERS.get(key)
        if cipher is None:
            cipher = _CIPHERS[key] = SecretsCipher(wrapper_for(key))
        return cipher


def reset() -> None:
    """Forget every cipher and the data keys it holds (a process that changed its environment, tests)."""
    with _CIPHERS_LOCK:
        _CIPHERS.clear()
