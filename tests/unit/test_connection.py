"""The cache token comes from Secrets Manager (moto), never from a plain-text variable."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
import redis
from moto import mock_aws

from emulator.valkey import ValkeyProcess
from inferq.connection import auth_from_secret, connect
from inferq.settings import Settings


@mock_aws
def test_the_auth_token_is_read_from_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    sm = boto3.client("secretsmanager")
    sm.create_secret(Name="cache-auth", SecretString=json.dumps({"username": "default", "token": "s3cr3t-token"}))
    sm.create_secret(Name="bare", SecretString="plain-token")
    auth_from_secret.cache_clear()
    assert auth_from_secret("cache-auth") == ("default", "s3cr3t-token")
    assert auth_from_secret("bare") == (None, "plain-token")
    client = connect(Settings(redis_url="rediss://cache.example:6379/0", redis_auth_secret="cache-auth"))
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["password"] == "s3cr3t-token" and kwargs["username"] == "default"
    auth_from_secret.cache_clear()



async def test_a_server_requiring_auth_is_reached_with_the_secrets_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        boto3.client("secretsmanager").create_secret(Name="tok", SecretString=json.dumps({"token": "t0ken-for-cache"}))
        auth_from_secret.cache_clear()
        with ValkeyProcess(tmp_path, appendfsync=None, extra_args=("--requirepass", "t0ken-for-cache")) as server:
            client = connect(Settings(redis_url=server.url, redis_auth_secret="tok"))
            assert await client.ping()
            await client.aclose()
            unauthenticated = connect(Settings(redis_url=server.url))
            with pytest.raises(redis.exceptions.AuthenticationError):
                await unauthenticated.ping()
            await unauthenticated.aclose()
    auth_from_secret.cache_clear()
