"""Tenant webhook secrets sealed at rest (inferq/webhooks/envelope.py): AES-256-GCM under a data key wrapped by KMS
(moto's, in process) or a local key file, one format for both; bound to the tenant; data keys cached, so KMS is
called once per data key and process, not per secret."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferq.config.settings import Settings, SettingsError
from inferq.webhooks.envelope import (
    CONTEXT,
    FileWrapper,
    KmsWrapper,
    SecretsCipher,
    SecretsUnavailable,
    cipher_for,
    is_sealed,
    reset,
)

SECRET = "whsec_dGhlIHRlbmFudCdzIG93biBzZWNyZXQgaGVyZSE="


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kms(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    import boto3
    from moto import mock_aws

    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_KMS", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    with mock_aws():
        client = boto3.client("kms")
        yield client, client.create_key()["KeyMetadata"]["Arn"]


def test_a_file_key_seals_and_opens_and_is_made_once_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "webhook-secrets.key"
    cipher = SecretsCipher(FileWrapper(path))
    sealed = cipher.seal("tenant-a", SECRET)
    assert is_sealed(sealed) and sealed.startswith("enc1.file.") and SECRET not in sealed
    assert path.stat().st_mode & 0o777 == 0o600 and len(path.read_bytes()) == 32
    # another process (a fresh cipher on the same file) opens it; two seals of one secret differ (random nonces)
    assert SecretsCipher(FileWrapper(path)).open("tenant-a", sealed) == SECRET
    assert cipher.seal("tenant-a", SECRET) != sealed


def test_a_sealed_secret_opens_only_for_its_tenant_and_untouched(tmp_path: Path) -> None:
    cipher = SecretsCipher(FileWrapper(tmp_path / "k"))
    sealed = cipher.seal("tenant-a", SECRET)
    with pytest.raises(SecretsUnavailable):
        cipher.open("tenant-b", sealed)  # copied into another tenant's record
    head, body = sealed.rsplit(".", 1)
    flipped = body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1]
    with pytest.raises(SecretsUnavailable):
        cipher.open("tenant-a", f"{head}.{flipped}")
    with pytest.raises(SecretsUnavailable):
        SecretsCipher(FileWrapper(tmp_path / "another-key")).open("tenant-a", sealed)
    assert cipher.open("tenant-a", SECRET) == SECRET  # stored before a key was configured: read as it is


def test_kms_is_asked_once_per_data_key_and_process(kms: tuple[Any, str]) -> None:
    client, key = kms
    clock = Clock()
    writer = SecretsCipher(KmsWrapper(key, client), clock=clock)
    sealed = [writer.seal(f"tenant-{i}", f"{SECRET}{i}") for i in range(50)]
    assert writer.wraps == 1 and all(s.startswith("enc1.kms.") for s in sealed)
    reader = SecretsCipher(KmsWrapper(key, client), clock=clock)
    assert not reader.ready_to_open(sealed[0])
    assert [reader.open(f"tenant-{i}", s) for i, s in enumerate(sealed)] == [f"{SECRET}{i}" for i in range(50)]
    assert reader.unwraps == 1 and reader.ready_to_open(sealed[0])
    clock.now += 3601  # an hour on: a new data key for new seals, and the old one asked for again
    assert not writer.ready_to_seal() and not reader.ready_to_open(sealed[0])
    writer.seal("tenant-x", SECRET)
    reader.open("tenant-0", sealed[0])
    assert writer.wraps == 2 and reader.unwraps == 2


def test_kms_data_keys_carry_the_context_the_grants_require(kms: tuple[Any, str]) -> None:
    import base64

    client, key = kms
    sealed = SecretsCipher(KmsWrapper(key, client)).seal("tenant-a", SECRET)
    wrapped = base64.urlsafe_b64decode(sealed.split(".")[2] + "==")
    assert client.decrypt(CiphertextBlob=wrapped, EncryptionContext=CONTEXT)["KeyId"] == key
    with pytest.raises(client.exceptions.InvalidCiphertextException):
        client.decrypt(CiphertextBlob=wrapped, EncryptionContext={"purpose": "something-else"})


def test_the_setting_names_a_kms_key_or_a_file_and_one_cipher_serves_a_process(tmp_path: Path) -> None:
    for good in ("arn:aws:kms:us-east-1:123456789012:key/0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0",
                 "alias/inferq-webhook-secrets", f"file:{tmp_path}/k"):
        assert Settings.from_env({"INFERQ_WEBHOOK_SECRETS_KEY": good}).webhook_secrets_key == good
    for bad in ("0b1c2d3e", "s3://bucket/key", "arn:aws:s3:::bucket"):
        with pytest.raises(SettingsError, match="INFERQ_WEBHOOK_SECRETS_KEY"):
            Settings.from_env({"INFERQ_WEBHOOK_SECRETS_KEY": bad})
    reset()
    assert cipher_for(None) is None
    assert cipher_for(f"file:{tmp_path}/k") is cipher_for(f"file:{tmp_path}/k")
    assert isinstance(cipher_for("alias/x").wrapper, KmsWrapper)  # type: ignore[union-attr]
    reset()


def test_processes_starting_together_agree_on_one_key_file(tmp_path: Path) -> None:
    path = tmp_path / "k"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # another process made it a moment ago
    os.write(fd, b"\x01" * 32)
    os.close(fd)
    assert FileWrapper(path).master() == b"\x01" * 32
    (tmp_path / "short").write_bytes(b"x")
    with pytest.raises(SecretsUnavailable):
        FileWrapper(tmp_path / "short").master()
