"""The asyncio client of the queue protocol: one typed method per Lua script, plus the plain reads around them.

Every state change is one script (see ``scripts/``). Methods the HTTP API needs raise the exceptions below;
the worker's transitions return an :class:`Outcome`, because a duplicate or stale completion is a normal event
to count, not an error.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from redis.exceptions import ResponseError

from .jobs import Job, JobRequest, JobStatus, canonical_json, idempotency_digest, new_job_id
from .keys import GROUP, WEBHOOK_GROUP, Keys
from .scripting import Code, Scripts
from .scripting import ReplicationLag as ReplicationLag  # re-exported: callers catch it with the queue errors
from .settings import Settings


class QueueError(Exception):
    """A request the queue refused; the gateway maps each subclass to its HTTP answer."""


class JobNotFound(QueueError):
    pass


class IdempotencyConflict(QueueError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"idempotency key already used with a different request (job {job_id})")
        self.job_id = job_id


class QueueFull(QueueError):
    def __init__(self, unfinished: int) -> None:
        super().__init__(f"{unfinished} unfinished jobs: the queue is full")
        self.unfinished = unfinished


class TenantQuotaFull(QueueFull):
    """The tenant has ``INFERQ_TENANT_MAX_DEPTH`` unfinished jobs: one tenant cannot fill the queue for all."""

    def __init__(self, unfinished: int) -> None:
        QueueError.__init__(self, f"{unfinished} unfinished jobs of this tenant: its quota is full")
        self.unfinished = unfinished


class JobTerminal(QueueError):
    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.id} is already {job.status.value}")
        self.job = job


class NotDeadLettered(QueueError):
    pass


class Outcome(str, Enum):
    """What a worker's transition did."""

    WRITTEN = "written"  # finish: terminal state recorded
    RETRY_SCHEDULED = "retry_scheduled"
    DEAD_LETTERED = "dead_lettered"
    RELEASED = "released"
    DUPLICATE = "duplicate"  # the job was already terminal: discarded and counted
    STALE = "stale"  # the entry was no longer the job's live entry
    NOT_FOUND = "not_found"
    ENDED = "ended"  # the job ended some other way here (e.g. cancellation requested)


class Lease(int, Enum):
    """Per-entry answer of a lease renewal."""

    HELD = 0
    CANCEL_REQUESTED = 1
    LOST = 2
    TERMINAL = 3


@dataclass(frozen=True)
class Delivery:
    """A job handed to this worker: run it, then finish, retry or release it by its entry and lease token.
    The lease token is this delivery's own (start.lua records it on the job): once the entry is reclaimed or
    started again, the token no longer matches and this delivery's writes change nothing."""

    entry_id: str
    job: Job
    reclaimed: bool = False
    lease: str = ""

    @property
    def attempt(self) -> int:
        return self.job.attempts


@dataclass(frozen=True)
class Skipped:
    """An entry that start.lua settled without running the model (terminal, stale, expired, dead-lettered)."""

    entry_id: str
    job_id: str
    code: Code
    status: str | None = None


@dataclass(frozen=True)
class Observation:
    lag: int
    pending: int
    delayed: int
    delayed_due: int
    unfinished: int
    workers: int
    busy_workers: int
    in_flight: int
    oldest_entry_ms: int
    group_missing: bool
    dlq: int
    desired: int | None
    reason: str
    decided_at: float | None

    @property
    def backlog(self) -> int:
        return self.lag + self.pending + self.delayed

    def oldest_age_s(self, now_ms: int) -> float:
        return max(0.0, (now_ms - self.oldest_entry_ms) / 1000.0) if self.oldest_entry_ms else 0.0


def now_ms() -> int:
    return int(time.time() * 1000)


def new_token() -> str:
    """A random token, generated once per script call (or per delivery, for a lease): a resent copy of the call
    carries the same token, which is how the script knows it already ran (G9)."""
    return secrets.token_hex(8)


