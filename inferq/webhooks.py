"""Webhook delivery: POST the final job object to its ``webhook_url`` once, signed, retried with backoff.

Where it runs, and why. Every terminal transition (a worker's finish, retry exhaustion, dead-lettering, and the
gateway's cancellations and the expiries ``start.lua`` decides) appends one entry to the capped stream
``inferq:{Q}:events``, which has a consumer group ``webhooks``. Delivery is a consumer of that group, written
here as :class:`WebhookSender`, and it runs in two places:

- in every worker, as a background task (``run``): deliveries go out within about a second of the terminal
  state, and the fleet's many consumers share the work through the group;
- in the scaler, one pass (:func:`deliver_webhooks`) per tick: when the fleet is at zero, a job cancelled or
  expired by the gateway still gets its webhook, at worst one tick later.

Not in the gateway: a Lambda lives for one request and cannot wait out a receiver's retries. Not in the scripts:
Lua cannot make HTTP calls, and the stream makes delivery independent of who wrote the terminal state.

Once: an entry is acknowledged only after a 2xx (or when it is given up), so a crash never loses a webhook.
While a POST is in flight its holder renews the entry's idle time every second; another consumer takes an entry
over only once it has been idle longer than its retry delay and the lease, i.e. its holder failed or died. So each
webhook is sent once on success; only a crash between the receiver's 2xx and the acknowledgement repeats it,
and receivers can de-duplicate on ``X-Inferq-Event-Id``.

Retries: a failed attempt (non-2xx, timeout, connection error) leaves the entry pending; it is tried again after
``max(lease, 1 s * 2**(attempts-1))`` (capped at 5 minutes) until ``INFERQ_WEBHOOK_MAX_AGE_S`` after the terminal
event, then given up (counted as ``webhooks_abandoned`` in the queue's stats).

Signature: ``X-Inferq-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`` with
``INFERQ_WEBHOOK_SECRET``; :func:`verify` is the receiver's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from redis.exceptions import ResponseError

from .keys import WEBHOOK_GROUP
from .queue import Queue
from .settings import Settings

log = logging.getLogger(__name__)

LEASE_MS = 3000
"""An entry idle this long has no live holder (holders renew every :data:`RENEW_S`)."""
RENEW_S = 1.0
BASE_DELAY_MS = 1000
MAX_DELAY_MS = 300_000
HTTP_TIMEOUT_S = 10.0
BATCH = 200
PENDING_SCAN = 1000
CONCURRENCY = 16
SIGNATURE_HEADER = "X-Inferq-Signature"
EVENT_HEADER = "X-Inferq-Event-Id"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: str, header: str, body: bytes, *, tolerance_s: int = 300, now: float | None = None) -> bool:
    """The receiver's check: the signature matches and its timestamp is recent (no replays of old deliveries)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((now if now is not None else time.time()) - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


def retry_delay_ms(attempts: int) -> int:
    """Idle time before attempt ``attempts + 1`` after ``attempts`` failed ones (never below the lease)."""
    return max(LEASE_MS, min(MAX_DELAY_MS, BASE_DELAY_MS * 2 ** max(attempts - 1, 0)))


@dataclass
class WebhookReport:
    delivered: int = 0
    failed: int = 0  # attempts that failed; their entries stay pending for a retry
    abandoned: int = 0
    without_webhook: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, other: WebhookReport) -> None:
        self.delivered += other.delivered
        self.failed += other.failed
        self.abandoned += other.abandoned
        self.without_webhook += other.without_webhook
        self.errors += other.errors


