"""The cache token comes from Secrets Manager (moto), never from a plain-text variable, and a rotation of it is
picked up by new connections without a restart (real Valkey servers, with ``requirepass`` and with an ACL user)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import redis
from moto import mock_aws

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.redis.connection import (
    ReauthenticatingConnection,
    ReauthenticatingSSLConnection,
    SecretCredentialProvider,
    connect,
    credentials_from_secret,
    provider_for,
)
from inferq.redis.fastpack import HiredisPacking
from tests.support.clock import FakeClock
from tests.support.waiting import eventually


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Secrets Manager (moto), and a fresh provider per secret for each test."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    provider_for.cache_clear()
    with mock_aws():
        yield boto3.client("secretsmanager")
    provider_for.cache_clear()


def test_a_secret_reads_as_auth_arguments() -> None:
    assert credentials_from_secret(json.dumps({"username": "default", "token": "t0k"})) == ("default", "t0k")
    assert credentials_from_secret(json.dumps({"password": "pw"})) == ("pw",)
    assert credentials_from_secret("plain-token") == ("plain-token",)


def test_the_token_is_kept_for_its_ttl_then_read_again(secrets: Any) -> None:
    secrets.create_secret(Name="cache-auth", SecretString=json.dumps({"username": "default", "token": "one"}))
    clock = FakeClock()
    provider = SecretCredentialProvider("cache-auth", ttl_s=300, clock=clock)
    assert provider.get_credentials() == ("default", "one")
    secrets.put_secret_value(SecretId="cache-auth", SecretString=json.dumps({"username": "default", "token": "two"}))
    clock.advance(299)
    assert provider.get_credentials() == ("default", "one")  # within the ttl: the copy in hand
    assert provider.reads == 1
    clock.advance(1)
    assert provider.get_credentials() == ("default", "two")
    assert provider.reads == 2


def test_a_refused_token_is_read_again_at_once_and_only_a_changed_one_is_worth_a_retry(secrets: Any) -> None:
    secrets.create_secret(Name="cache-auth", SecretString=json.dumps({"token": "one"}))
    provider = SecretCredentialProvider("cache-auth", ttl_s=3600)
    refused = provider.get_credentials()
    assert provider.refresh(refused) is False  # the secret still holds the refused token: no point retrying
    secrets.put_secret_value(SecretId="cache-auth", SecretString=json.dumps({"token": "two"}))
    assert provider.refresh(refused) is True
    assert provider.get_credentials() == ("two",)
    reads = provider.reads
    assert provider.refresh(refused) is True  # a second refused connection finds the new token already read
    assert provider.reads == reads


def test_connections_refused_together_read_the_rotated_token_once(secrets: Any) -> None:
    """A burst of new connections after a rotation: all refused with the same token, the first re-reads the secret
    and the others, waiting for that read, find the new token in hand instead of reading again."""
    secrets.create_secret(Name="cache-auth", SecretString=json.dumps({"token": "one"}))
    reading, release = threading.Event(), threading.Event()

    class SlowSecretsManager:
        calls = 0

        def get_secret_value(self, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == 2:  # the re-read after the refusal: held until the other refusal waits on it
                reading.set()
                release.wait(10)
            return secrets.get_secret_value(**kwargs)

    client = SlowSecretsManager()
    provider = SecretCredentialProvider("cache-auth", client=client)
    refused = provider.get_credentials()
    secrets.put_secret_value(SecretId="cache-auth", SecretString=json.dumps({"token": "two"}))
    answers: list[bool] = []
    first = threading.Thread(target=lambda: answers.append(provider.refresh(refused)))
    first.start()
    assert reading.wait(10)
    second = threading.Thread(target=lambda: answers.append(provider.refresh(refused)))
    second.start()
    eventually(lambda: _waiting_in(second, "read_now"), what="the second refusal waiting for the first one's read")
    release.set()
    first.join(10)
    second.join(10)
    assert answers == [True, True]
    assert client.calls == 2 and provider.reads == 2


def _waiting_in(thread: threading.Thread, function: str) -> bool:
    frame = sys._current_frames().get(thread.ident or 0)
    return frame is not None and frame.f_code.co_name == function


def test_an_unreadable_secret_keeps_the_token_in_hand_and_without_one_is_a_connection_error(secrets: Any) -> None:
    secrets.create_secret(Name="cache-auth", SecretString=json.dumps({"token": "one"}))
    clock = FakeClock()
    provider = SecretCredentialProvider("cache-auth", ttl_s=300, clock=clock)
    assert provider.get_credentials() == ("one",)
    secrets.delete_secret(SecretId="cache-auth", ForceDeleteWithoutRecovery=True)
    clock.advance(3600)
    assert provider.get_credentials() == ("one",)  # Secrets Manager trouble must not take the cache down with it
    assert provider.reads == 1
    with pytest.raises(redis.exceptions.ConnectionError, match="unreadable"):
        SecretCredentialProvider("cache-auth").get_credentials()


def test_clients_authenticate_through_the_secret_provider(secrets: Any) -> None:
    secrets.create_secret(Name="cache-auth", SecretString=json.dumps({"username": "default", "token": "s3cr3t"}))
    standalone = connect(Settings(redis_url="rediss://cache.example:6379/0", redis_auth_secret="cache-auth"))
    kwargs = standalone.connection_pool.connection_kwargs
    assert kwargs["credential_provider"] is provider_for("cache-auth")
    assert "password" not in kwargs or kwargs["password"] is None  # the token is never a static option
    # the re-reading handshake, packed by hiredis (inferq.redis.fastpack subclasses the pool's class last)
    assert issubclass(standalone.connection_pool.connection_class, ReauthenticatingSSLConnection)
    plain = connect(Settings(redis_url="redis://cache.example:6379/0", redis_auth_secret="cache-auth"))
    assert issubclass(plain.connection_pool.connection_class, ReauthenticatingConnection)
    assert not issubclass(plain.connection_pool.connection_class, ReauthenticatingSSLConnection)
    assert all(issubclass(c.connection_pool.connection_class, HiredisPacking) for c in (standalone, plain))
    assert provider_for("cache-auth").reads == 0  # read at the first connection, not when the client is made


def _kill_other_clients(admin: redis.Redis) -> None:
    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


async def test_a_rotated_requirepass_is_picked_up_by_new_connections_without_a_restart(
    tmp_path: Path, secrets: Any
) -> None:
    secrets.create_secret(Name="tok", SecretString=json.dumps({"username": "default", "token": "old-token-1"}))
    with ValkeyProcess(tmp_path, appendfsync=None, extra_args=("--requirepass", "old-token-1")) as server:
        client = connect(Settings(redis_url=server.url, redis_auth_secret="tok"))
        unauthenticated = connect(Settings(redis_url=server.url))
        admin = redis.Redis(host=server.host, port=server.port, password="old-token-1")
        try:
            assert await client.set("k", "v")
            with pytest.raises(redis.exceptions.AuthenticationError):
                await unauthenticated.ping()

            # Rotation: the secret gets the new token and the server's password changes; the client keeps running.
            secrets.put_secret_value(SecretId="tok", SecretString=json.dumps({"username": "default", "token": "new-2"}))
            admin.config_set("requirepass", "new-2")
            admin.auth("new-2")
            _kill_other_clients(admin)
            await client.connection_pool.disconnect()

            assert await client.get("k") == "v"  # a new connection: WRONGPASS, secret re-read, AUTH again
            assert provider_for("tok").reads == 2

            # A second rotation met by many new connections at once: the secret is read once more, not per connection.
            secrets.put_secret_value(SecretId="tok", SecretString=json.dumps({"username": "default", "token": "new-3"}))
            admin.config_set("requirepass", "new-3")
            admin.auth("new-3")
            await client.connection_pool.disconnect()
            assert await asyncio.gather(*(client.get("k") for _ in range(20))) == ["v"] * 20
            # once more, not per connection (that would be 22): the first refused connection reads, the others
            # find the new token in hand (checked under the secret's lock, so however they interleave)
            assert provider_for("tok").reads == 3
            with pytest.raises(redis.exceptions.AuthenticationError):
                redis.Redis(host=server.host, port=server.port, password="old-token-1").ping()
        finally:
            admin.close()
            await client.aclose()
            await unauthenticated.aclose()


async def test_a_rotated_acl_password_is_picked_up_by_a_cluster_client_without_a_restart(
    tmp_path: Path, secrets: Any
) -> None:
    secrets.create_secret(Name="acl", SecretString=json.dumps({"username": "inferq", "token": "first-pass"}))
    # The default user stays open only so the test can administer the server; the client authenticates as the
    # ACL user whose password rotates, like MemoryDB's and ElastiCache's RBAC users.
    with ValkeyProcess(tmp_path, appendfsync=None, cluster=True) as server:
        admin = redis.Redis(host=server.host, port=server.port)
        admin.acl_setuser("inferq", enabled=True, passwords=["+first-pass"], keys=["*"], channels=["*"],
                          commands=["+@all"])
        client = connect(Settings(redis_url=server.url, redis_auth_secret="acl"))
        try:
            assert await client.set("{q}:k", "v")
            assert (await client.acl_whoami()) == "inferq"

            secrets.put_secret_value(SecretId="acl", SecretString=json.dumps({"username": "inferq", "token": "second"}))
            admin.acl_setuser("inferq", enabled=True, reset_passwords=True, passwords=["+second"], keys=["*"],
                              channels=["*"], commands=["+@all"])
            # the connections open go, the client's side too (as the standalone test's pool does): what is tested
            # is that new ones authenticate with the rotated password. (Killed on the server's side alone, a loaded
            # machine once had the client's topology refresh meet a killed connection and give up: CI, 2026-12-06.)
            _kill_other_clients(admin)
            for node in client.get_nodes():
                await node.disconnect()

            assert await client.get("{q}:k") == "v"
            assert provider_for("acl").reads == 2
            with pytest.raises(redis.exceptions.AuthenticationError):
                redis.Redis(host=server.host, port=server.port, username="inferq", password="first-pass").ping()
        finally:
            admin.close()
            await client.aclose()
