"""POST /v1/jobs refuses webhook URLs that point inside the deployment (422, ``invalid_request``), in any
spelling, unless ``INFERQ_WEBHOOK_ALLOW_PRIVATE`` is true; public hosts pass."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI

from inferq.queue.protocol import Queue

from .conftest import AppFactory
from .support import CHAT, A
from .test_submit import assert_envelope

INTERNAL = [
    "https://localhost/hook", "https://LocalHost:8443/hook", "https://api.localhost/", "https://localhost./",
    "https://127.0.0.1/", "https://127.1/", "https://2130706433/", "https://0x7f.1/", "https://0177.0.0.1/",
    "https://10.0.3.7/", "https://172.16.5.4/", "https://192.168.0.10/", "https://100.64.1.1/",
    "https://169.254.169.254/latest/meta-data/", "https://0.0.0.0/", "https://224.0.0.1/", "https://240.0.0.1/",
    "https://[::1]/", "https://[::]/", "https://[fe80::1]/", "https://[fd00:ec2::254]/", "https://[ff02::1]/",
    "https://[::ffff:127.0.0.1]/", "https://[::ffff:a9fe:a9fe]/", "https://%31%32%37.0.0.1/",
    "https://999.1.1.1/",
]
PUBLIC = ["https://hooks.example.com/done?token=x", "https://8.8.8.8/hook", "https://[2606:4700::1111]/",
          "https://localhost.example.com/", "https://10.example.com/"]


@pytest.mark.parametrize("url", INTERNAL)
async def test_an_internal_webhook_host_is_422_with_a_clear_message(
    client: httpx.AsyncClient, queue: Queue, url: str
) -> None:
    response = await client.post("/v1/jobs", json={**CHAT, "webhook_url": url}, headers=A)
    error = assert_envelope(response, 422, "invalid_request")["error"]
    assert error["message"].startswith("body.webhook_url: ") and "public addresses only" in error["message"]
    assert await queue.redis.xlen(queue.keys.stream) == 0


@pytest.mark.parametrize("url", PUBLIC)
async def test_a_public_webhook_host_is_accepted(client: httpx.AsyncClient, url: str) -> None:
    response = await client.post("/v1/jobs", json={**CHAT, "webhook_url": url}, headers=A)
    assert response.status_code == 202, response.text


async def test_allow_private_accepts_internal_hosts_but_still_only_https(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    client = open_client(make_app(webhook_allow_private=True))
    for url in ("https://localhost:9000/hook", "https://10.0.3.7/", "https://[::1]:8443/"):
        response = await client.post("/v1/jobs", json={**CHAT, "webhook_url": url}, headers=A)
        assert response.status_code == 202, response.text
    response = await client.post("/v1/jobs", json={**CHAT, "webhook_url": "http://localhost:9000/"}, headers=A)
    assert_envelope(response, 422, "invalid_request")


@pytest.mark.parametrize("url", ["https://hooks.example.com:22/x", "https://8.8.8.8:6379/", "https://h.example:8443/",
                                 "https://hooks.example.com:0/"])
async def test_a_webhook_to_a_port_not_allowed_is_422(client: httpx.AsyncClient, queue: Queue, url: str) -> None:
    """Issue 47, L4: a tenant's URL must not make the sender talk to any service on any port (443 by default)."""
    response = await client.post("/v1/jobs", json={**CHAT, "webhook_url": url}, headers=A)
    message = assert_envelope(response, 422, "invalid_request")["error"]["message"]
    assert message.startswith("body.webhook_url: "), message
    assert await queue.redis.xlen(queue.keys.stream) == 0


async def test_the_allowed_ports_and_the_deployments_own_network_come_from_the_settings(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    client = open_client(make_app(webhook_ports=(443, 8443), webhook_blocked_networks=("11.42.0.0/16",)))
    assert (await client.post("/v1/jobs", json={**CHAT, "webhook_url": "https://h.example:8443/"},
                              headers=A)).status_code == 202
    # a VPC using a public block privately: refused as the private ranges are
    refused = await client.post("/v1/jobs", json={**CHAT, "webhook_url": "https://11.42.0.9/hook"}, headers=A)
    assert "INFERQ_WEBHOOK_BLOCKED_NETWORKS" in assert_envelope(refused, 422)["error"]["message"]
    assert (await client.post("/v1/jobs", json={**CHAT, "webhook_url": "https://11.43.0.9/hook"},
                              headers=A)).status_code == 202


async def test_with_a_host_list_a_webhook_to_another_host_is_422_naming_it(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    """INFERQ_WEBHOOK_HOSTS (the stack's WebhookHosts, the names its DNS Firewall lets the VPC resolve): a URL no
    webhook could reach is refused at submit, not accepted and then never delivered; it holds in development too."""
    for private in (False, True):
        client = open_client(make_app(webhook_hosts=("hooks.example.com", "*.tenant.example"),
                                      webhook_allow_private=private))
        for url in ("https://hooks.example.com/x", "https://a.tenant.example/y?token=1"):
            assert (await client.post("/v1/jobs", json={**CHAT, "webhook_url": url}, headers=A)).status_code == 202
        for url in ("https://other.example/x", "https://tenant.example/", "https://hooks.example.com.evil/"):
            refused = await client.post("/v1/jobs", json={**CHAT, "webhook_url": url}, headers=A)
            message = assert_envelope(refused, 422, "invalid_request")["error"]["message"]
            assert message.startswith("body.webhook_url: ") and "INFERQ_WEBHOOK_HOSTS" in message, message
    assert int(await queue.redis.hget(queue.keys.stats, "enqueued") or 0) == 4  # the refused ones made no job
