"""API keys from Secrets Manager (moto): SHA-256 digests only, read with Powertools' parameters utility and cached
(a rotation is picked up once the cache's time has passed, on a clock the tests move), a failed refresh serves the
last good copy up to the stale bound, and an unreadable secret is a 503 (the store is down), never a 401 (the key
is wrong) or a 500."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import httpx
import pytest
from moto import mock_aws

from functions.gateway.api import create_app
from functions.gateway.auth import REFRESH_BACKOFF_S, SecretKeys
from inferq.config.settings import Settings, SettingsError
from tests.support.clock import FakeClock

from .support import CHAT
from .test_submit import assert_envelope

SECRET = "inferq/api-keys"
KEY = "prod-key-of-tenant-s"
OTHER = "prod-key-of-tenant-t"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "eu-west-1"}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield boto3.client("secretsmanager")


class Counting:
    """A boto3 client that counts GetSecretValue calls (``calls``) and those that answered (``reads``)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls = 0
        self.reads = 0

    def get_secret_value(self, **kwargs: Any) -> Any:
        self.calls += 1
        reply = self.client.get_secret_value(**kwargs)
        self.reads += 1
        return reply


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_keys_from_the_secret_map_to_tenants(
    secrets: Any, settings: Settings, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    secrets.create_secret(Name=SECRET, SecretString=json.dumps({sha(KEY): "tenant-s", sha(OTHER): "tenant-t"}))
    client = open_client(create_app(settings.replace(api_keys_secret=SECRET)))
    mine = await client.post("/v1/jobs", json=CHAT, headers=bearer(KEY))
    assert mine.status_code == 202
    job = mine.json()["id"]
    assert (await client.get(f"/v1/jobs/{job}", headers={"x-api-key": KEY})).status_code == 200
    assert_envelope(await client.get(f"/v1/jobs/{job}", headers=bearer(OTHER)), 404)
    assert_envelope(await client.post("/v1/jobs", json=CHAT, headers=bearer(sha(KEY))), 401)  # the digest is no key
    assert_envelope(await client.post("/v1/jobs", json=CHAT, headers=bearer("unknown-key")), 401)


async def test_the_secret_is_read_once_per_cache_period(
    secrets: Any, settings: Settings, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    secrets.create_secret(Name=SECRET, SecretString=json.dumps({sha(KEY): "tenant-s"}))
    counting = Counting(secrets)
    store = SecretKeys(SECRET, cache_s=300, client=counting)
    client = open_client(create_app(settings, keys=store))
    for _ in range(5):
        assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    assert counting.reads == 1
    assert store.secret.reads == 1
    # A revoked key stays valid while the copy is cached.
    secrets.put_secret_value(SecretId=SECRET, SecretString=json.dumps({sha(OTHER): "tenant-t"}))
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    assert counting.reads == 1


async def test_a_rotation_is_picked_up_once_the_cache_expires(
    secrets: Any, settings: Settings, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    secrets.create_secret(Name=SECRET, SecretString=json.dumps({sha(KEY): "tenant-s"}))
    counting = Counting(secrets)
    clock = FakeClock()
    store = SecretKeys(SECRET, cache_s=300, client=counting, clock=clock)
    client = open_client(create_app(settings, keys=store))
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    secrets.put_secret_value(SecretId=SECRET, SecretString=json.dumps({sha(OTHER): "tenant-t"}))
    clock.advance(299.9)
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200  # cached: the old keys
    assert counting.reads == 1
    clock.advance(0.1)  # the cache's 300 s are up
    assert_envelope(await client.get("/v1/dlq", headers=bearer(KEY)), 401)  # revoked
    assert (await client.get("/v1/dlq", headers=bearer(OTHER))).status_code == 200  # added
    assert counting.reads == 2


async def test_a_failed_refresh_keeps_the_last_good_keys(
    secrets: Any, settings: Settings, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    secrets.create_secret(Name=SECRET, SecretString=json.dumps({sha(KEY): "tenant-s"}))
    counting = Counting(secrets)
    clock = FakeClock()
    store = SecretKeys(SECRET, cache_s=300, client=counting, clock=clock)
    client = open_client(create_app(settings, keys=store))
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    secrets.delete_secret(SecretId=SECRET, ForceDeleteWithoutRecovery=True)
    clock.advance(300)
    for _ in range(3):
        assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    assert counting.calls == 2  # the failed read is tried once, not on every request ...
    clock.advance(REFRESH_BACKOFF_S)
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    assert counting.calls == 3  # ... but again after a pause
    assert store.secret.reads == 1


async def test_a_failed_refresh_serves_the_last_keys_only_up_to_the_stale_bound_then_fails_closed(
    secrets: Any, settings: Settings, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    secrets.create_secret(Name=SECRET, SecretString=json.dumps({sha(KEY): "tenant-s"}))
    clock = FakeClock()
    store = SecretKeys(SECRET, cache_s=300, client=secrets, max_stale_s=900, clock=clock)
    client = open_client(create_app(settings, keys=store))
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    secrets.delete_secret(SecretId=SECRET, ForceDeleteWithoutRecovery=True)
    clock.advance(300 + 899)  # expired, within the bound (300 s + 900 s)
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    clock.advance(1.1)  # past cache_s + max_stale_s
    response = await client.get("/v1/dlq", headers=bearer(KEY))
    assert_envelope(response, 503, "unavailable")
    assert "retry-after" in response.headers
    # Secrets Manager answers again: so does the gateway, with what the secret holds now
    secrets.create_secret(Name=SECRET, SecretString=json.dumps({sha(OTHER): "tenant-t"}))
    clock.advance(REFRESH_BACKOFF_S)  # the pause before the next read after a failed one
    assert (await client.get("/v1/dlq", headers=bearer(OTHER))).status_code == 200
    assert_envelope(await client.get("/v1/dlq", headers=bearer(KEY)), 401)


async def test_a_malformed_rotation_serves_the_last_good_keys_within_the_bound(
    secrets: Any, settings: Settings, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    secrets.create_secret(Name=SECRET, SecretString=json.dumps({sha(KEY): "tenant-s"}))
    clock = FakeClock()
    store = SecretKeys(SECRET, cache_s=300, client=secrets, max_stale_s=900, clock=clock)
    client = open_client(create_app(settings, keys=store))
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    secrets.put_secret_value(SecretId=SECRET, SecretString="{}")  # an operator's mistake: never "no keys"
    clock.advance(300)
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    assert store.secret.reads == 2
    clock.advance(900.1)  # the last good keys are older than cache_s + max_stale_s
    assert_envelope(await client.get("/v1/dlq", headers=bearer(KEY)), 503, "unavailable")


@pytest.mark.parametrize(
    "secret_string",
    [None, "not json", json.dumps({"abc": "tenant"}), json.dumps({sha(KEY): "bad tenant!"}), json.dumps({})],
    ids=["missing", "not json", "not a digest", "bad tenant", "empty"],
)
async def test_an_unreadable_or_malformed_secret_is_503_not_401(
    secrets: Any, settings: Settings, open_client: Callable[..., httpx.AsyncClient], secret_string: str | None
) -> None:
    if secret_string is not None:
        secrets.create_secret(Name=SECRET, SecretString=secret_string)
    client = open_client(create_app(settings.replace(api_keys_secret=SECRET)))
    response = await client.post("/v1/jobs", json=CHAT, headers=bearer(KEY))
    assert_envelope(response, 503, "unavailable")
    assert "retry-after" in response.headers


async def test_dev_keys_and_the_secret_work_side_by_side(
    secrets: Any, settings: Settings, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    secrets.create_secret(Name=SECRET, SecretString=json.dumps({sha(KEY): "tenant-s"}))
    both = settings.replace(api_keys_secret=SECRET, api_keys={"dev-key-0000001": "tenant-dev"})
    client = open_client(create_app(both))
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    assert (await client.get("/v1/dlq", headers=bearer("dev-key-0000001"))).status_code == 200


def test_no_keys_at_all_refuses_to_build_the_app(settings: Settings) -> None:
    with pytest.raises(SettingsError) as excinfo:
        create_app(settings.replace(api_keys=None, api_keys_secret=None))
    assert excinfo.value.variable == "INFERQ_API_KEYS"


async def test_a_restored_snapshot_reads_the_secret_again_with_a_new_client(
    secrets: Any, settings: Settings, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    from functions.gateway import snapstart

    secrets.create_secret(Name=SECRET, SecretString=json.dumps({sha(KEY): "tenant-s"}))
    counting = Counting(secrets)
    store = SecretKeys(SECRET, cache_s=300, client=counting)
    client = open_client(create_app(settings, keys=store))
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    snapstart._forget_client(store)  # what drop_connections does to the key store after a restore
    assert (await client.get("/v1/dlq", headers=bearer(KEY))).status_code == 200
    assert store.secret.reads == 2  # read again after the restore ...
    assert counting.calls == 1  # ... by a new client: the one from before the snapshot is gone