def settle_token(delivery: Delivery, *what: str) -> str:
    """The call token of a finish, retry or release: derived from the delivery's lease and what is written, so the
    worker's own retry of the same write after an error it saw (a timeout, ReplicationLag) is recognised as a
    resend too and answers as the first did; another write by the same delivery is a different call."""
    if not delivery.lease:
        return new_token()
    return hashlib.sha256("\0".join((delivery.lease, *what)).encode()).hexdigest()[:16]


def _optional_int(value: Any) -> int | None:
    return int(value) if value not in (None, "") else None


class Queue:
    """One queue (``INFERQ_QUEUE``) on one Redis client."""

    def __init__(self, client: Any, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self.keys = Keys(settings.queue)
        self.scripts = Scripts(client)
        self._reclaim_cursor = "0-0"

    @classmethod
    def connect(cls, settings: Settings, **options: Any) -> Queue:
        from .connection import connect

        return cls(connect(settings, **options), settings)

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def ensure_groups(self) -> None:
        """Create the worker group on the stream and the webhook group on the events stream, at id 0 with
        MKSTREAM: a group made at ``$`` would silently skip entries added before it."""
        counters = ("unfinished", "enqueued", "succeeded", "failed", "cancelled", "expired", "retried",
                    "reclaimed", "released", "dead_lettered", "duplicate_results", "skipped_terminal", "redriven",
                    "stale_writes", "latency_ms_total")
        pipe = self.redis.pipeline(transaction=False)
        for counter in counters:  # every counter readable from the start, not only once first incremented
            pipe.hsetnx(self.keys.stats, counter, 0)
        await pipe.execute()
        for stream, group in ((self.keys.stream, GROUP), (self.keys.events, WEBHOOK_GROUP)):
            try:
                await self.redis.xgroup_create(stream, group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def _write(self, calls: list[tuple[str, list[str], list[Any]]], *, replicated: bool) -> list[Any]:
        """Run script calls in one round trip. ``replicated``: a write the caller reports as accepted or final,
        which with ``INFERQ_REDIS_WAIT_REPLICAS`` waits for that many replicas (half the socket timeout at most)
        or raises :class:`ReplicationLag`."""
        replicas = self.settings.redis_wait_replicas
        if replicated and replicas > 0 and calls:
            timeout_ms = max(1, int(self.settings.redis_timeout_s * 500))
            return await self.scripts.replicated(calls, replicas, timeout_ms)
        return await self.scripts.many(calls)

    # ------------------------------------------------------------------ the HTTP side

    def _enqueue_call(self, tenant: str, request: JobRequest, job_id: str, now: int) -> tuple:
        keys = [self.keys.stream, self.keys.stats, self.keys.expiry, self.keys.job(job_id), self.keys.tenants]
        if request.idempotency_key is not None:
            keys.append(self.keys.idem(tenant, idempotency_digest(request.idempotency_key)))
        fields: list[Any] = ["url", request.url, "body", canonical_json(request.body)]
        if request.metadata:
            fields += ["metadata", canonical_json(request.metadata)]
        if request.timeout_s is not None:
            fields += ["timeout_s", request.timeout_s]
        if request.ttl_s is not None:
            fields += ["ttl_s", request.ttl_s]
        if request.webhook_url:
            fields += ["webhook_url", request.webhook_url]
        if request.traceparent:
            fields += ["trace", request.traceparent]
        expires_at = now + request.ttl_s * 1000 if request.ttl_s is not None else ""
        args = [job_id, tenant, request.digest(), self.settings.max_queue_depth, now, self.settings.result_ttl_s,
                expires_at, self.settings.tenant_max_depth, *fields]
        return ("enqueue", keys, args)

    async def _enqueued(self, tenant: str, request: JobRequest, job_id: str, now: int, reply: Any) -> tuple[Job, bool]:
        code = int(reply[0])
        if code == 0:
            job = Job(
                id=job_id,
                tenant=tenant,
                status=JobStatus.QUEUED,
                url=request.url,
                body=request.body,
                attempts=1,
                deliveries=0,
                created_at=now / 1000.0,
                metadata=dict(request.metadata),
                timeout_s=request.timeout_s,
                ttl_s=request.ttl_s,
                webhook_url=request.webhook_url,
                traceparent=request.traceparent,
                entry=reply[2],
            )
            return job, False
        if code == 1:
            record = await self.redis.hgetall(self.keys.job(reply[1]))
            if not record or "status" not in record:  # its record expired under a live key: it protects nothing
                await self.redis.delete(self.keys.idem(tenant, idempotency_digest(request.idempotency_key or "")))
                return await self.enqueue(tenant, request, now=now)
            if record.get("digest") != request.digest():
                raise IdempotencyConflict(reply[1])
            return Job.from_hash(record), True
        if code == Code.QUEUE_FULL:
            raise QueueFull(int(reply[1]))
        if code == Code.TENANT_FULL:
            raise TenantQuotaFull(int(reply[1]))
        raise QueueError(f"enqueue returned {reply!r}")

    async def enqueue(self, tenant: str, request: JobRequest, *, now: int | None = None) -> tuple[Job, bool]:
        """Accept a job in one round trip. Returns the job and whether it is an idempotent replay.
        Raises QueueFull (TenantQuotaFull for the tenant's quota) and, with replicas to wait for, ReplicationLag."""
        now = now or now_ms()
        job_id = new_job_id()
        [reply] = await self._write([self._enqueue_call(tenant, request, job_id, now)], replicated=True)
        return await self._enqueued(tenant, request, job_id, now, reply)

    async def enqueue_many(self, tenant: str, requests: Sequence[JobRequest]) -> list[tuple[Job, bool]]:
        """Accept many jobs in one round trip, each still its own atomic script (batch clients, benchmarks)."""
        now = now_ms()
        ids = [new_job_id() for _ in requests]
        calls = [self._enqueue_call(tenant, r, i, now) for r, i in zip(requests, ids, strict=True)]
        replies = await self._write(calls, replicated=True)
        return [await self._enqueued(tenant, r, i, now, reply)
                for r, i, reply in zip(requests, ids, replies, strict=True)]

    async def get(self, job_id: str, tenant: str | None = None) -> Job | None:
        """The job, or None when unknown or (with ``tenant``) another tenant's."""
        record = await self.redis.hgetall(self.keys.job(job_id))
        if not record or "status" not in record:
            return None
        job = Job.from_hash(record)
        if tenant is not None and job.tenant != tenant:
            return None
        expires_at = record.get("expires_at")
        if job.status is JobStatus.QUEUED and expires_at and not job.started_at and int(expires_at) < now_ms():
            await self._expire_calls([job_id])  # its ttl_s passed while it waited: expire it now, not at pick-up
            return await self.get(job_id, tenant)
        return job

    async def wait(self, job_id: str, tenant: str | None, timeout_s: float) -> Job | None:
        """The job as soon as it is terminal, or as it is when ``timeout_s`` is over. Blocks in Redis on the job's
        wakeup list (BLMOVE list->itself keeps the element for other waiters), on one connection, in slices
        shorter than the socket timeout so a frozen server is still noticed within it."""
        job = await self.get(job_id, tenant)
        if job is None or job.status.terminal or timeout_s <= 0:
            return job
        deadline = time.monotonic() + timeout_s
        done_key = self.keys.done(job_id)
        slice_s = max(0.1, self.settings.redis_timeout_s * 0.5)
        while (remaining := deadline - time.monotonic()) > 0.01:
            woke = await self.redis.blmove(done_key, done_key, min(remaining, slice_s), "LEFT", "RIGHT")
            if woke is not None:
                break
        return await self.get(job_id, tenant)

    async def cancel(self, tenant: str, job_id: str, *, now: int | None = None) -> Job:
        """Cancel (queued) or request cancellation (running). Raises JobNotFound or JobTerminal."""
        keys = [self.keys.stream, self.keys.stats, self.keys.events, self.keys.delayed, self.keys.tenants,
                self.keys.job(job_id), self.keys.done(job_id)]
        args = [tenant, now or now_ms(), self.settings.result_ttl_s, self.settings.events_maxlen, new_token()]
        [reply] = await self._write([("cancel", keys, args)], replicated=True)
        if int(reply[0]) == Code.NOT_FOUND:
            raise JobNotFound(job_id)
        job = await self.get(job_id, tenant)
        if job is None:
            raise JobNotFound(job_id)
        if int(reply[0]) == Code.TERMINAL:
            raise JobTerminal(job)
        return job

    async def redrive(self, tenant: str, job_id: str, *, now: int | None = None) -> Job:
        keys = [self.keys.stream, self.keys.stats, self.keys.dlq, self.keys.tenants, self.keys.job(job_id),
                self.keys.done(job_id)]
        [reply] = await self._write([("redrive", keys, [tenant, now or now_ms(), new_token()])], replicated=True)
        code = int(reply[0])
        if code == Code.NOT_FOUND:
            raise JobNotFound(job_id)
        if code == Code.NOT_DEAD_LETTERED:
            raise NotDeadLettered(f"job {job_id} is not dead-lettered (status {reply[1]})")
        job = await self.get(job_id, tenant)
        if job is None:
            raise JobNotFound(job_id)
        return job

    async def dead_letters(self, tenant: str, limit: int = 20) -> list[Job]:
        """The tenant's dead-lettered jobs, newest first."""
        found: list[Job] = []
        upper = "+"
        while len(found) < limit:
            page = await self.redis.xrevrange(self.keys.dlq, max=upper, min="-", count=200)
            if not page:
                break
            ids = [fields.get("job", "") for entry_id, fields in page if fields.get("tenant") == tenant]
            if ids:
                pipe = self.redis.pipeline(transaction=False)
                for job_id in ids:
                    pipe.hgetall(self.keys.job(job_id))
                for record in await pipe.execute():
                    if record and record.get("dead_lettered") == "1" and len(found) < limit:
                        found.append(Job.from_hash(record))
            if len(page) < 200:
                break
            upper = "(" + page[-1][0]
        return found

    async def observe(self, *, now: int | None = None, heartbeat_stale_ms: int | None = None) -> Observation:
        now = now or now_ms()
        stale = heartbeat_stale_ms or max(3 * self.settings.claim_idle_ms, 15000)
        keys = [self.keys.stream, self.keys.delayed, self.keys.stats, self.keys.workers, self.keys.scale,
                self.keys.dlq]
        r = await self.scripts("observe", keys, [now, stale])
        return Observation(
            lag=int(r[0]), pending=int(r[1]), delayed=int(r[2]), delayed_due=int(r[3]), unfinished=int(r[4]),
            workers=int(r[5]), busy_workers=int(r[6]), in_flight=int(r[7]), oldest_entry_ms=int(r[8]),
            group_missing=bool(int(r[9])), dlq=int(r[10]), desired=_optional_int(r[11]), reason=r[12] or "",
            decided_at=float(r[13]) if r[13] else None,
        )

    async def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in (await self.redis.hgetall(self.keys.stats)).items()}

    # ------------------------------------------------------------------ the worker side

    def _start_call(self, entry_id: str, job_id: str, consumer: str, now: int, reclaimed: bool, lease: str) -> tuple:
        keys = [self.keys.stream, self.keys.stats, self.keys.events, self.keys.dlq, self.keys.job(job_id),
                self.keys.done(job_id), self.keys.expiry, self.keys.tenants]
        args = [entry_id, consumer, now, self.settings.max_deliveries, self.settings.result_ttl_s,
                self.settings.events_maxlen, "1" if reclaimed else "0", lease]
        return ("start", keys, args)

    async def _start_entries(
        self, consumer: str, entries: Sequence[tuple[str, dict[str, str]]], reclaimed: bool
    ) -> tuple[list[Delivery], list[Skipped]]:
        now = now_ms()
        live = [(entry_id, fields.get("job", ""), new_token()) for entry_id, fields in entries if fields]
        replies = await self.scripts.many([self._start_call(e, j, consumer, now, reclaimed, t) for e, j, t in live])
        deliveries: list[Delivery] = []
        skipped: list[Skipped] = []
        for (entry_id, job_id, lease), reply in zip(live, replies, strict=True):
            code = int(reply[0])
            if code == 0:
                record = dict(zip(reply[1::2], reply[2::2], strict=True))
                deliveries.append(Delivery(entry_id, Job.from_hash(record), reclaimed, lease))
            else:
                skipped.append(Skipped(entry_id, job_id, Code(code), reply[1] if len(reply) > 1 else None))
        return deliveries, skipped

    async def read(
        self, consumer: str, count: int, block_ms: int | None = None
    ) -> tuple[list[Delivery], list[Skipped]]:
        """Take up to ``count`` new entries for ``consumer`` and start them. ``block_ms`` must stay below the
        client's socket timeout."""
        if count <= 0:
            return [], []
        try:
            reply = await self.redis.xreadgroup(GROUP, consumer, {self.keys.stream: ">"}, count=count, block=block_ms)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_groups()
            return [], []
        if not reply:
            return [], []
        entries = reply[0][1] if isinstance(reply, list) else next(iter(reply.values()))[0]
        return await self._start_entries(consumer, entries, reclaimed=False)

    async def reclaim(self, consumer: str, count: int) -> tuple[list[Delivery], list[Skipped]]:
        """Take over up to ``count`` entries idle longer than ``INFERQ_CLAIM_IDLE_MS`` (their worker died or hung)."""
        if count <= 0:
            return [], []
        try:
            reply = await self.redis.xautoclaim(
                self.keys.stream, GROUP, consumer, self.settings.claim_idle_ms, self._reclaim_cursor, count=count
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_groups()
            return [], []
        self._reclaim_cursor = reply[0]
        return await self._start_entries(consumer, reply[1], reclaimed=True)

    def _outcome(self, reply: Any, written: Outcome) -> Outcome:
        code = int(reply[0])
        if code >= 0:
            return written
        return {
            Code.NOT_FOUND: Outcome.NOT_FOUND,
            Code.TERMINAL: Outcome.DUPLICATE,
            Code.STALE: Outcome.STALE,
            Code.STALE_OWNER: Outcome.STALE,
            Code.ENDED: Outcome.ENDED,
        }[Code(code)]

    def _finish_call(self, delivery: Delivery, status: JobStatus, result: Any, error: Any, now: int) -> tuple:
        job_id = delivery.job.id
        keys = [self.keys.stream, self.keys.stats, self.keys.events, self.keys.tenants, self.keys.job(job_id),
                self.keys.done(job_id)]
        result_json = json.dumps(result) if result is not None else ""
        error_json = json.dumps(error) if error is not None else ""
        args = [delivery.entry_id, status.value, result_json, error_json, now, self.settings.result_ttl_s,
                self.settings.events_maxlen, delivery.lease,
                settle_token(delivery, "finish", status.value, result_json, error_json)]
        return ("finish", keys, args)

    async def finish(
        self, delivery: Delivery, status: JobStatus, *, result: Any = None, error: Any = None, now: int | None = None
    ) -> Outcome:
        """Write the terminal state once (first writer wins) and acknowledge the entry. A delivery this worker no
        longer holds changes nothing (Outcome.STALE)."""
        if status not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
            raise ValueError(f"a worker cannot finish a job as {status.value}")
        [reply] = await self._write([self._finish_call(delivery, status, result, error, now or now_ms())],
                                    replicated=True)
        return self._outcome(reply, Outcome.WRITTEN)

    async def finish_many(self, items: Sequence[tuple[Delivery, JobStatus, Any, Any]]) -> list[Outcome]:
        """Several finishes in one round trip (each still its own atomic script)."""
        now = now_ms()
        replies = await self._write([self._finish_call(d, s, r, e, now) for d, s, r, e in items], replicated=True)
        return [self._outcome(reply, Outcome.WRITTEN) for reply in replies]

    async def retry(self, delivery: Delivery, *, delay_ms: int, error: Any, now: int | None = None) -> Outcome:
        """Acknowledge this attempt and queue the next (or dead-letter past max attempts), atomically."""
        job_id = delivery.job.id
        keys = [self.keys.stream, self.keys.stats, self.keys.events, self.keys.delayed, self.keys.dlq,
                self.keys.tenants, self.keys.job(job_id), self.keys.done(job_id)]
        error_json = json.dumps(error)
        args = [delivery.entry_id, now or now_ms(), max(0, int(delay_ms)), self.settings.max_attempts,
                error_json, self.settings.result_ttl_s, self.settings.events_maxlen, delivery.lease,
                settle_token(delivery, "retry", error_json)]
        # a retry may end the job (dead-lettered, or cancelled): with replicas to wait for, it waits like finish
        [reply] = await self._write([("retry", keys, args)], replicated=True)
        if int(reply[0]) == 2:
            return Outcome.DEAD_LETTERED
        return self._outcome(reply, Outcome.RETRY_SCHEDULED)

    async def release(self, delivery: Delivery) -> Outcome:
        """Give the job back at once without spending an attempt (shutdown)."""
        keys = [self.keys.stream, self.keys.stats, self.keys.job(delivery.job.id)]
        args = [delivery.entry_id, delivery.lease, settle_token(delivery, "release")]
        reply = await self.scripts("release", keys, args)
        return self._outcome(reply, Outcome.RELEASED)

    async def renew(self, consumer: str, deliveries: Sequence[Delivery]) -> list[Lease]:
        """Renew this worker's leases; learn which jobs were cancelled or lost."""
        if not deliveries:
            return []
        keys = [self.keys.stream, *(self.keys.job(d.job.id) for d in deliveries)]
        args = [consumer, *(d.entry_id for d in deliveries), *(d.lease for d in deliveries)]
        codes = await self.scripts("renew", keys, args)
        return [Lease(int(c)) for c in codes]

    async def _expire_calls(self, job_ids: Sequence[str], now: int | None = None) -> int:
        now = now or now_ms()
        calls = [
            ("expire", [self.keys.stream, self.keys.stats, self.keys.events, self.keys.delayed, self.keys.expiry,
                        self.keys.tenants, self.keys.job(j), self.keys.done(j)],
             [j, now, self.settings.result_ttl_s, self.settings.events_maxlen])
            for j in job_ids
        ]
        return sum(1 for reply in await self.scripts.many(calls) if int(reply[0]) == 0)

    async def expire_due(self, *, now: int | None = None, limit: int = 100) -> int:
        """Expire jobs whose ``ttl_s`` passed before an attempt started (sweeps by the scaler and the workers)."""
        now = now or now_ms()
        due = await self.redis.zrangebyscore(self.keys.expiry, "-inf", now, start=0, num=limit)
        return await self._expire_calls(due, now) if due else 0

    async def promote(self, *, now: int | None = None, limit: int = 100) -> int:
        """Move due retries from the delayed set into the stream."""
        now = now or now_ms()
        due = await self.redis.zrangebyscore(self.keys.delayed, "-inf", now, start=0, num=limit)
        if not due:
            return 0
        keys = [self.keys.stream, self.keys.delayed, *(self.keys.job(j) for j in due)]
        return int(await self.scripts("promote", keys, [now, new_token(), *due]))

    async def heartbeat(self, worker_id: str, in_flight: int, *, now: int | None = None) -> None:
        await self.redis.hset(self.keys.workers, worker_id, f"{now or now_ms()} {in_flight}")

    async def forget_worker(self, worker_id: str) -> None:
        """Remove a stopped worker's heartbeat, and its consumer once it holds nothing: deleting a consumer
        drops its pending entries, which would strand them."""
        await self.redis.hdel(self.keys.workers, worker_id)
        try:
            held = await self.redis.xpending_range(self.keys.stream, GROUP, "-", "+", 1, consumername=worker_id)
            if not held:
                await self.redis.xgroup_delconsumer(self.keys.stream, GROUP, worker_id)
        except ResponseError:
            pass

    async def record_decision(self, desired: int, reason: str, *, at: float | None = None, **extra: Any) -> None:
        mapping: dict[str, Any] = {"desired": desired, "reason": reason, "at": at if at is not None else time.time()}
        mapping.update(extra)
        await self.redis.hset(self.keys.scale, mapping=mapping)

    async def scale_state(self) -> dict[str, str]:
        return dict(await self.redis.hgetall(self.keys.scale))

