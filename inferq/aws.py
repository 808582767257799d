"""The AWS clients every server role shares: one S3 client (the gateway's Files routes and claim checks, the batch
driver, the worker's claim checks) and Secrets Manager secrets cached with Powertools' parameters utility (the API
keys, the cache's AUTH token).

boto3 and Powertools are imported at first use, never when this module is imported: importing ``inferq`` loads no
AWS SDK (tests/unit/test_layout.py), and a process that reads no secret (the gateway with development keys) never
pays for them. ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` point the S3 client at moto in the emulator.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

S3_ATTEMPTS = 3
"""botocore's attempts per S3 call (standard retry mode: throttling and 5xx with backoff). The worker's claim checks
retry a failed call again on top (gpu_worker/claim_check.py), the gateway answers 503 with ``Retry-After``."""
S3_CONNECT_TIMEOUT_S, S3_READ_TIMEOUT_S = 3, 30

SECRETS_CONNECT_TIMEOUT_S, SECRETS_READ_TIMEOUT_S, SECRETS_ATTEMPTS = 2, 3, 2
"""Short: a secret is read inside a request (the API keys) or a connection's handshake (the cache token)."""


SDK_LOGGERS = ("boto3", "botocore", "s3transfer", "urllib3")
"""The AWS SDK's loggers. At DEBUG botocore logs whole responses, a secret's value among them, so they are held at
INFO or above whatever a process's root level is (``INFERQ_LOG_LEVEL=DEBUG`` on a worker, a Lambda's log level)."""


def quiet_sdk_logs() -> None:
    """Hold the AWS SDK's loggers at INFO or above: no secret reaches a log through botocore's DEBUG output."""
    for name in SDK_LOGGERS:
        sdk = logging.getLogger(name)
        if sdk.getEffectiveLevel() < logging.INFO:
            sdk.setLevel(logging.INFO)


def s3_client() -> Any:
    """The one S3 client configuration: path-style addressing on an endpoint (moto), SigV4 (presigned claim-check
    URLs carry ``X-Amz-Expires``, as S3 requires), :data:`S3_ATTEMPTS` attempts."""
    import boto3
    from botocore.config import Config

    quiet_sdk_logs()
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        config=Config(
            s3={"addressing_style": "path"} if endpoint else {},
            signature_version="s3v4",
            connect_timeout=S3_CONNECT_TIMEOUT_S,
            read_timeout=S3_READ_TIMEOUT_S,
            retries={"mode": "standard", "total_max_attempts": S3_ATTEMPTS},
        ),
    )


def kms_client() -> Any:
    """A KMS client (the tenant webhook secrets' data keys): short timeouts, ``AWS_ENDPOINT_URL_KMS`` or
    ``AWS_ENDPOINT_URL`` honoured by boto3 itself."""
    import boto3
    from botocore.config import Config

    quiet_sdk_logs()
    return boto3.client("kms", config=Config(connect_timeout=SECRETS_CONNECT_TIMEOUT_S,
                                             read_timeout=SECRETS_READ_TIMEOUT_S,
                                             retries={"mode": "standard", "total_max_attempts": SECRETS_ATTEMPTS}))


class SecretUnavailable(Exception):
    """The secret cannot be read and no copy young enough is in hand."""


def _provider(client: Any, on_read: Any) -> Any:
    """A Powertools ``SecretsProvider`` on ``client`` (or a new client with short timeouts) that calls ``on_read``
    each time Secrets Manager answered: its cache (``max_age``) decides when to read again; when the last read
    answered is what the stale bound below needs. ``_get`` is the method Powertools documents for a provider to
    implement (its "bring your own provider" extension point)."""
    from aws_lambda_powertools.utilities.parameters import SecretsProvider

    quiet_sdk_logs()
    class ReportingSecretsProvider(SecretsProvider):
        def _get(self, name: str, **sdk_options: Any) -> str | bytes:
            value: str | bytes = super()._get(name, **sdk_options)
            on_read()
            return value

    if client is None:
        from botocore.config import Config

        config = Config(connect_timeout=SECRETS_CONNECT_TIMEOUT_S, read_timeout=SECRETS_READ_TIMEOUT_S,
                        retries={"mode": "standard", "total_max_attempts": SECRETS_ATTEMPTS})
        return ReportingSecretsProvider(boto_config=config)
    return ReportingSecretsProvider(boto3_client=client)


