"""Each tenant's own webhook signing secret (docs/api.md, "Webhooks"): fetched through the API, made once, signing
that tenant's deliveries only, so no tenant can forge another's; rotated with both secrets valid for the overlap
(both signatures in ``webhook-signature``), checked with the Standard Webhooks reference library. The gateway and
the sender run against one real Valkey; the sender POSTs to a loopback receiver."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from standardwebhooks import Webhook, WebhookVerificationError

from inferq.client import verify_webhook
from inferq.config.settings import Settings
from inferq.queue.jobs import JobRequest
from inferq.queue.protocol import Queue
from inferq.webhooks.sender import deliver_webhooks
from inferq.webhooks.tenant_secrets import tenant_secret
from tests.integration.worker.support import Receiver

from .conftest import AppFactory
from .support import CHAT

SHARED = "whsec_" + base64.b64encode(b"the deployment's own key").decode()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def tenants() -> dict[str, dict[str, str]]:
    """Two tenants of this test alone (the secret is per tenant, across queues): name -> auth headers."""
    run = uuid.uuid4().hex[:10]
    return {f"a-{run}": {"Authorization": f"Bearer key-a-{run}-000"}, f"b-{run}": {"x-api-key": f"key-b-{run}-000"}}


@pytest.fixture
def gateway(make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient],
            tenants: dict[str, dict[str, str]]) -> httpx.AsyncClient:
    keys = {next(iter(h.values())).removeprefix("Bearer "): name for name, h in tenants.items()}
    return open_client(make_app(keys=keys, webhook_allow_private=True))


async def _secret(gateway: httpx.AsyncClient, auth: dict[str, str]) -> dict[str, Any]:
    r = await gateway.get("/v1/webhooks/secret", headers=auth)
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    return dict(r.json())


async def _delivered(queue: Queue, settings: Settings, receiver: Receiver, tenant: str) -> tuple[dict[str, str], bytes]:
    """A job of the tenant cancelled (no worker needed), its webhook sent by a sender pass: what the receiver got.
    (Enqueued directly: the gateway takes only https webhook URLs, and this receiver is plain http on loopback.)"""
    job, _ = await queue.enqueue(tenant, JobRequest(body=CHAT["body"], webhook_url=receiver.url + "/hook"))
    await queue.cancel(tenant, job.id)
    report = await deliver_webhooks(queue, settings.replace(webhook_allow_private=True), consumer="test")
    assert report.delivered >= 1
    [(headers, body)] = [(h, b) for _, _, h, b in receiver.requests if json.loads(b)["id"] == job.id]
    return {k.lower(): v for k, v in headers.items()}, body


def _verifies(secret: str, headers: dict[str, str], body: bytes) -> bool:
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


async def test_each_tenant_has_its_own_secret_and_a_receiver_rejects_a_delivery_signed_for_another(
    gateway: httpx.AsyncClient, tenants: dict[str, dict[str, str]], queue: Queue, settings: Settings,
    receiver: Receiver,
) -> None:
    (a, auth_a), (b, auth_b) = tenants.items()
    # the first delivery makes tenant A's secret (before A ever asked for it); A then fetches that same one
    headers_a, body_a = await _delivered(queue, settings, receiver, a)
    secret_a, secret_b = await _secret(gateway, auth_a), await _secret(gateway, auth_b)
    assert secret_a["object"] == "webhook_secret" and secret_a["previous"] is None
    assert secret_a["secret"].startswith("whsec_") and len(base64.b64decode(secret_a["secret"][6:])) == 32
    assert secret_a["secret"] != secret_b["secret"]
    assert await _secret(gateway, auth_a) == secret_a  # made once: every read and every sender sees the same
    headers_b, body_b = await _delivered(queue, settings, receiver, b)

    assert len(headers_a["webhook-signature"].split()) == 1  # no INFERQ_WEBHOOK_SECRET here: the tenant's alone
    assert _verifies(secret_a["secret"], headers_a, body_a) and _verifies(secret_b["secret"], headers_b, body_b)
    assert not _verifies(secret_a["secret"], headers_b, body_b)  # B's delivery (or one forged by B) fails at A's
    assert not _verifies(secret_b["secret"], headers_a, body_a)
    assert verify_webhook(secret_a["secret"], headers_a, body_a)["status"] == "cancelled"
    # what B could sign with its own secret, claiming to come for A, A's receiver refuses
    forged = json.dumps({**json.loads(body_a), "status": "succeeded"}).encode()
    stamp = int(time.time())
    when = datetime.datetime.fromtimestamp(stamp, datetime.UTC)
    signature = Webhook(secret_b["secret"]).sign(headers_a["webhook-id"], when, forged)
    forged_headers = {**headers_a, "webhook-timestamp": str(stamp), "webhook-signature": signature}
    assert not _verifies(secret_a["secret"], forged_headers, forged)


async def test_a_rotation_keeps_both_secrets_valid_for_the_overlap_with_both_signatures_in_the_header(
    gateway: httpx.AsyncClient, tenants: dict[str, dict[str, str]], queue: Queue, settings: Settings,
    receiver: Receiver,
) -> None:
    (a, auth_a), (_, auth_b) = tenants.items()
    old = (await _secret(gateway, auth_a))["secret"]
    other = (await _secret(gateway, auth_b))["secret"]
    before = time.time()
    r = await gateway.post("/v1/webhooks/secret/rotate", headers=auth_a)
    assert r.status_code == 200, r.text
    rotated = r.json()
    new = rotated["secret"]
    assert new != old and new.startswith("whsec_") and rotated["previous"]["secret"] == old
    assert before + 86_400 - 5 <= rotated["previous"]["expires_at"] <= time.time() + 86_400 + 5
    assert await _secret(gateway, auth_a) == rotated
    assert (await _secret(gateway, auth_b))["secret"] == other  # another tenant's rotation changes nothing here

    headers, body = await _delivered(queue, settings, receiver, a)
    assert len(headers["webhook-signature"].split(" ")) == 2  # space-separated, per the spec
    assert _verifies(new, headers, body) and _verifies(old, headers, body)  # receivers switch over at leisure
    assert not _verifies(other, headers, body)
    assert verify_webhook([new], headers, body)["object"] == "job"

    # a rotation that keeps nothing: the replaced secret stops at once
    r = await gateway.post("/v1/webhooks/secret/rotate", headers=auth_a, json={"keep_previous_s": 0})
    assert r.status_code == 200 and r.json()["previous"] is None
    newest = r.json()["secret"]
    headers, body = await _delivered(queue, settings, receiver, a)
    assert headers["webhook-signature"].count("v1,") == 1
    assert _verifies(newest, headers, body) and not _verifies(new, headers, body) and not _verifies(old, headers, body)


async def test_the_deployment_secret_signs_beside_the_tenants_own_for_single_tenant_setups(
    gateway: httpx.AsyncClient, tenants: dict[str, dict[str, str]], queue: Queue, settings: Settings,
    receiver: Receiver,
) -> None:
    (a, auth_a), _ = tenants.items()
    headers, body = await _delivered(queue, settings.replace(webhook_secret=SHARED), receiver, a)
    assert headers["webhook-signature"].count("v1,") == 2
    assert _verifies(SHARED, headers, body) and _verifies((await _secret(gateway, auth_a))["secret"], headers, body)


async def test_secret_routes_need_a_key_and_refuse_a_bad_rotation(
    gateway: httpx.AsyncClient, tenants: dict[str, dict[str, str]]
) -> None:
    (_, auth_a), _ = tenants.items()
    for method, path in (("GET", "/v1/webhooks/secret"), ("POST", "/v1/webhooks/secret/rotate")):
        r = await gateway.request(method, path)
        assert r.status_code == 401 and r.json()["error"]["type"]
    secret = await _secret(gateway, auth_a)
    for body in ({"keep_previous_s": -1}, {"keep_previous_s": 7 * 86_400 + 1}, {"keep_previous_s": "x"},
                 {"other": 1}, [1]):
        r = await gateway.post("/v1/webhooks/secret/rotate", headers=auth_a, json=body)
        assert r.status_code == 422, (body, r.text)
        assert set(r.json()) == {"error"}
    r = await gateway.post("/v1/webhooks/secret/rotate", headers={**auth_a, "Content-Type": "application/json"},
                           content=b"{not json")
    assert 400 <= r.status_code < 500 and set(r.json()) == {"error"}
    assert await _secret(gateway, auth_a) == secret  # nothing refused changed it


async def test_concurrent_first_reads_and_rotations_agree(
    gateway: httpx.AsyncClient, tenants: dict[str, dict[str, str]]
) -> None:
    """Made atomically (every first reader gets the same secret); rotations in parallel each replace one secret,
    and the last answer is what a read then returns."""
    (_, auth_a), _ = tenants.items()
    firsts = await asyncio.gather(*(_secret(gateway, auth_a) for _ in range(8)))
    assert len({f["secret"] for f in firsts}) == 1
    answers = await asyncio.gather(*(gateway.post("/v1/webhooks/secret/rotate", headers=auth_a) for _ in range(4)))
    secrets = [r.json()["secret"] for r in answers]
    assert len(set(secrets)) == 4 and firsts[0]["secret"] not in secrets
    assert (await _secret(gateway, auth_a))["secret"] in secrets


async def test_the_python_client_reads_and_rotates_the_secret(
    make_app: AppFactory, tenants: dict[str, dict[str, str]]
) -> None:
    from inferq.client import AsyncClient

    name, auth = next(iter(tenants.items()))
    key = auth["Authorization"].removeprefix("Bearer ")
    app = make_app(keys={key: name})
    async with AsyncClient("http://gateway", key, transport=httpx.ASGITransport(app=app)) as client:
        first = await client.webhook_secret()
        assert first["secret"].startswith("whsec_") and await client.webhook_secret() == first
        rotated = await client.rotate_webhook_secret(keep_previous_s=60)
        assert rotated["previous"]["secret"] == first["secret"] and rotated["secret"] != first["secret"]
        assert rotated["previous"]["expires_at"] <= time.time() + 60
    await app.state.gateway.aclose()


async def test_with_a_secrets_key_the_cache_holds_the_secrets_sealed_and_every_role_opens_them(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], tenants: dict[str, dict[str, str]],
    queue: Queue, settings: Settings, receiver: Receiver, tmp_path: Any,
) -> None:
    """L3 (issue 47): with INFERQ_WEBHOOK_SECRETS_KEY (here a local key file, as `inferq up` has it) what Redis
    holds, and so its snapshots and every cache user, is ciphertext bound to its tenant; the gateway answers the
    secret and a sender signs with it, and a process without the key sends nothing rather than something unsigned."""
    from inferq.queue.keys import tenant_webhook_secret
    from inferq.webhooks import envelope

    key = f"file:{tmp_path / 'webhook-secrets.key'}"
    keys = {next(iter(h.values())).removeprefix("Bearer "): name for name, h in tenants.items()}
    sealed_settings = settings.replace(webhook_secrets_key=key)
    gateway = open_client(make_app(keys=keys, webhook_allow_private=True, webhook_secrets_key=key))
    (a, auth_a), (b, _) = tenants.items()
    secret = await _secret(gateway, auth_a)
    stored = await queue.redis.hgetall(tenant_webhook_secret(a))
    assert stored["secret"].startswith("enc1.file.") and secret["secret"] not in json.dumps(stored)
    assert (tmp_path / "webhook-secrets.key").stat().st_mode & 0o777 == 0o600
    # another tenant's record holding A's sealed secret does not open (the tenant is the authenticated data)
    await queue.redis.hset(tenant_webhook_secret(b), mapping={"secret": stored["secret"], "created_at": "1"})
    envelope.reset()  # a fresh process: nothing cached
    sealed_queue = Queue(queue.redis, sealed_settings)
    headers, body = await _delivered(sealed_queue, sealed_settings, receiver, a)
    assert _verifies(secret["secret"], headers, body)
    with pytest.raises(envelope.SecretsUnavailable):
        await tenant_secret(sealed_queue, b)
    # a sender without the key: the delivery fails (and stays pending for its retry), nothing is sent unsigned
    sent = len(receiver.requests)
    job, _ = await queue.enqueue(a, JobRequest(body=CHAT["body"], webhook_url=receiver.url + "/hook"))
    await queue.cancel(a, job.id)
    report = await deliver_webhooks(queue, settings.replace(webhook_allow_private=True), consumer="keyless")
    assert report.failed >= 1 and len(receiver.requests) == sent