class WebhookSender:
    """A consumer of the ``webhooks`` group of one queue's events stream."""

    def __init__(
        self,
        queue: Queue,
        settings: Settings,
        consumer: str,
        *,
        client: httpx.AsyncClient | None = None,
        http_timeout_s: float = HTTP_TIMEOUT_S,
        on_outcome: Callable[[str, int], None] | None = None,
    ) -> None:
        self.queue = queue
        self.settings = settings
        self.consumer = consumer
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=http_timeout_s, follow_redirects=False, headers={"User-Agent": "inferq-webhooks"}
        )
        self._on_outcome = on_outcome
        self._holding: set[str] = set()
        self._warned_unsigned = False

    @property
    def _events(self) -> str:
        return self.queue.keys.events

    # ------------------------------------------------------------ taking entries

    async def _read_new(self) -> list[tuple[str, dict[str, str]]]:
        redis = self.queue.redis
        try:
            reply = await redis.xreadgroup(WEBHOOK_GROUP, self.consumer, {self._events: ">"}, count=BATCH)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self.queue.ensure_groups()
            return []
        if not reply:
            return []
        return list(reply[0][1] if isinstance(reply, list) else next(iter(reply.values()))[0])

    async def _claim_due(self) -> list[tuple[str, dict[str, str]]]:
        """Pending entries whose retry delay is over (failed attempts, or holders that died)."""
        redis = self.queue.redis
        try:
            pending = await redis.xpending_range(
                self._events, WEBHOOK_GROUP, "-", "+", PENDING_SCAN, idle=LEASE_MS
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            return []
        by_delay: dict[int, list[str]] = {}
        for p in pending:
            delay = retry_delay_ms(int(p["times_delivered"]))
            if int(p["time_since_delivered"]) >= delay:
                by_delay.setdefault(delay, []).append(p["message_id"])
        if not by_delay:
            return []
        pipe = redis.pipeline(transaction=False)
        for delay, ids in by_delay.items():
            # XCLAIM checks the idle time again: of two consumers racing for one entry, one gets it
            pipe.xclaim(self._events, WEBHOOK_GROUP, self.consumer, delay, ids)
        claimed: list[tuple[str, dict[str, str]]] = []
        for entries in await pipe.execute():
            claimed += [(entry_id, fields or {}) for entry_id, fields in entries]
        return claimed

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            if self._holding:
                try:
                    await self.queue.redis.xclaim(
                        self._events, WEBHOOK_GROUP, self.consumer, 0, list(self._holding), justid=True
                    )
                except Exception as exc:  # the next renewal tries again; the lease is three renewals long
                    log.warning("webhooks: lease renewal failed: %s", exc)

    # ------------------------------------------------------------ delivering

    async def _post(self, entry_id: str, job_id: str, url: str, body: bytes) -> bool:
        headers = {"Content-Type": "application/json", EVENT_HEADER: entry_id}
        if self.settings.webhook_secret:
            headers[SIGNATURE_HEADER] = sign(self.settings.webhook_secret, int(time.time()), body)
        elif not self._warned_unsigned:
            self._warned_unsigned = True
            log.warning("webhooks: INFERQ_WEBHOOK_SECRET is not set, deliveries are unsigned")
        try:
            response = await self._client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            log.info("webhook attempt failed: %s", type(exc).__name__, extra={"webhook_job": job_id})
            return False
        if 200 <= response.status_code < 300:
            return True
        log.info("webhook attempt failed: receiver answered %d", response.status_code, extra={"webhook_job": job_id})
        return False

    async def _deliver(self, entry_id: str, fields: dict[str, str], report: WebhookReport) -> bool:
        """True when the entry is settled (delivered or given up) and can be acknowledged."""
        job_id = fields.get("job", "")
        age_s = time.time() - int(entry_id.split("-", 1)[0]) / 1000.0
        job = await self.queue.get(job_id) if job_id else None
        if job is None:
            report.abandoned += 1
            log.warning("webhook given up: the job record is gone", extra={"webhook_job": job_id})
            return True
        if not job.webhook_url or not job.status.terminal:  # redriven since: its next terminal event will tell
            report.without_webhook += 1
            return True
        if age_s > self.settings.webhook_max_age_s:
            report.abandoned += 1
            log.warning("webhook given up after %.0f s", age_s, extra={"webhook_job": job_id})
            return True
        body = json.dumps(job.to_api(), separators=(",", ":"), ensure_ascii=False).encode()
        self._holding.add(entry_id)
        try:
            ok = await self._post(entry_id, job_id, job.webhook_url, body)
        finally:
            self._holding.discard(entry_id)
        if ok:
            report.delivered += 1
        else:
            report.failed += 1
        return ok

    async def _handle(self, entries: list[tuple[str, dict[str, str]]], report: WebhookReport) -> None:
        settled: list[str] = []
        todo: list[tuple[str, dict[str, str]]] = []
        for entry_id, fields in entries:
            if not fields or fields.get("webhook") != "1":  # trimmed from the capped stream, or no webhook
                settled.append(entry_id)
                report.without_webhook += 1
            else:
                todo.append((entry_id, fields))
        if todo:
            limit = asyncio.Semaphore(CONCURRENCY)

            async def one(entry_id: str, fields: dict[str, str]) -> None:
                async with limit:
                    if await self._deliver(entry_id, fields, report):
                        settled.append(entry_id)

            renewer = asyncio.create_task(self._renew())
            try:
                await asyncio.gather(*(one(e, f) for e, f in todo))
            finally:
                renewer.cancel()
        if settled:
            pipe = self.queue.redis.pipeline(transaction=False)
            pipe.xack(self._events, WEBHOOK_GROUP, *settled)
            if report.delivered:
                pipe.hincrby(self.queue.keys.stats, "webhooks_delivered", report.delivered)
            if report.abandoned:
                pipe.hincrby(self.queue.keys.stats, "webhooks_abandoned", report.abandoned)
            await pipe.execute()

    async def deliver_once(self, *, budget_s: float | None = None) -> WebhookReport:
        """Deliver what is due now: retries whose delay is over, then new events, until none is left (or the
        budget is spent). Returns what it did."""
        total = WebhookReport()
        deadline = time.monotonic() + budget_s if budget_s is not None else None
        while deadline is None or time.monotonic() < deadline:
            due = await self._claim_due()
            new = await self._read_new()
            if not due and not new:
                break
            report = WebhookReport()
            await self._handle(due + new, report)
            total.add(report)
            if self._on_outcome:
                for name in ("delivered", "failed", "abandoned"):
                    self._on_outcome(name, getattr(report, name))
            if len(new) < BATCH and len(due) < PENDING_SCAN:
                break
        return total

    async def run(self, stop: asyncio.Event, interval_s: float = 0.5) -> None:
        """Deliver continuously until ``stop`` (a worker's background task)."""
        failures = 0
        while not stop.is_set():
            try:
                await self.deliver_once()
                failures = 0
            except Exception as exc:  # Redis down: try again later, nothing is lost (entries stay pending)
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log.warning("webhooks: delivery pass failed: %s: %s", type(exc).__name__, exc)
            delay = interval_s if not failures else min(5.0, interval_s * 2**failures)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    async def aclose(self) -> None:
        """Close the HTTP client and drop this consumer from the group if it holds nothing."""
        if self._own_client:
            await self._client.aclose()
        try:
            held = await self.queue.redis.xpending_range(
                self._events, WEBHOOK_GROUP, "-", "+", 1, consumername=self.consumer
            )
            if not held:
                await self.queue.redis.xgroup_delconsumer(self._events, WEBHOOK_GROUP, self.consumer)
        except Exception:  # noqa: S110 - best effort cleanup on the way out
            pass


async def deliver_webhooks(
    queue: Queue,
    settings: Settings,
    *,
    consumer: str = "scaler",
    client: httpx.AsyncClient | None = None,
    budget_s: float | None = 20.0,
    http_timeout_s: float = HTTP_TIMEOUT_S,
) -> WebhookReport:
    """One delivery pass, for a process that is not a worker (the scaler, once per tick).

    Keep ``budget_s`` plus ``http_timeout_s`` below the caller's own time limit (a Lambda's timeout)."""
    sender = WebhookSender(queue, settings, consumer, client=client, http_timeout_s=http_timeout_s)
    try:
        return await sender.deliver_once(budget_s=budget_s)
    finally:
        await sender.aclose()

