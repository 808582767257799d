"""The scaler, which also sends webhooks, signs them with the secret the stack names (INFERQ_WEBHOOK_SECRET_ID),
read from Secrets Manager (moto) at first use and again after a rotation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from functions.scaler import app
from functions.scaler.app import webhook_pass, with_webhook_secret
from inferq.config.settings import Settings
from tests.support.clock import FakeClock


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    app.reset()
    with mock_aws():
        yield boto3.client("secretsmanager")
    app.reset()


def test_the_scaler_reads_the_signing_secret_once_and_again_when_its_cache_lapses(
    secrets: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(app, "webhook_secret_clock", clock)
    secrets.create_secret(Name="hooks", SecretString="first-key")
    settings = Settings(webhook_secret_id="hooks")
    assert settings.webhook_secret is None
    assert with_webhook_secret(settings).webhook_secret == "first-key"
    secrets.put_secret_value(SecretId="hooks", SecretString="rotated-key")
    clock.advance(app.WEBHOOK_SECRET_MAX_AGE_S - 1)
    assert with_webhook_secret(settings).webhook_secret == "first-key"  # cached: one read per five minutes
    clock.advance(1)
    assert with_webhook_secret(settings).webhook_secret == "rotated-key"


def test_a_secret_given_as_a_value_wins_and_none_at_all_is_no_read(secrets: Any) -> None:
    assert with_webhook_secret(Settings(webhook_secret="given", webhook_secret_id="absent")).webhook_secret == "given"
    assert with_webhook_secret(Settings()) == Settings()


def test_an_unreadable_secret_means_no_webhook_pass_rather_than_unsigned_webhooks(secrets: Any) -> None:
    assert webhook_pass(Settings(webhook_secret_id="absent")) is None
    secrets.create_secret(Name="hooks", SecretString="key")
    assert webhook_pass(Settings(webhook_secret_id="hooks")) is not None


def test_an_expired_signing_secret_that_cannot_be_read_again_is_not_used(
    secrets: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(app, "webhook_secret_clock", clock)
    secrets.create_secret(Name="hooks", SecretString="key")
    assert webhook_pass(Settings(webhook_secret_id="hooks")) is not None
    secrets.delete_secret(SecretId="hooks", ForceDeleteWithoutRecovery=True)
    clock.advance(app.WEBHOOK_SECRET_MAX_AGE_S)
    assert webhook_pass(Settings(webhook_secret_id="hooks")) is None  # no pass: nothing signed with a lapsed copy
