"""The AWS clients every server role shares: one S3 client (the gateway's Files routes and claim checks, the batch
driver, the worker's claim checks) and Secrets Manager secrets read with Powertools' parameters utility and cached
on an injectable clock (the API keys, the cache's AUTH token).

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
from collections.abc import Callable
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


Clock = Callable[[], float]
"""A monotonic clock in seconds (``time.monotonic``; a test passes one it moves by hand, as cachetools' ``timer``)."""


def _provider(client: Any) -> Any:
    """A Powertools ``SecretsProvider`` on ``client``, or on a new client with short timeouts."""
    from aws_lambda_powertools.utilities.parameters import SecretsProvider

    quiet_sdk_logs()
    if client is None:
        from botocore.config import Config

        config = Config(connect_timeout=SECRETS_CONNECT_TIMEOUT_S, read_timeout=SECRETS_READ_TIMEOUT_S,
                        retries={"mode": "standard", "total_max_attempts": SECRETS_ATTEMPTS})
        return SecretsProvider(boto_config=config)
    return SecretsProvider(boto3_client=client)


class CachedSecret:
    """A Secrets Manager secret's string, read through Powertools' parameters utility and kept ``max_age_s``
    seconds. The cache is this class's, on an injected ``clock`` (Powertools' own cache reads the wall clock and
    raises when a read fails even with an expired copy in hand): every read it asks Powertools for is a fetch.
    A failed read serves the last good value for at most ``max_stale_s`` seconds past its expiry (``math.inf``: as
    long as reads fail), retrying every ``retry_after_s`` meanwhile rather than on every call; past the bound, or
    with nothing read yet, :class:`SecretUnavailable` (and no new read for ``retry_after_s``, so an outage is not a
    pile-up of reads). Thread-safe; a read is a blocking boto3 call."""

    def __init__(self, secret_id: str, max_age_s: float, *, max_stale_s: float = 0.0, retry_after_s: float = 10.0,
                 client: Any = None, clock: Clock = time.monotonic) -> None:
        self.secret_id = secret_id
        self.max_age_s = max_age_s
        self.max_stale_s = max_stale_s
        self.retry_after_s = retry_after_s
        self.clock = clock
        self._client = client
        self._powertools: Any = None
        self._value: str | None = None
        self._read_at = -math.inf
        """When Secrets Manager last answered (on ``clock``)."""
        self._fresh_until = -math.inf
        self._retry_at = -math.inf
        self._lock = threading.Lock()
        self.reads = 0
        """Reads of Secrets Manager that answered so far (tests and diagnostics; never the value)."""

    @property
    def read_at(self) -> float:
        """When Secrets Manager last answered (on ``clock``; ``-inf`` before the first read)."""
        return self._read_at

    def cached(self) -> bool:
        """Whether :meth:`get` answers now without a read (a fresh copy, or the stale copy between retries): an
        asyncio caller calls it inline then, and on a thread otherwise."""
        now = self.clock()
        if self._value is None or self._too_stale(now):
            return False
        return now < self._fresh_until or now < self._retry_at

    def _too_stale(self, now: float) -> bool:
        return now - self._read_at >= self.max_age_s + self.max_stale_s

    def _read(self) -> str:
        """One read of Secrets Manager (the lock held); raises what Powertools raises."""
        if self._powertools is None:
            self._powertools = _provider(self._client)
        value = self._powertools.get(self.secret_id, max_age=0, force_fetch=True)
        self._value = value.decode() if isinstance(value, bytes) else str(value)
        self._read_at = self.clock()
        self._fresh_until = self._read_at + self.max_age_s
        self._retry_at = -math.inf
        self.reads += 1
        return self._value

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
        now = self.clock()
        if self._value is not None and now < self._fresh_until:
            return self._value
        if now < self._retry_at:  # the last read failed a moment ago
            if self._value is not None and not self._too_stale(now):
                return self._value
            raise SecretUnavailable(f"secret {self.secret_id} could not be read a moment ago")
        try:
            return self._read()
        except Exception as exc:  # Powertools' GetParameterError wraps whatever boto3 raised
            self._retry_at = self.clock() + self.retry_after_s
            if self._value is None or self._too_stale(self.clock()):
                raise SecretUnavailable(f"cannot read secret {self.secret_id}: {type(exc).__name__}") from exc
            log.warning("secret %s: read failed (%s); serving the copy in hand", self.secret_id,
                        type(exc).__name__)
            return self._value

    def read_now(self, *, unless: Callable[[str], bool] | None = None) -> str:
        """Read the secret now, whatever the cache holds (the server refused what it held), unless the copy in hand
        already passes ``unless``: checked under the lock, so of many callers refused with the same copy (a burst
        of connections after a rotation) the first reads and the others get what it read. A failure raises
        :class:`SecretUnavailable` and leaves the copy in hand as it was."""
        with self._lock:
            if unless is not None and self._value is not None and unless(self._value):
                return self._value
            try:
                return self._read()
            except Exception as exc:
                raise SecretUnavailable(f"cannot read secret {self.secret_id}: {type(exc).__name__}") from exc

    def forget_client(self) -> None:
        """Drop the boto3 client (SnapStart: a restored snapshot makes its clients anew) and count the copy in hand
        as expired, so the next :meth:`get` reads with a new client; the value stays, served within the stale bound
        if that read fails."""
        with self._lock:
            self._powertools = None
            self._client = None
            self._fresh_until = -math.inf
