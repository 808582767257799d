"""Webhook delivery: POST the final job object to its ``webhook_url`` once, signed, retried with backoff.

Where it runs, and why. Every terminal transition (a worker's finish, retry exhaustion, dead-lettering, and the
gateway's cancellations and the expiries ``start.lua`` decides) appends one entry to the capped stream
``inferq:{Q}:events``, which has a consumer group ``webhooks``. Delivery is a consumer of that group, written
here as :class:`WebhookSender`, and it runs in two places:

- in every worker, as a background task (``run``): deliveries go out within about a second of the terminal
  state, and the fleet's many consumers share the work through the group;
- in the scaler, one pass (:func:`deliver_webhooks`) per tick, under a consumer name of its own: when the fleet is
  at zero, a job cancelled or expired by the gateway still gets its webhook, at worst one tick later.

Most events carry no webhook, and reading one through the group costs the server a delivery, a pending entry and
an acknowledgement. The terminal transition counts the events that do carry one (``webhook_events`` in the
queue's stats); a pass that finds the count where it was when the previous pass read the group to its end moves the
group past every event unread (``skipevents.lua``: the check and the move are one step, so an event with a webhook
is never skipped).

Not in the gateway: a Lambda lives for one request and cannot wait out a receiver's retries. Not in the scripts:
Lua cannot make HTTP calls, and the stream makes delivery independent of who wrote the terminal state.

Once. A consumer holds every entry it has taken (read or claimed) until it is settled: it renews their idle time
every second (``XCLAIM ... JUSTID`` to itself), and acknowledges each one as soon as it is settled (a 2xx, or
given up). Another consumer takes an entry over only once it has been idle longer than its retry delay and the
lease, i.e. after a failed attempt or when its holder died. So each webhook is POSTed once when nothing fails;
only a crash (or a Redis failure) between the receiver's 2xx and the acknowledgement repeats it, with the same
``webhook-id``, on which receivers de-duplicate.

Bounded. A POST has one deadline for everything (resolving, connecting, sending, the answer): a receiver that drips
bytes cannot hold a slot. At most :data:`inferq.webhooks.post.MAX_RESPONSE_BYTES` of the answer are read.

Retries: a failed attempt (non-2xx, deadline, connection error) leaves the entry pending; it is tried again after
``max(lease, 1 s * 2**(attempts-1))`` (capped at 5 minutes) until ``INFERQ_WEBHOOK_MAX_AGE_S`` after the terminal
event, then given up (counted as ``webhooks_abandoned`` in the queue's stats).

Address guard: the sender resolves the host itself, refuses it when any address is internal, and connects to the
address it checked (:mod:`.guarded_http`, with :mod:`.netguard`'s table). A refused host is a
permanent failure: abandoned at once (and counted as ``webhooks_refused`` too).
``INFERQ_WEBHOOK_ALLOW_PRIVATE=true`` turns the guard off (and allows plain http).

Signed per Standard Webhooks (:mod:`inferq.webhooks.signing`) with the job's tenant's own secret
(:mod:`inferq.webhooks.tenant_secrets`; both while a rotation overlaps) and ``INFERQ_WEBHOOK_SECRET`` when set:
``webhook-id`` is ``<job id>_<events entry id>``, the same for every attempt of one delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from redis.exceptions import ResponseError

from inferq.config.settings import Settings
from inferq.queue import claimcheck
from inferq.queue.jobs import Job
from inferq.queue.keys import WEBHOOK_GROUP
from inferq.queue.protocol import Queue
from inferq.redis.faults import FaultRun
from inferq.retry import backoff
from inferq.webhooks.envelope import SecretsUnavailable
from inferq.webhooks.signing import webhook_id
from inferq.webhooks.tenant_secrets import tenant_secret

from .post import POST_DEADLINE_S, Outcome, WebhookPost

log = logging.getLogger("inferq.webhooks")  # the name every log filter and test knows, from before the move

LEASE_MS = 3000
"""An entry idle this long has no live holder (holders renew every :data:`RENEW_S`)."""
RENEW_S = 1.0
BASE_DELAY_MS = 1000
MAX_DELAY_MS = 300_000
BATCH = 64
"""Entries one round takes (new ones, and as many due retries): a consumer takes no more than it can deliver soon,
so its peers share the rest."""
PENDING_SCAN = 1000
CONCURRENCY = 16
STALE_CONSUMER_MS = 600_000
"""A pass's consumer that held entries on its way out is deleted by a later pass once it holds nothing and has
been idle this long (a live consumer touches the group every second)."""


def retry_delay_ms(attempts: int) -> int:
    """Idle time before attempt ``attempts + 1`` after ``attempts`` failed ones (never below the lease)."""
    return max(LEASE_MS, int(backoff(attempts, BASE_DELAY_MS, MAX_DELAY_MS, jitter=False)))


# ------------------------------------------------------------------------------------------------ delivery


@dataclass
class WebhookReport:
    delivered: int = 0
    failed: int = 0  # attempts that failed; their entries stay pending for a retry
    abandoned: int = 0  # given up: too old, the job is gone, or refused
    refused: int = 0  # of the abandoned: the host is (or resolves to) an internal address
    without_webhook: int = 0

    def add(self, other: WebhookReport) -> None:
        self.delivered += other.delivered
        self.failed += other.failed
        self.abandoned += other.abandoned
        self.refused += other.refused
        self.without_webhook += other.without_webhook


class WebhookSender:
    """A consumer of the ``webhooks`` group of one queue's events stream."""

    def __init__(
        self,
        queue: Queue,
        settings: Settings,
        consumer: str,
        *,
        client: httpx.AsyncClient | None = None,
        http_timeout_s: float = POST_DEADLINE_S,
        concurrency: int = CONCURRENCY,
        on_outcome: Callable[[str, int], None] | None = None,
        present: Callable[[Job], dict[str, Any]] = claimcheck.job_by_url,
    ) -> None:
        self.queue = queue
        self._present = present  # the job object; a claimed result by URL (presigned where S3 is at hand)
        self.settings = settings
        self.consumer = consumer
        self.concurrency = concurrency
        self._post = WebhookPost(settings, client=client, deadline_s=http_timeout_s, connections=concurrency)
        self._on_outcome = on_outcome
        self._holding: set[str] = set()
        """Entries taken and not yet settled or released: renewed every second so no peer takes them over."""
        self._read_to_end_at: str | None = None
        """The ``webhook_events`` count seen when a pass last read the group to its end: while it is unchanged, no
        event since carries a webhook, and a pass skips them unread (``skipevents.lua``)."""

    @property
    def _events(self) -> str:
        return self.queue.keys.events

    # ------------------------------------------------------------ taking entries

    async def _read_new(self) -> list[tuple[str, dict[str, str]]]:
        entries = await self.queue.read_group(self._events, WEBHOOK_GROUP, self.consumer, BATCH)
        self._holding.update(entry_id for entry_id, _ in entries)
        return entries

    async def _claim_due(self) -> list[tuple[str, dict[str, str]]]:
        """Pending entries whose retry delay is over (failed attempts, or holders that died), at most a batch."""
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
        due = 0
        for p in pending:
            delay = retry_delay_ms(int(p["times_delivered"]))
            if int(p["time_since_delivered"]) >= delay and p["message_id"] not in self._holding:
                by_delay.setdefault(delay, []).append(p["message_id"])
                due += 1
                if due >= BATCH:
                    break
        if not by_delay:
            return []
        pipe = redis.pipeline(transaction=False)
        for delay, ids in by_delay.items():
            # XCLAIM checks the idle time again: of two consumers racing for one entry, one gets it
            pipe.xclaim(self._events, WEBHOOK_GROUP, self.consumer, delay, ids)
        claimed: list[tuple[str, dict[str, str]]] = []
        for entries in await pipe.execute():
            claimed += [(entry_id, fields or {}) for entry_id, fields in entries]
        self._holding.update(entry_id for entry_id, _ in claimed)
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

    async def _attempt(self, entry_id: str, fields: dict[str, str], report: WebhookReport) -> bool:
        """One attempt at one entry. True when it is settled (delivered or given up) and can be acknowledged."""
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
        body = json.dumps(self._present(job), separators=(",", ":"), ensure_ascii=False).encode()
        # read per attempt, so a rotation signs the next one
        try:
            secret = await tenant_secret(self.queue, job.tenant, replicated=False)
        except SecretsUnavailable as exc:  # the master key cannot be reached: a failed attempt, tried again later
            report.failed += 1
            log.warning("webhook not sent: %s", exc, extra={"webhook_job": job_id})
            return False
        outcome = await self._post.post(webhook_id(job_id, entry_id), job_id, job.webhook_url, body,
                                        secret.signing())
        if outcome is Outcome.DELIVERED:
            report.delivered += 1
        elif outcome is Outcome.REFUSED:
            report.abandoned += 1
            report.refused += 1
        else:
            report.failed += 1
        return outcome is not Outcome.FAILED

    async def _settle(self, entry_ids: list[str], outcome: WebhookReport | None = None) -> None:
        """Acknowledge settled entries at once, with the counters their outcome moves (one round trip, atomic)."""
        pipe = self.queue.redis.pipeline(transaction=True)
        pipe.xack(self._events, WEBHOOK_GROUP, *entry_ids)
        for name in ("delivered", "abandoned", "refused"):
            if outcome is not None and getattr(outcome, name):
                pipe.hincrby(self.queue.keys.stats, f"webhooks_{name}", getattr(outcome, name))
        await pipe.execute()

    async def _handle(
        self, entries: list[tuple[str, dict[str, str]]], report: WebhookReport, over: Callable[[], bool]
    ) -> None:
        trivial = [e for e, f in entries if not f or f.get("webhook") != "1"]  # trimmed from the stream, or no hook
        todo = [(e, f) for e, f in entries if f and f.get("webhook") == "1"]
        try:
            if trivial:
                report.without_webhook += len(trivial)
                await self._settle(trivial)
        finally:
            self._holding.difference_update(trivial)
        limit = asyncio.Semaphore(self.concurrency)

        async def one(entry_id: str, fields: dict[str, str]) -> None:
            try:
                async with limit:
                    if over():
                        return  # out of time, or stopping: released untried, pending for whoever passes next
                    mine = WebhookReport()
                    settled = await self._attempt(entry_id, fields, mine)
                    report.add(mine)
                    if settled:
                        await self._settle([entry_id], mine)
            finally:
                # settled, or failed and left pending for its retry: either way no longer ours to renew
                self._holding.discard(entry_id)

        results = await asyncio.gather(*(one(e, f) for e, f in todo), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:  # Redis trouble: what was not acknowledged stays pending and is retried
            raise failures[0]

    async def deliver_once(
        self, *, budget_s: float | None = None, stop: asyncio.Event | None = None
    ) -> WebhookReport:
        """Deliver what is due now: retries whose delay is over, then new events, until none is left, the budget
        is spent or ``stop`` is set. After that no new POST starts; those started end within their deadline."""
        total = WebhookReport()
        deadline = time.monotonic() + budget_s if budget_s is not None else None

        def over() -> bool:
            return (deadline is not None and time.monotonic() >= deadline) or (stop is not None and stop.is_set())

        renewer = asyncio.create_task(self._renew())
        seen, self._read_to_end_at = self._read_to_end_at, None
        try:
            skipped, count = await self.queue.skip_webhookless_events(seen)
            while not over():
                due = await self._claim_due()
                new = [] if skipped else await self._read_new()
                if not due and not new:
                    self._read_to_end_at = count
                    break
                report = WebhookReport()
                try:
                    await self._handle(due + new, report, over)
                finally:
                    total.add(report)
                    if self._on_outcome:
                        for name in ("delivered", "failed", "abandoned"):
                            self._on_outcome(name, getattr(report, name))
                if len(new) < BATCH and len(due) < BATCH:
                    self._read_to_end_at = count
                    break
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            self._holding.clear()
        return total

    async def run(self, stop: asyncio.Event, interval_s: float = 0.5) -> None:
        """Deliver continuously until ``stop`` (a worker's background task). Redis faults are waited out (nothing is
        lost: entries stay pending); a bug ends the task, and the worker's supervisor stops the worker."""
        faults = FaultRun("webhooks: delivery pass failed", log, clients=(self.queue.redis,), base_s=interval_s,
                          cap_s=5.0)
        while not stop.is_set():
            try:
                await self.deliver_once(stop=stop)  # a stopping worker starts no new POST
                faults.succeeded()
                delay = interval_s
            except Exception as exc:
                delay = await faults.absorb(exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    async def drop_stale_consumers(self, prefix: str) -> None:
        """Delete consumers named ``<prefix>-...`` that hold nothing and have been idle for long: passes that left
        holding failed entries, which others have since taken over. Deleting a consumer with no pending entries
        loses nothing."""
        with contextlib.suppress(ResponseError):
            for info in await self.queue.redis.xinfo_consumers(self._events, WEBHOOK_GROUP):
                name = str(info["name"])
                if (
                    name.startswith(prefix + "-") and name != self.consumer and int(info["pending"]) == 0
                    and int(info["idle"]) > STALE_CONSUMER_MS
                ):
                    await self.queue.redis.xgroup_delconsumer(self._events, WEBHOOK_GROUP, name)

    async def aclose(self) -> None:
        """Close the HTTP client and drop this consumer from the group if it holds nothing."""
        await self._post.aclose()
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
    http_timeout_s: float = POST_DEADLINE_S,
) -> WebhookReport:
    """One delivery pass, for a process that is not a worker (the scaler, once per tick).

    ``consumer`` is a prefix: each pass consumes as ``<consumer>-<random>``, so two overlapping passes never share
    (and never delete) each other's pending entries. No POST starts after ``budget_s``, and each ends within
    ``http_timeout_s``: keep their sum below the caller's own time limit (a Lambda's timeout)."""
    name = f"{consumer}-{secrets.token_hex(6)}"
    sender = WebhookSender(queue, settings, name, client=client, http_timeout_s=http_timeout_s)
    try:
        report = await sender.deliver_once(budget_s=budget_s)
        await sender.drop_stale_consumers(consumer)
        return report
    finally:
        await sender.aclose()
