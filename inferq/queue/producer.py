"""The producer side of the queue, what the HTTP API runs: accept a job (once per idempotency key), read it, wait
for it to end, cancel it, list and redrive dead letters. Refusals raise the exceptions below, which the gateway
maps to its HTTP answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from inferq.queue.core import QueueCore, chunks, new_token, now_ms
from inferq.queue.fairshare import cost
from inferq.queue.jobs import (
    RECORD_FIELDS_BUT_BODY,
    Job,
    JobRequest,
    JobStatus,
    idempotency_digest,
    new_job_id,
    record_of,
)
from inferq.queue.output_feed import OutputFeed
from inferq.queue.records import job_work, record_fields
from inferq.queue.refusals import (
    EngineCoolOff,
    IdempotencyConflict,
    JobNotFound,
    JobTerminal,
    NotDeadLettered,
    OperatorOnly,
    QueueError,
    QueueFull,
    RetainedQuotaFull,
    TenantQuotaFull,
)
from inferq.queue.waiters import SharedWaiters
from inferq.redis.scripting import Code

__all__ = [
    "EngineCoolOff", "IdempotencyConflict", "JobNotFound", "JobTerminal", "NotDeadLettered", "OperatorOnly", "Producer",
    "QueueError", "QueueFull", "RetainedQuotaFull", "TenantQuotaFull",
]

DLQ_PAGE = 200
"""Members of the dead-letter index read per round trip of :meth:`Producer.dead_letters`."""
RATE_CALL_KEEP_MS = 10_000
"""How long a rate-limit call's answer is kept for a resent copy (beyond any client timeout and its retry)."""


def _lane(job: tuple[str, JobRequest, str, int]) -> str:
    return job[1].priority.value