class CachedSecret:
    """A Secrets Manager secret's string, read through Powertools' parameters utility and kept ``max_age_s``
    seconds (its cache). Powertools raises when a read fails, even with an expired copy in hand; this adds the one
    thing it lacks, bounded staleness: a failed read serves the last good value for at most ``max_stale_s`` seconds
    past its expiry (``math.inf``: as long as reads fail), retrying every ``retry_after_s`` meanwhile rather than on
    every call; past the bound, or with nothing read yet, :class:`SecretUnavailable` (and no new read for
    ``retry_after_s``, so an outage is not a pile-up of reads). Thread-safe; a read is a blocking boto3 call."""

    def __init__(self, secret_id: str, max_age_s: int, *, max_stale_s: float = 0.0, retry_after_s: float = 10.0,
                 client: Any = None) -> None:
        self.secret_id = secret_id
        self.max_age_s = int(max_age_s)
        self.max_stale_s = max_stale_s
        self.retry_after_s = retry_after_s
        self._client = client
        self._powertools: Any = None
        self._value: str | None = None
        self._read_at = -math.inf
        """When Secrets Manager last answered (monotonic)."""
        self._retry_at = -math.inf
        self._lock = threading.Lock()
        self.reads = 0
        """Reads of Secrets Manager that answered so far (tests and diagnostics; never the value)."""

    @property
    def read_at(self) -> float:
        """When Secrets Manager last answered (monotonic; ``-inf`` before the first read)."""
        return self._read_at

    def _answered(self) -> None:
        self.reads += 1
        self._read_at = time.monotonic()

    def cached(self) -> bool:
        """Whether :meth:`get` answers now without a read (from Powertools' cache, or the stale copy between
        retries): an asyncio caller calls it inline then, and on a thread otherwise."""
        now = time.monotonic()
        if self._value is None or self._powertools is None:
            return False
        if self._too_stale(now):
            return False
        return now < self._read_at + self.max_age_s or now < self._retry_at

    def _too_stale(self, now: float) -> bool:
        return now - self._read_at > self.max_age_s + self.max_stale_s

    def _secrets(self) -> Any:
        if self._powertools is None:
            self._powertools = _provider(self._client, self._answered)
        return self._powertools

    def get(self, *, wait: bool = True) -> str:
        """The value. ``wait=False`` (an event loop's caller, after :meth:`cached`): while another thread holds the
        lock for a read, the copy in hand is answered instead of waiting for that read."""
        if not self._lock.acquire(blocking=wait):
            value = self._value
            if value is not None and self.cached():
                return value
            self._lock.acquire()
        try:
            return self._get()
        finally:
            self._lock.release()

    def _get(self) -> str:
        """:meth:`get` with the lock held."""
        now = time.monotonic()
        if now < self._retry_at:  # the last read failed a moment ago
            if self._value is not None and not self._too_stale(now):
                return self._value
            raise SecretUnavailable(f"secret {self.secret_id} could not be read a moment ago")
        try:
            value = self._secrets().get(self.secret_id, max_age=self.max_age_s)
        except Exception as exc:  # Powertools' GetParameterError wraps whatever boto3 raised
            self._retry_at = time.monotonic() + self.retry_after_s
            if self._value is None or self._too_stale(time.monotonic()):
                raise SecretUnavailable(f"cannot read secret {self.secret_id}: {type(exc).__name__}") from exc
            log.warning("secret %s: read failed (%s); serving the copy in hand", self.secret_id,
                        type(exc).__name__)
            return self._value
        self._value = value.decode() if isinstance(value, bytes) else str(value)
        self._retry_at = -math.inf
        return self._value

    def read_now(self) -> str:
        """Read the secret now, whatever the cache holds (the server refused what it held); a failure raises
        :class:`SecretUnavailable` and leaves the copy in hand as it was."""
        with self._lock:
            try:
                value = self._secrets().get(self.secret_id, max_age=self.max_age_s, force_fetch=True)
            except Exception as exc:
                raise SecretUnavailable(f"cannot read secret {self.secret_id}: {type(exc).__name__}") from exc
            self._value = value.decode() if isinstance(value, bytes) else str(value)
            self._retry_at = -math.inf
            return self._value

    def forget_client(self) -> None:
        """Drop the boto3 client (SnapStart: a restored snapshot makes its clients anew) and with it Powertools'
        cache, so the next :meth:`get` reads; the value in hand stays, served within the stale bound if that read
        fails."""
        with self._lock:
            self._powertools = None
            self._client = None
