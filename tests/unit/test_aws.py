"""inferq/aws.py: one S3 client for the gateway and the worker (one retry configuration), and Secrets Manager
secrets cached with Powertools' parameters utility plus a stale bound (moto's Secrets Manager)."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from functions.storage import ClaimStore, FileStore
from gpu_worker.claim_check import ClaimCheck
from inferq import aws
from inferq.config.settings import Settings
from tests.support.clock import FakeClock


class Counting:
    """A Secrets Manager client that counts the reads asked of it, answered or not."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls = 0

    def get_secret_value(self, **kwargs: Any) -> Any:
        self.calls += 1
        return self.client.get_secret_value(**kwargs)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "eu-west-1")):
        monkeypatch.setenv(name, value)


@pytest.fixture
def secrets(aws_env: None) -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("secretsmanager")


def retries(client: Any) -> dict[str, Any]:
    return dict(client.meta.config.retries)


def test_the_gateway_and_the_worker_get_the_same_s3_client(aws_env: None) -> None:
    gateway = [FileStore("files").client, ClaimStore("files").client]
    worker = ClaimCheck(Settings(files_bucket="files")).client
    for client in [*gateway, worker]:
        assert retries(client) == {"mode": "standard", "total_max_attempts": aws.S3_ATTEMPTS}
        assert client.meta.config.signature_version == "s3v4"
        assert client.meta.config.read_timeout == aws.S3_READ_TIMEOUT_S
    assert aws.S3_ATTEMPTS == 3


def test_an_endpoint_gives_path_style_addressing(monkeypatch: pytest.MonkeyPatch, aws_env: None) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:5999")
    client = aws.s3_client()
    assert client.meta.endpoint_url == "http://127.0.0.1:5999"
    assert client.meta.config.s3 == {"addressing_style": "path"}


def test_a_secret_is_cached_for_max_age_then_read_again(secrets: Any) -> None:
    secrets.create_secret(Name="s", SecretString="one")
    clock = FakeClock()
    cached = aws.CachedSecret("s", 60, client=Counting(secrets), clock=clock)
    assert not cached.cached()
    assert cached.get() == "one"
    assert cached.cached()
    secrets.put_secret_value(SecretId="s", SecretString="two")
    clock.advance(59.9)
    assert [cached.get() for _ in range(3)] == ["one"] * 3  # within max_age: the copy in hand
    assert cached.reads == cached._client.calls == 1
    clock.advance(0.1)
    assert not cached.cached()
    assert cached.get() == "two"
    assert cached.reads == 2
    secrets.put_secret_value(SecretId="s", SecretString="three")
    assert cached.read_now() == "three"  # whatever the cache holds
    assert cached.read_now(unless=lambda held: held != "two") == "three"  # a copy other than the refused one: no read
    assert cached.reads == cached._client.calls == 3


def test_a_failed_read_serves_the_copy_in_hand_up_to_the_bound_then_refuses(secrets: Any) -> None:
    secrets.create_secret(Name="s", SecretString="one")
    clock = FakeClock()
    client = Counting(secrets)
    cached = aws.CachedSecret("s", 60, max_stale_s=30, retry_after_s=5, client=client, clock=clock)
    assert cached.get() == "one"
    secrets.delete_secret(SecretId="s", ForceDeleteWithoutRecovery=True)
    clock.advance(60)
    assert cached.get() == "one"  # expired, its read failed: stale within max_age + max_stale_s
    assert client.calls == 2
    clock.advance(4.9)
    assert cached.get() == "one"  # within retry_after_s of the failed read: no read
    assert client.calls == 2
    clock.advance(0.1)
    assert cached.get() == "one"  # retried, failed again, still within the bound
    assert client.calls == 3
    clock.advance(25.1)  # 90.1 s after the read: past max_age + max_stale_s
    with pytest.raises(aws.SecretUnavailable):
        cached.get()
    with pytest.raises(aws.SecretUnavailable):
        cached.get()  # within retry_after_s: refused without a read
    assert client.calls == 4
    assert cached.reads == 1
    secrets.create_secret(Name="s", SecretString="back")
    clock.advance(5)
    assert cached.get() == "back"  # Secrets Manager answers again: so does the cache


