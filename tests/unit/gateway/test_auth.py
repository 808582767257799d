"""Key stores without AWS: digests only, every digest compared, malformed secrets refused."""

from __future__ import annotations

import hashlib
import json

import pytest

from functions.gateway.auth import KeyRing, StaticKeys, key_store, parse_secret
from inferq.config.settings import Settings, SettingsError


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


async def test_static_keys_keep_only_digests() -> None:
    store = StaticKeys({"key-aaaaaaaa": "a", "key-bbbbbbbb": "b"})
    assert "key-aaaaaaaa" not in repr(store.__dict__)
    assert await store.tenant_for("key-aaaaaaaa") == "a"
    assert await store.tenant_for("key-bbbbbbbb") == "b"
    assert await store.tenant_for("key-aaaaaaa") is None
    assert await store.tenant_for("") is None


def test_a_secret_maps_digests_to_tenants_case_insensitively() -> None:
    digests = parse_secret(json.dumps({sha("k1").upper(): "t1", sha("k2"): "t2"}))
    assert digests == [(bytes.fromhex(sha("k1")), "t1"), (bytes.fromhex(sha("k2")), "t2")]


@pytest.mark.parametrize("raw", ["", "[]", "{}", json.dumps({"k1": "t1"}), json.dumps({sha("k"): 3}),
                                 json.dumps({sha("k"): "has space"})])
def test_malformed_secrets_are_errors_not_empty_key_sets(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_secret(raw)


async def test_the_ring_asks_each_store() -> None:
    ring = KeyRing([StaticKeys({"key-aaaaaaaa": "a"}), StaticKeys({"key-bbbbbbbb": "b"})])
    assert await ring.tenant_for("key-bbbbbbbb") == "b"
    assert await ring.tenant_for("nope") is None


def test_settings_without_any_key_refuse_to_build_a_store() -> None:
    with pytest.raises(SettingsError) as excinfo:
        key_store(Settings())
    assert excinfo.value.variable == "INFERQ_API_KEYS"


def test_settings_with_both_sources_build_a_ring() -> None:
    store = key_store(Settings(api_keys={"key-aaaaaaaa": "a"}, api_keys_secret="inferq/keys"))
    assert isinstance(store, KeyRing) and len(store.stores) == 2
