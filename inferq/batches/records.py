"""Batches (OpenAI's Batch API, docs/api.md): the batch record in Redis, its status machine, the checks on each
input line and the lines of the output and error files. The driver that moves batches along is
:mod:`inferq.batches.driver`; file bytes live in S3 behind the caller's store, never in here.

Status machine (OpenAI's): ``validating`` -> ``in_progress`` -> ``finalizing`` -> ``completed``; ``validating``
-> ``failed`` (line errors); ``in_progress`` -> ``finalizing`` -> ``expired`` (the completion window passed);
``validating``/``in_progress`` -> ``cancelling`` -> ``finalizing`` -> ``cancelled``. The record says which end a
``finalizing`` batch is heading for (field ``end``).
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from inferq.config.settings import window_seconds
from inferq.queue.holds import retained_full
from inferq.queue.jobs import ENDPOINTS, Job, JobStatus
from inferq.queue.protocol import Queue
from inferq.queue.refusals import RetainedQuotaFull


class BatchStatus(str, Enum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)


TIMES = ("in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
         "cancelling_at", "cancelled_at")


def random_id(prefix: str) -> str:
    """``prefix`` + 128 random bits in lower-case base32."""
    return prefix + base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


def new_batch_id() -> str:
    return random_id("batch_")


def new_file_id() -> str:
    return random_id("file-")


def request_line_id(job_id: str) -> str:
    """The ``id`` of an output line: the job's random part, so a line can be traced to its job."""
    return "batch_req_" + job_id.removeprefix("job_")


class BatchNotFound(Exception):
    pass


class BatchTerminal(Exception):
    def __init__(self, batch: Batch) -> None:
        super().__init__(f"batch {batch.id} is already {batch.status.value}")
        self.batch = batch


@dataclass(frozen=True)
class Batch:
    """A batch as stored in ``inferq:{Q}:batch:<id>``."""

    id: str
    tenant: str
    status: BatchStatus
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    times: dict[str, int | None] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    next_line: int = 0
    next_offset: int = 0
    done_line: int = 0
    end: str | None = None
    cancel_sent: bool = False
    faults: int = 0
    """The driver's failed attempts at this batch's current step in a row (it fails after a few)."""
    retry_at: float = 0.0
    """Not before this time (Unix seconds): the backoff after a fault."""

    @classmethod
    def from_hash(cls, record: dict[str, str]) -> Batch:
        def number(name: str) -> int:
            return int(record.get(name) or 0)

        return cls(
            id=record["id"],
            tenant=record["tenant"],
            status=BatchStatus(record["status"]),
            endpoint=record["endpoint"],
            input_file_id=record["input_file_id"],
            completion_window=record["completion_window"],
            created_at=number("created_at"),
            times={name: int(record[name]) if record.get(name) else None for name in TIMES},
            output_file_id=record.get("output_file_id") or None,
            error_file_id=record.get("error_file_id") or None,
            errors=json.loads(record["errors"]) if record.get("errors") else None,
            metadata=json.loads(record["metadata"]) if record.get("metadata") else None,
            total=number("total"),
            completed=number("completed"),
            failed=number("failed"),
            next_line=number("next_line"),
            next_offset=number("next_offset"),
            done_line=number("done_line"),
            end=record.get("end") or None,
            cancel_sent=record.get("cancel_sent") == "1",
            faults=number("faults"),
            retry_at=float(record.get("retry_at") or 0),
        )

    def to_api(self) -> dict[str, Any]:
        """OpenAI's batch object."""
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.value,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            **{name: self.times.get(name) for name in TIMES},
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        }


# ---------------------------------------------------------------------- output lines

END_CODES = {
    BatchStatus.EXPIRED: ("batch_expired", "This request could not be executed before the completion window expired."),
    BatchStatus.CANCELLED: ("batch_cancelled", "This request was not executed: the batch was cancelled."),
    BatchStatus.FAILED: ("batch_failed", "This request was not executed: the input file has invalid lines "
                                         "(the batch's errors)."),
}
NOT_RUN = {
    "model_not_found": "no model of this deployment serves this request's body.model",
    "request_too_large": "this line is larger than INFERQ_MAX_BODY_BYTES, the limit of one job's request",
    "invalid_request": "this line could not be turned into a job",
}
"""Lines that became no job (``!<code>`` in the batch's lines): their error file code and message."""


def error_line(custom_id: str | None, code: str, message: str, job_id: str | None = None,
               response: dict[str, Any] | None = None) -> dict[str, Any]:
    """An error file line in OpenAI's format, with ``job_id``: the job that ran the line (None: none did)."""
    line_id = request_line_id(job_id) if job_id else "batch_req_" + secrets.token_hex(12)
    return {"id": line_id, "custom_id": custom_id, "response": response, "error": {"code": code, "message": message},
            "job_id": job_id}


