"""Webhooks: signed (Standard Webhooks), retried after a failure, delivered once, also for jobs that ended without
any worker. Receivers run on loopback, so these settings allow private addresses (the guard has its own tests)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from standardwebhooks import Webhook

from inferq.client import verify_webhook
from inferq.config.settings import Settings
from inferq.queue.keys import WEBHOOK_GROUP
from inferq.queue.protocol import Queue
from inferq.webhooks.sender import WebhookSender, deliver_webhooks
from inferq.webhooks.signing import verify
from tests.support.waiting import eventually_async

from .support import Receiver, chat, submit, terminal, worker_processes

SECRET = "whsec_" + base64.b64encode(b"a test key of some length").decode()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.replace(webhook_secret=SECRET, webhook_allow_private=True)


async def test_webhook_is_signed_retried_after_a_500_with_the_same_webhook_id_and_delivered_once(
    settings: Settings, queue: Queue, receiver: Receiver, tmp_path: Path
) -> None:
    receiver.statuses = [500]
    with worker_processes(settings, tmp_path) as spawn:
        worker = spawn("hooked")
        job = await submit(queue, chat("x"), webhook_url=receiver.url + "/hook", metadata={"k": "v"})
        done = await terminal(queue, job.id, timeout=15)

        async def two_posts() -> bool:
            return len(receiver.requests) >= 2

        await eventually_async(two_posts, what="the webhook retry", timeout=15)
        await asyncio.sleep(1.5)  # nothing more comes once it was delivered
        worker.terminate()
        assert await worker.wait() == 0
    assert len(receiver.requests) == 2
    ids = {headers["webhook-id"] for _, _, headers, _ in receiver.requests}
    assert len(ids) == 1 and ids.pop().startswith(job.id + "_")  # receivers de-duplicate on it
    for method, path, headers, body in receiver.requests:
        assert (method, path) == ("POST", "/hook")
        assert verify(SECRET, headers, body)
        assert verify_webhook(SECRET, headers, body)["id"] == job.id  # the client checks the worker's real signature
        assert Webhook(SECRET).verify(body, headers)["id"] == job.id  # the reference library agrees
        sent = json.loads(body)
        assert sent["id"] == job.id and sent["status"] == "succeeded" and sent["metadata"] == {"k": "v"}
        assert sent["result"] == done.result
    stats = await queue.stats()
    assert stats["webhooks_delivered"] == 1
    assert await queue.redis.xpending(queue.keys.events, WEBHOOK_GROUP) == {
        "pending": 0, "min": None, "max": None, "consumers": []}


async def test_a_cancellation_made_with_no_worker_running_is_delivered_by_a_scaler_pass(
    settings: Settings, queue: Queue, receiver: Receiver
) -> None:
    job = await submit(queue, chat("x"), webhook_url=receiver.url)
    quiet = await submit(queue, chat("y"))
    await queue.cancel("acme", job.id)
    await queue.cancel("acme", quiet.id)
    report = await deliver_webhooks(queue, settings, consumer="scaler")
    assert (report.delivered, report.without_webhook, report.failed) == (1, 1, 0)
    assert len(receiver.requests) == 1
    sent = json.loads(receiver.requests[0][3])
    assert sent["status"] == "cancelled" and sent["error"]["type"] == "cancelled"
    again = await deliver_webhooks(queue, settings, consumer="scaler")
    assert again.delivered == 0 and len(receiver.requests) == 1


async def test_a_failed_delivery_waits_out_its_backoff_and_is_not_taken_by_another_consumer_meanwhile(
    settings: Settings, queue: Queue, receiver: Receiver
) -> None:
    receiver.statuses = [503]
    job = await submit(queue, chat("x"), webhook_url=receiver.url)
    await queue.cancel("acme", job.id)
    first = WebhookSender(queue, settings, "one")
    second = WebhookSender(queue, settings, "two")
    assert (await first.deliver_once()).failed == 1
    assert (await second.deliver_once()).delivered == 0  # the retry is not due yet
    started = time.monotonic()

    async def retried() -> bool:
        return (await second.deliver_once()).delivered == 1

    await eventually_async(retried, what="the retry", timeout=10, interval=0.2)
    assert time.monotonic() - started >= 2.5  # the lease: 3 s after the failed attempt
    assert len(receiver.requests) == 2
    await first.aclose()
    await second.aclose()


async def test_a_webhook_older_than_its_max_age_is_given_up(settings: Settings, receiver: Receiver) -> None:
    settings = settings.replace(webhook_max_age_s=1)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    job = await submit(queue, chat("x"), webhook_url=receiver.url)
    await queue.cancel("acme", job.id)
    await asyncio.sleep(1.1)
    report = await deliver_webhooks(queue, settings)
    assert report.abandoned == 1 and receiver.requests == []
    assert (await queue.stats())["webhooks_abandoned"] == 1
    await queue.close()


async def test_a_sender_that_read_to_the_end_skips_events_without_a_webhook_but_never_one_with(
    settings: Settings, queue: Queue, receiver: Receiver
) -> None:
    """Once a pass read the group to its end, later events of jobs without a webhook are skipped unread (no
    delivery, nothing pending); an event with a webhook stops the skipping, and is delivered, however many events
    without one came before or after it."""
    sender = WebhookSender(queue, settings, "w1")
    try:
        await queue.cancel("acme", (await submit(queue, chat("a"))).id)
        first = await sender.deliver_once()
        assert first.without_webhook == 1  # read: no count was known yet
        delivered_before = (await queue.redis.xinfo_groups(queue.keys.events))[0]["entries-read"]
        for text in "bcd":
            await queue.cancel("acme", (await submit(queue, chat(text))).id)
        quiet = await sender.deliver_once()
        assert quiet.without_webhook == 0 and quiet.delivered == 0  # skipped unread
        group = (await queue.redis.xinfo_groups(queue.keys.events))[0]
        newest = (await queue.redis.xrevrange(queue.keys.events, count=1))[0][0]
        assert group["last-delivered-id"] == newest and group["pending"] == 0
        assert group["entries-read"] in (delivered_before, None)  # no entry was delivered to anyone
        hooked = await submit(queue, chat("e"), webhook_url=receiver.url + "/hook")
        await queue.cancel("acme", (await submit(queue, chat("f"))).id)
        await queue.cancel("acme", hooked.id)
        await queue.cancel("acme", (await submit(queue, chat("g"))).id)
        report = await sender.deliver_once()
        assert (report.delivered, report.without_webhook) == (1, 2)
        assert [json.loads(body)["id"] for *_, body in receiver.requests] == [hooked.id]
        assert (await sender.deliver_once()).without_webhook == 0  # read to the end again: skipping again
    finally:
        await sender.aclose()


async def test_a_pass_that_stopped_before_the_end_lets_the_next_one_skip_nothing(
    settings: Settings, queue: Queue, receiver: Receiver
) -> None:
    sender = WebhookSender(queue, settings, "w1")
    try:
        await queue.cancel("acme", (await submit(queue, chat("a"))).id)
        assert (await sender.deliver_once()).without_webhook == 1
        await queue.cancel("acme", (await submit(queue, chat("b"))).id)
        # out of time before reading: it still skipped b (the last pass read to the end, no webhook since)
        assert (await sender.deliver_once(budget_s=0)).without_webhook == 0
        await queue.cancel("acme", (await submit(queue, chat("c"))).id)
        assert (await sender.deliver_once()).without_webhook == 1  # c is read, not skipped: no count to trust
    finally:
        await sender.aclose()