def test_a_forgotten_client_reads_again_with_a_new_one_and_keeps_the_copy_within_the_bound(secrets: Any) -> None:
    secrets.create_secret(Name="s", SecretString="one")
    clock = FakeClock()
    cached = aws.CachedSecret("s", 60, max_stale_s=30, client=secrets, clock=clock)
    assert cached.get() == "one"
    secrets.put_secret_value(SecretId="s", SecretString="two")
    cached.forget_client()  # what SnapStart's restore does
    assert not cached.cached()
    assert cached.get() == "two"  # read at once, by a new client
    assert cached.reads == 2
    cached.forget_client()
    secrets.delete_secret(SecretId="s", ForceDeleteWithoutRecovery=True)
    assert cached.get() == "two"  # that read failed: the copy in hand, within the bound
    assert cached.reads == 2


def test_nothing_read_yet_is_unavailable_and_a_failed_forced_read_keeps_the_copy(secrets: Any) -> None:
    with pytest.raises(aws.SecretUnavailable):
        aws.CachedSecret("missing", 60, max_stale_s=math.inf, client=secrets).get()
    secrets.create_secret(Name="s", SecretString="one")
    cached = aws.CachedSecret("s", 60, max_stale_s=math.inf, client=secrets)
    assert cached.get() == "one"
    secrets.delete_secret(SecretId="s", ForceDeleteWithoutRecovery=True)
    with pytest.raises(aws.SecretUnavailable):
        cached.read_now()
    assert cached.get() == "one"


def test_importing_it_loads_no_sdk_until_a_client_is_made() -> None:
    sdks = "('boto3', 'botocore', 'aws_lambda_powertools')"
    code = ("import sys, inferq.aws, functions.storage, functions.gateway.auth; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sdks}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"



def test_an_event_loops_caller_is_answered_from_the_copy_in_hand_while_a_thread_reads(secrets: Any) -> None:
    secrets.create_secret(Name="s", SecretString="one")
    entered, release = threading.Event(), threading.Event()

    class Hanging:  # a read that hangs once asked to, as one to an unreachable endpoint does until its timeout
        hang = False

        def get_secret_value(self, **kwargs: Any) -> Any:
            if self.hang:
                entered.set()
                release.wait(10)
            return secrets.get_secret_value(**kwargs)

    client = Hanging()
    cached = aws.CachedSecret("s", 60, client=client)
    assert cached.get() == "one"
    client.hang = True
    reader = threading.Thread(target=cached.read_now)  # a refused token's forced read, on a worker thread
    reader.start()
    assert entered.wait(10)
    try:
        assert cached.cached()
        assert cached.get(wait=False) == "one"
        assert reader.is_alive()  # answered while the read still hangs: the event loop did not wait for it
    finally:
        release.set()
        reader.join(10)


def test_a_secret_read_with_every_log_at_debug_writes_no_value(secrets: Any, caplog: pytest.LogCaptureFixture) -> None:
    """botocore at DEBUG logs whole responses: reading a secret (or making an S3 client) holds the SDK's loggers at
    INFO, so a process run at INFERQ_LOG_LEVEL=DEBUG (or a Lambda at DEBUG) logs no secret value."""
    value = "the-secret-value-" + "x" * 16
    secrets.create_secret(Name="s", SecretString=value)
    for name in aws.SDK_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)  # as a fresh process has them
    with caplog.at_level(logging.DEBUG):  # the root logger at DEBUG
        secrets.get_secret_value(SecretId="s")
        assert [r for r in caplog.records if value in r.getMessage()], "botocore at DEBUG no longer logs responses"
        caplog.clear()
        assert aws.CachedSecret("s", 1, client=secrets).get() == value
        secrets.get_secret_value(SecretId="s")  # any later SDK call in the same process
        aws.s3_client()
    assert not [r.name for r in caplog.records if value in r.getMessage()]
