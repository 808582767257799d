"""Webhooks from outside, through ``inferq up`` and its real workers, with only the documented API and settings: each
tenant reads its own signing secret (``GET /v1/webhooks/secret``); a job's webhook reaches an HTTPS receiver whose
certificate a company CA signed, trusted through ``SSL_CERT_FILE``; the delivery verifies with the Standard
Webhooks library under its tenant's secret and not under the other tenant's; after a rotation both verify."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from tests.support.tls import HttpsReceiver, private_ca
from tests.support.waiting import eventually

from .conftest import FAST, Emulator, chat

KEYS = {"acme-e2e": "key-acme-e2e-000001", "rival-e2e": "key-rival-e2e-00002"}


@pytest.fixture
def receiver_and_ca(tmp_path: Path) -> Iterator[tuple[HttpsReceiver, Path]]:
    ca_path, server_tls = private_ca(tmp_path)
    receiver = HttpsReceiver(server_tls)
    yield receiver, ca_path
    receiver.close()


def _verifies(secret: str, headers: dict[str, str], body: bytes) -> bool:
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


def test_each_tenants_webhooks_reach_a_private_ca_receiver_signed_with_its_own_secret(
    tmp_path_factory: pytest.TempPathFactory, receiver_and_ca: tuple[HttpsReceiver, Path]
) -> None:
    receiver, ca_path = receiver_and_ca
    data_dir = tmp_path_factory.mktemp("inferq-hooks") / "data"
    data_dir.mkdir()
    (data_dir / "dev-api-key").write_text("unused: the keys are INFERQ_API_KEYS'\n")  # Emulator.start reads one
    emulator = Emulator(data_dir, {**FAST, "INFERQ_API_KEYS": ",".join(f"{t}:{k}" for t, k in KEYS.items()),
                                   "SSL_CERT_FILE": str(ca_path)})
    try:
        emulator.start()
        clients = {t: httpx.Client(base_url=emulator.url, headers={"Authorization": f"Bearer {k}"}, timeout=30.0)
                   for t, k in KEYS.items()}
        secrets = {t: c.get("/v1/webhooks/secret").json()["secret"] for t, c in clients.items()}
        assert secrets["acme-e2e"] != secrets["rival-e2e"]

        def deliver(tenant: str) -> tuple[dict[str, str], bytes]:
            r = clients[tenant].post("/v1/jobs", json={**chat(tenant),
                                                       "webhook_url": f"https://localhost:{receiver.port}/hook"})
            assert r.status_code == 202, r.text
            job_id = r.json()["id"]

            def arrived() -> Any:
                return next(((h, b) for h, b in receiver.requests if json.loads(b)["id"] == job_id), None)

            headers, body = eventually(arrived, what=f"the webhook of {tenant}'s job", timeout=60)
            assert json.loads(body)["status"] == "succeeded"
            return headers, body

        for tenant, other in (("acme-e2e", "rival-e2e"), ("rival-e2e", "acme-e2e")):
            headers, body = deliver(tenant)
            assert _verifies(secrets[tenant], headers, body) and not _verifies(secrets[other], headers, body)

        rotated = clients["acme-e2e"].post("/v1/webhooks/secret/rotate").json()
        assert rotated["previous"]["secret"] == secrets["acme-e2e"]
        headers, body = deliver("acme-e2e")
        assert len(headers["webhook-signature"].split(" ")) == 2
        assert _verifies(rotated["secret"], headers, body) and _verifies(secrets["acme-e2e"], headers, body)
        assert not _verifies(secrets["rival-e2e"], headers, body)
        for client in clients.values():
            client.close()
    finally:
        emulator.cleanup()