class Producer(QueueCore):
    _waiters: SharedWaiters | None = None
    _feed: OutputFeed | None = None

    def _enqueue_call(self, jobs: Sequence[tuple[str, JobRequest, str, int]], weight: float | None = None) -> tuple:
        """The enqueue script call that accepts ``jobs`` (tenant, request, job id, now; :data:`SCRIPT_BATCH` at
        most, all of one lane). It answers a list of replies, one per job. ``weight``: the tenants' weight in fair
        share, when the caller knows it (else ``INFERQ_TENANT_WEIGHTS``)."""
        keys_of, settings = self.keys, self.settings
        keys = [keys_of.stats, keys_of.expiry, keys_of.tenants, keys_of.bounds, *keys_of.fair_lane(jobs[0][1].priority)]
        args: list[Any] = [settings.max_queue_depth, settings.tenant_max_depth, settings.result_ttl_s,
                           settings.tenant_max_retained_bytes, self.fair_flag]
        count_tokens = settings.scale_tokens_per_s > 0
        model = not settings.models and settings.usage_retention_days > 0
        for tenant, request, job_id, now in jobs:
            job_key = keys_of.job(job_id)
            idem = request.idempotency_key
            # without an idempotency key the job record stands in its place: the script tells them apart
            keys += [job_key, keys_of.idem(tenant, idempotency_digest(idem)) if idem is not None else job_key]
            share = weight if weight is not None else settings.weight_of(tenant)
            work = job_work(request)
            fields = record_fields(request, count_tokens, model, work=work, weight=share)
            expires_at = now + request.ttl_s * 1000 if request.ttl_s is not None else ""
            # the digest is what a retry with the same idempotency key is checked against: without a key, nothing is
            digest = request.digest() if idem is not None else ""
            args += [job_id, tenant, digest, now, expires_at, cost(work, share), len(fields) // 2, *fields]
        return ("enqueue", keys, args)

    async def _accept(self, jobs: Sequence[tuple[str, JobRequest, str, int]], weight: float | None = None
                      ) -> list[Any]:
        """Each job's enqueue reply, all in one round trip and one script call per :data:`SCRIPT_BATCH` jobs."""
        replies = await self._write([self._enqueue_call(part, weight) for part in chunks(jobs, by=_lane)],
                                    replicated=True)
        return [reply for call in replies for reply in call]

    async def _enqueued(self, tenant: str, request: JobRequest, job_id: str, now: int, reply: Any,
                        weight: float | None = None) -> tuple[Job, bool]:
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
                priority=request.priority,
            )
            return job, False
        if code == 1:
            record = await self.redis.hgetall(self.keys.job(reply[1]))
            if not record or "status" not in record:  # its record expired under a live key: it protects nothing
                await self.redis.delete(self.keys.idem(tenant, idempotency_digest(request.idempotency_key or "")))
                return await self.enqueue(tenant, request, now=now, weight=weight)
            if record.get("digest") != request.digest():
                raise IdempotencyConflict(reply[1])
            return Job.from_hash(record), True
        if code == Code.QUEUE_FULL:
            raise QueueFull(int(reply[1]))
        if code == Code.TENANT_FULL:
            raise TenantQuotaFull(int(reply[1]))
        if code == Code.RETAINED_FULL:
            raise RetainedQuotaFull(int(reply[1]) / 1000)
        if code == Code.COOLING_OFF:
            raise EngineCoolOff(int(reply[1]) / 1000)
        raise QueueError(f"enqueue returned {reply!r}")

    async def enqueue(self, tenant: str, request: JobRequest, *, now: int | None = None, weight: float | None = None
                      ) -> tuple[Job, bool]:
        """Accept a job in one round trip. Returns the job and whether it is an idempotent replay. ``weight``: the
        tenant's weight in fair share, when the caller knows it (else ``INFERQ_TENANT_WEIGHTS``).
        Raises QueueFull (TenantQuotaFull for the tenant's quota) and, with replicas to wait for, ReplicationLag.
        One script call per submit: the gateway runs as Lambda, one request at a time per sandbox, where submits
        never meet in one turn of the event loop to be sent together (``enqueue_many`` sends many at once)."""
        now = now or now_ms()
        job_id = new_job_id() + self.id_suffix
        # a wait for it here need not read it first (SharedWaiters.expect); a ttl_s job is read (it may expire)
        waiters = self._waiters if request.ttl_s is None else None
        if waiters is not None:
            waiters.expect(job_id, tenant)
        try:
            [reply] = await self._accept([(tenant, request, job_id, now)], weight)
            accepted = await self._enqueued(tenant, request, job_id, now, reply, weight)
        except BaseException:
            if waiters is not None:
                waiters.forget(job_id)
            raise
        if waiters is not None and accepted[0].id != job_id:  # an idempotent replay answers another job
            waiters.forget(job_id)
        return accepted

    async def enqueue_many(self, tenant: str, requests: Sequence[JobRequest], *, weight: float | None = None
                           ) -> list[tuple[Job, bool]]:
        """Accept many jobs in one round trip and one script call per :data:`SCRIPT_BATCH` of them (batch
        clients, benchmarks)."""
        now = now_ms()
        jobs = [(tenant, r, new_job_id() + self.id_suffix, now) for r in requests]
        replies = await self._accept(jobs, weight) if jobs else []
        return [await self._enqueued(tenant, r, i, now, reply, weight)
                for (_, r, i, _), reply in zip(jobs, replies, strict=True)]

    async def get(self, job_id: str, tenant: str | None = None, *, with_body: bool = True) -> Job | None:
        """The job, or None when unknown or (with ``tenant``) another tenant's. ``with_body=False`` leaves the
        request body in Redis (the job's ``body`` is then ``{}``): the HTTP API's job object does not carry it, so
        the gateway's reads and waits do not move a body of up to ``INFERQ_INLINE_MAX_BYTES`` each time."""
        key = self.keys.job(job_id)
        if with_body:
            record = await self.redis.hgetall(key)
        else:
            record = record_of(RECORD_FIELDS_BUT_BODY, await self.redis.hmget(key, RECORD_FIELDS_BUT_BODY))
        return await self._job_of(job_id, record, tenant, with_body)

    async def _job_of(self, job_id: str, record: dict[str, str], tenant: str | None, with_body: bool) -> Job | None:
        """:meth:`get`'s answer from the job's record as read."""
        if not record or "status" not in record:
            return None
        job = Job.from_hash(record)
        if tenant is not None and job.tenant != tenant:
            return None
        expires_at = record.get("expires_at")
        if job.status is JobStatus.QUEUED and expires_at and not job.started_at and int(expires_at) < now_ms():
            await self._expire_calls([job_id])  # its ttl_s passed while it waited: expire it now, not at pick-up
            return await self.get(job_id, tenant, with_body=with_body)
        return job

    async def wait(self, job_id: str, tenant: str | None, timeout_s: float, *, shared: bool = False,
                   with_body: bool = True) -> Job | None:
        """The job as soon as it is terminal, or as it is when ``timeout_s`` is over.

        ``shared`` (a long-lived process: uvicorn, a container): wait on this process's one reader of the queue's
        terminal events (:class:`~inferq.queue.waiters.SharedWaiters`), no connection of its own. Otherwise (Lambda, one
        request per invocation): block in Redis on the job's wakeup list (BLMOVE list->itself keeps the element for
        other waiters) in slices shorter than the socket timeout, so a frozen server is still noticed within it."""
        if shared and timeout_s > 0:
            return await self._wait_shared(job_id, tenant, timeout_s, with_body)
        job = await self.get(job_id, tenant, with_body=with_body)
        if job is None or job.status.terminal or timeout_s <= 0:
            return job
        deadline = time.monotonic() + timeout_s
        done_key = self.keys.done(job_id)
        slice_s = max(0.1, self.settings.redis_timeout_s * 0.5)
        while (remaining := deadline - time.monotonic()) > 0.01:
            woke = await self.redis.blmove(done_key, done_key, min(remaining, slice_s), "LEFT", "RIGHT")
            if woke is not None:
                break
        return await self.get(job_id, tenant, with_body=with_body)

    @property
    def waiters(self) -> SharedWaiters:
        if self._waiters is None:
            self._waiters = SharedWaiters(self.redis, self.keys.events, job_key=self.keys.job,
                                          block_s=max(0.1, self.settings.redis_timeout_s * 0.5))
        return self._waiters

    @property
    def output_feed(self) -> OutputFeed:
        """This process's subscriptions to its followed jobs' output (inferq/queue/output_feed.py)."""
        if self._feed is None:
            self._feed = OutputFeed(self.redis)
        return self._feed

    async def close(self) -> None:
        await self.close_waiters()
        await super().close()

    async def close_waiters(self) -> None:
        """Stop this process's reader of terminal events (it also stops by itself when no one waits) and its
        followers' output feed."""
        if self._waiters is not None:
            await self._waiters.aclose()
        if self._feed is not None:
            await self._feed.aclose()
            self._feed = None

    async def _wait_shared(self, job_id: str, tenant: str | None, timeout_s: float, with_body: bool) -> Job | None:
        deadline = time.monotonic() + timeout_s
        waiters = self.waiters
        # before the read: an end after it is never missed; the reader reads the record with the wake (one round
        # trip for all the waiters an event read wakes) when the job object is read without its body
        future = await waiters.register(job_id, () if with_body else RECORD_FIELDS_BUT_BODY)
        try:
            # a job submitted here is not read to learn whether it is worth waiting for (SharedWaiters.expect): one
            # whose end the reader has not read yet is waited for at once, one whose end it has read is read whole
            ended = waiters.expected(job_id, tenant)
            if ended is None:
                worth = await self._worth_waiting(job_id, tenant)
                if worth is None:
                    return None
            elif ended:
                job = await self.get(job_id, tenant, with_body=with_body)
                if job is None or job.status.terminal:
                    return self._waited(job_id, job)
                worth = True  # ended and back (a redrive): wait again
            else:
                worth = True
            while worth:
                remaining = deadline - time.monotonic()
                if remaining <= 0.01:
                    break
                try:
                    async with asyncio.timeout(min(remaining, waiters.recheck_s)):
                        record = await future
                except TimeoutError:
                    # a reader that fell behind or lost an event costs a recheck, never the wake; the timeout
                    # cancelled the future, so a new one waits (registered before the read, as the first)
                    waiters.unregister(job_id, future)
                    future = await waiters.register(job_id, () if with_body else RECORD_FIELDS_BUT_BODY)
                    status = await self.redis.hget(self.keys.job(job_id), "status")
                    if status is None or JobStatus(status).terminal:
                        break
                    continue
                if record is not None:
                    return self._waited(job_id, await self._job_of(job_id, record, tenant, with_body))
                break
            # as it is now: ended, or the wait is over
            return self._waited(job_id, await self.get(job_id, tenant, with_body=with_body))
        finally:
            waiters.unregister(job_id, future)

    def _waited(self, job_id: str, job: Job | None) -> Job | None:
        """A wait's answer; a job it found ended (or gone) is no longer expected (SharedWaiters.expect)."""
        if job is None or job.status.terminal:
            self.waiters.forget(job_id)
        return job

    async def _worth_waiting(self, job_id: str, tenant: str | None) -> bool | None:
        """Whether a wait for the job has something to wait for, from the four fields that tell (where the job
        object needs twenty): None when the job is unknown or another tenant's, False when it is terminal already
        or queued past its ``ttl_s`` (the caller reads it whole: :meth:`get` expires it), True otherwise."""
        status, owner, expires_at, started_at = await self.redis.hmget(
            self.keys.job(job_id), "status", "tenant", "expires_at", "started_at")
        if status is None or (tenant is not None and owner != tenant):
            return None
        if JobStatus(status).terminal:
            return False
        return not (status == JobStatus.QUEUED.value and expires_at and not started_at
                    and int(expires_at) < now_ms())

    async def cancel(self, tenant: str, job_id: str, *, now: int | None = None) -> Job:
        """Cancel (queued) or request cancellation (running). Raises JobNotFound or JobTerminal."""
        now = now or now_ms()
        usage_keys, usage_args = self.meter(now)
        keys = [*self.keys.fair_lanes, self.keys.stats, self.keys.events, self.keys.delayed, self.keys.tenants,
                self.keys.job(job_id), self.keys.done(job_id), *usage_keys, self.keys.bounds]
        args = [tenant, now, self.settings.result_ttl_s, self.settings.events_maxlen, new_token(), *usage_args]
        [reply] = await self._write([("cancel", keys, args)], replicated=True)
        if int(reply[0]) == Code.NOT_FOUND:
            raise JobNotFound(job_id)
        job = await self.get(job_id, tenant)
        if job is None:
            raise JobNotFound(job_id)
        if int(reply[0]) == Code.TERMINAL:
            raise JobTerminal(job)
        return job

    async def redrive(self, tenant: str, job_id: str, *, now: int | None = None, operator: bool = False,
                      any_tenant: bool = False) -> Job:
        """Queue a dead-lettered job again. Raises JobNotFound, NotDeadLettered, or QueueFull / TenantQuotaFull
        under the same limits as :meth:`enqueue`. A job that killed the model server (``engine_died``) is an
        operator's to redrive (``operator``), else OperatorOnly; ``any_tenant``: another tenant's job too."""
        keys = [*self.keys.fair_lanes, self.keys.stats, self.keys.dlq, self.keys.tenants, self.keys.job(job_id),
                self.keys.done(job_id), self.keys.dlq_index, self.keys.out(job_id)]
        args = [tenant, now or now_ms(), new_token(), self.settings.max_queue_depth, self.settings.tenant_max_depth,
                "1" if operator else "0", "1" if any_tenant else "0", self.fair_flag]
        [reply] = await self._write([("redrive", keys, args)], replicated=True)
        code = int(reply[0])
        if code == Code.NOT_FOUND:
            raise JobNotFound(job_id)
        if code == Code.TENANT_FULL:  # the same limits as a submit: a redrive cannot sidestep them
            raise TenantQuotaFull(int(reply[1]))
        if code == Code.QUEUE_FULL:
            raise QueueFull(int(reply[1]))
        if code == Code.NOT_DEAD_LETTERED:
            raise NotDeadLettered(f"job {job_id} is not dead-lettered (status {reply[1]})")
        if code == Code.OPERATOR_ONLY:
            raise OperatorOnly(job_id)
        job = await self.get(job_id, None if any_tenant else tenant)
        if job is None:
            raise JobNotFound(job_id)
        return job

    async def dead_letters(self, tenant: str, limit: int = 20) -> list[Job]:
        """The tenant's dead-lettered jobs, newest first: its own part of the dead-letter index (``dlq:index``),
        never the other tenants'. Members whose job is no longer dead-lettered (redriven, or its record expired)
        are skipped and removed."""
        found: list[Job] = []
        seen: set[str] = set()
        low, high = f"[{tenant}|", f"({tenant}}}"  # every member "tenant|...": "|" is no tenant character
        offset = 0
        while len(found) < limit:
            page = await self.redis.zrangebylex(self.keys.dlq_index, low, high, start=offset, num=DLQ_PAGE)
            if not page:
                break
            offset += len(page)
            job_ids = [member.rsplit("|", 1)[-1] for member in page]
            pipe = self.redis.pipeline(transaction=False)
            for job_id in job_ids:
                pipe.hgetall(self.keys.job(job_id))
            stale = []
            for member, job_id, record in zip(page, job_ids, await pipe.execute(), strict=True):
                if not record or record.get("dead_lettered") != "1" or record.get("tenant") != tenant \
                        or job_id in seen:
                    stale.append(member)  # a job dead-lettered twice keeps its newest member only
                elif len(found) < limit:
                    seen.add(job_id)
                    found.append(Job.from_hash(record))
            if stale:
                await self.redis.zrem(self.keys.dlq_index, *stale)
                offset -= len(stale)
            if len(page) < DLQ_PAGE:
                break
        return found

    async def take_rate(self, tenant: str, per_s: float, burst: int) -> float:
        """Take one request from ``tenant``'s rate limit (shared by every gateway through Redis): 0.0 when allowed,
        else the seconds until the next request would be."""
        interval = max(1, round(1_000_000 / per_s))  # microseconds
        tolerance = interval * max(1, burst or round(per_s))
        keys = [self.keys.rate(tenant), self.keys.rate_call(tenant, new_token())]
        allowed, wait_ms = await self.scripts("ratelimit", keys, [interval, tolerance, RATE_CALL_KEEP_MS])
        return 0.0 if int(allowed) else int(wait_ms) / 1000.0