def output_line(custom_id: str | None, job: Job | None, end: BatchStatus,
                job_id: str | None = None) -> tuple[bool, dict[str, Any]]:
    """``(is an error line, the line)`` for one request, in OpenAI's output/error file format. ``job_id``: the
    line's job when its record is gone (past its retention), so the line still names it."""
    job_id = job.id if job is not None else job_id
    if job is not None and job.status is JobStatus.SUCCEEDED and job.result is not None:
        return False, {
            "id": request_line_id(job.id),
            "custom_id": custom_id,
            "response": {"status_code": job.result.get("status_code", 200), "request_id": job.id,
                         "body": job.result.get("body")},
            "error": None,
            "job_id": job.id,
        }
    if job is not None and job.status is JobStatus.FAILED:
        error = job.error or {}
        response = None
        if job.result is not None:
            response = {"status_code": job.result.get("status_code"), "request_id": job.id,
                        "body": job.result.get("body")}
        return True, error_line(custom_id, error.get("type", "failed"), error.get("message", ""), job.id, response)
    if end in END_CODES:
        code, message = END_CODES[end]
    elif job is not None and job.error:
        code, message = job.error.get("type", job.status.value), job.error.get("message", "")
    elif job_id is not None and job is None:
        code, message = "result_expired", "the line's job record was gone before the output file was written"
    else:
        code, message = "not_executed", "This request was not executed."
    return True, error_line(custom_id, code, message, job_id)


# ---------------------------------------------------------------------- the record in Redis


IndexEntries = list[tuple[str, float]]
"""(batch id, creation ms) pairs of a tenant's index, as ``Batches.list`` reads them."""


class Batches:
    """Batch records of one queue: what the HTTP routes read and write. The driver moves them along."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.redis = queue.redis
        self.keys = queue.keys

    async def create(
        self, tenant: str, input_file_id: str, endpoint: str, completion_window: str, metadata: dict[str, str] | None
    ) -> Batch:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}")
        window_s = window_seconds(completion_window)
        if window_s is None:
            raise ValueError("completion_window must look like 24h")
        now_ms = int(time.time() * 1000)
        settings = self.queue.settings
        full = await retained_full(self.redis, self.keys, tenant, settings.tenant_max_retained_bytes, now_ms)
        if full is not None:
            raise RetainedQuotaFull(full)
        batch_id = new_batch_id()
        now = now_ms // 1000
        record: dict[str, Any] = {
            "id": batch_id, "tenant": tenant, "status": BatchStatus.VALIDATING.value, "endpoint": endpoint,
            "input_file_id": input_file_id, "completion_window": completion_window, "created_at": now,
            "expires_at": now + window_s, "next_line": 0, "next_offset": 0, "done_line": 0,
        }
        if metadata:
            record["metadata"] = json.dumps(metadata)
        # record first, indexes after: a crash in between leaves a record nothing points at, never an index entry
        # without a record
        # (the index forgets batches past its horizon here too, not only when listed: a tenant that never lists
        # its batches does not grow its index for ever)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.batch(batch_id), mapping=record)
        pipe.zadd(self.keys.batches_of(tenant), {batch_id: now_ms})
        pipe.zremrangebyscore(self.keys.batches_of(tenant), "-inf", f"({self._horizon_ms()}")
        pipe.zadd(self.keys.batches_active, {batch_id: now_ms})
        await pipe.execute()
        return Batch.from_hash({k: str(v) for k, v in record.items()})

    async def unfinished(self, tenant: str, up_to: int) -> int:
        """How many of the tenant's batches have not ended (the driver still works on them), counted up to
        ``up_to``: the tenant's index intersected with the active set, stopping at the bound."""
        count: int = await self.redis.zintercard(2, [self.keys.batches_active, self.keys.batches_of(tenant)],
                                                 limit=up_to)
        return count

    async def using_file(self, tenant: str, file_id: str) -> str | None:
        """A batch of the tenant, not yet ended, whose input file is ``file_id`` (None: no such batch). Reads the
        tenant's batches the driver still works on (the active set intersected with the tenant's index)."""
        active = await self.redis.zinter([self.keys.batches_active, self.keys.batches_of(tenant)])
        if not active:
            return None
        pipe = self.redis.pipeline(transaction=False)
        for batch_id in active:
            pipe.hmget(self.keys.batch(batch_id), "input_file_id", "status")
        for batch_id, (input_file_id, status) in zip(active, await pipe.execute(), strict=True):
            if input_file_id == file_id and status and not BatchStatus(status).terminal:
                return str(batch_id)
        return None

    async def get(self, batch_id: str, tenant: str | None = None) -> Batch | None:
        record = await self.redis.hgetall(self.keys.batch(batch_id))
        if not record or "status" not in record:
            return None
        batch = Batch.from_hash(record)
        if tenant is not None and batch.tenant != tenant:
            return None
        return batch

    async def list(self, tenant: str, *, after: str | None, limit: int) -> tuple[list[Batch], bool]:
        """The tenant's batches, newest first, from after the batch ``after``; whether more follow.

        The order is (creation ms, id), both descending: batches created in the same millisecond come in id order,
        so a page boundary between them loses or repeats none. An ``after`` whose record has since expired still
        has its index entry (kept until :meth:`_horizon_ms`), so the next page continues from its place; an
        ``after`` the index does not hold raises BatchNotFound (the gateway's 422), never an empty last page."""
        key = self.keys.batches_of(tenant)
        horizon = self._horizon_ms()
        position: tuple[float, str] | None = None
        if after:
            score = await self.redis.zscore(key, after)
            if score is None:
                raise BatchNotFound(after)
            position = (float(score), after)
        found: list[Batch] = []
        while len(found) <= limit:
            want = limit + 1 - len(found)
            entries: IndexEntries = await self._below(key, position, want)
            if not entries:
                break
            pipe = self.redis.pipeline(transaction=False)
            for batch_id, _ in entries:
                pipe.hgetall(self.keys.batch(batch_id))
            records = await pipe.execute()
            # records past their retention are skipped; their index entries stay until the horizon, so an `after`
            # naming one still finds its place, and go after it
            stale = [batch_id for (batch_id, score), record in zip(entries, records, strict=True)
                     if (not record or "status" not in record) and score < horizon]
            if stale:
                await self.redis.zrem(key, *stale)
            found += [b for b in (Batch.from_hash(r) for r in records if r and "status" in r) if b.tenant == tenant]
            position = (entries[-1][1], entries[-1][0])
            if len(entries) < want:
                break
        return found[:limit], len(found) > limit

    def index_keep_s(self) -> int:
        """How long after its creation a batch stays in its tenant's index: its record has surely expired by then
        (the longest completion window, then the result TTL, and a day's margin for a driver that was down), so no
        client can still hold it as a fresh ``after``. An ended batch is charged to its tenant until then."""
        windows = [window_seconds(w) or 0 for w in self.queue.settings.batch_completion_windows]
        return max(windows, default=0) + self.queue.settings.result_ttl_s + 86400

    def _horizon_ms(self) -> int:
        """Creation time (ms) before which a batch whose record is gone is forgotten by the index too
        (:meth:`index_keep_s`)."""
        return int(time.time() * 1000) - self.index_keep_s() * 1000

    async def _below(self, key: str, position: tuple[float, str] | None, count: int) -> IndexEntries:
        """Up to ``count`` index entries after ``position`` (score, id) in (score, id) descending order."""
        if position is None:
            top: IndexEntries = await self.redis.zrevrangebyscore(key, "+inf", "-inf", start=0, num=count,
                                                                              withscores=True)
            return top
        score, member = position
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrevrangebyscore(key, score, score, withscores=True)  # the same millisecond: few entries
        pipe.zrevrangebyscore(key, f"({int(score)}", "-inf", start=0, num=count, withscores=True)
        same, older = await pipe.execute()
        below: IndexEntries = [(m, s) for m, s in same if m < member] + older
        return below[:count]

    async def move(self, batch_id: str, from_: tuple[BatchStatus, ...], to: BatchStatus, **fields: Any) -> bool:
        """Move the batch's status if it is one of ``from_`` (movebatch.lua); whether it is now ``to``."""
        args: list[Any] = [",".join(s.value for s in from_), to.value]
        for name, value in fields.items():
            args += [name, value]
        reply = await self.queue.scripts("movebatch", [self.keys.batch(batch_id)], args)
        return int(reply[0]) == 1

    async def cancel(self, tenant: str, batch_id: str) -> Batch:
        """Ask for cancellation: the driver stops enqueueing, cancels the unfinished jobs and finalizes."""
        batch = await self.get(batch_id, tenant)
        if batch is None:
            raise BatchNotFound(batch_id)
        moved = await self.move(batch_id, (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS), BatchStatus.CANCELLING,
                                cancelling_at=int(time.time()))
        batch = await self.get(batch_id, tenant)
        if batch is None:
            raise BatchNotFound(batch_id)
        if not moved and batch.status is not BatchStatus.CANCELLED:
            raise BatchTerminal(batch)
        return batch
