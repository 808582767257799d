"""Batches (OpenAI's Batch API, docs/api.md): the batch record in Redis, its status machine, the checks on each
input line and the lines of the output and error files. The driver that moves batches along is
:mod:`inferq.batch_driver`; file bytes live in S3 behind the caller's store, never in here.

Status machine (OpenAI's): ``validating`` -> ``in_progress`` -> ``finalizing`` -> ``completed``; ``validating``
-> ``failed`` (line errors); ``in_progress`` -> ``finalizing`` -> ``expired`` (the completion window passed);
``validating``/``in_progress`` -> ``cancelling`` -> ``finalizing`` -> ``cancelled``. The record says which end a
``finalizing`` batch is heading for (field ``end``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .jobs import ENDPOINTS, Job, JobStatus
from .queue import Queue
from .settings import window_seconds


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
MAX_ERRORS = 100
"""Line errors kept in ``errors.data`` of a failed batch (the first ones; the message says how many more)."""


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


# ---------------------------------------------------------------------- input lines


@dataclass(frozen=True)
class LineError:
    code: str
    message: str
    line: int  # 1-based, as in the file

    def to_api(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": None, "line": self.line}


def parse_line(raw: bytes, endpoint: str, line: int) -> tuple[dict[str, Any] | None, LineError | None]:
    """One input line -> the request object, or the reason it is refused (custom_id uniqueness is the caller's)."""
    try:
        request = json.loads(raw)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past the parser's depth
        return None, LineError("invalid_json_line", "this line is not valid JSON in UTF-8", line)
    if not isinstance(request, dict):
        return None, LineError("invalid_json_line", "this line is not a JSON object", line)
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 512:
        return None, LineError("invalid_custom_id", "custom_id must be a string of 1-512 characters", line)
    if request.get("method") != "POST":
        return None, LineError("invalid_method", "method must be POST", line)
    if request.get("url") != endpoint:
        return None, LineError("mismatched_endpoint", f"url must be the batch's endpoint {endpoint}", line)
    if not isinstance(request.get("body"), dict):
        return None, LineError("invalid_body", "body must be a JSON object", line)
    if _SURROGATE_ESCAPE.search(raw) is not None and not _encodable(request):
        return None, LineError("invalid_json_line", "this line holds a \\uD800-\\uDFFF escape that is no "
                                                    "character (a lone surrogate)", line)
    return request, None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
"""The only way JSON text can spell a lone surrogate (its bytes are not UTF-8, which the parser refuses)."""


def _encodable(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Line:
    """One non-blank line of an input file, as :func:`scan_lines` reads it."""

    end: int
    """The byte offset just past the line (its newline included)."""
    data: bytes | None
    """The line; None when it is longer than the reader's ``max_line`` (never held whole: a per-line error)."""
    size: int
    number: int
    """1-based, counted from where the read started (blank lines included)."""


def scan_lines(chunks: Iterable[bytes], start: int = 0, max_line: int | None = None) -> Iterator[Line]:
    """Each non-blank line of a byte stream read from ``start``. Memory: one chunk and one line, a line longer than
    ``max_line`` bytes being counted and skipped rather than kept (so a 200 MB line costs no more than a short
    one); time linear in the stream's size."""
    offset = start  # where the current line starts
    number = 0
    buf = bytearray()
    size = 0
    over = False
    for chunk in chunks:
        view = memoryview(chunk)
        pos, n = 0, len(chunk)
        while pos < n:
            nl = chunk.find(b"\n", pos)
            stop = n if nl < 0 else nl
            size += stop - pos
            if not over:
                if max_line is not None and size > max_line:
                    over, buf = True, bytearray()
                else:
                    buf += view[pos:stop]
            if nl < 0:
                break
            number += 1
            offset += size + 1
            if over or buf.strip():
                yield Line(offset, None if over else bytes(buf), size, number)
            buf, size, over = bytearray(), 0, False
            pos = nl + 1
    if over or buf.strip():
        yield Line(offset + size, None if over else bytes(buf), size, number + 1)


def input_lines(chunks: Iterator[bytes], start: int = 0) -> Iterator[tuple[int, bytes]]:
    """``(offset just past the line, the line)`` for each non-blank line of a byte stream read from ``start``."""
    for line in scan_lines(chunks, start):
        assert line.data is not None
        yield line.end, line.data


class Validator:
    """The checks of a whole input file, a line at a time, in file order (:func:`validate`, and again while a
    failed batch's error file is written). Memory: a 12-byte digest per custom_id (about 90 bytes each in the set:
    5 MB for 50,000 lines), never the ids themselves."""

    def __init__(self, endpoint: str, max_lines: int) -> None:
        self.endpoint = endpoint
        self.max_lines = max_lines
        self.seen: set[bytes] = set()
        self.count = 0
        self.bad = 0
        self.errors: list[LineError] = []
        self.too_many = False

    def check(self, line: Line) -> LineError | None:
        """The line's error (None: it is a request to run; a line over the body limit fails alone when it runs)."""
        self.count += 1
        error: LineError | None = None
        if self.count > self.max_lines:
            self.too_many = True
            error = LineError("too_many_requests", f"a batch holds at most {self.max_lines} requests "
                                                   "(INFERQ_BATCH_MAX_LINES); the file has more", line.number)
        elif line.data is not None:
            request, error = parse_line(line.data, self.endpoint, line.number)
            if request is not None:
                digest = hashlib.blake2b(request["custom_id"].encode(), digest_size=12).digest()
                if digest in self.seen:
                    error = LineError("duplicate_custom_id", "custom_id must be unique within the batch", line.number)
                else:
                    self.seen.add(digest)
        if error is not None:
            self.bad += 1
            if len(self.errors) < MAX_ERRORS:
                self.errors.append(error)
        return error


def validate(chunks: Iterable[bytes], endpoint: str, max_lines: int, max_line: int | None = None,
             deadline: float | None = None) -> Validator:
    """Check a whole input file, streaming; stops at the first line past ``max_lines`` (a file of a million lines
    is refused after reading ``max_lines`` + 1 of them). ``deadline`` (``time.monotonic()``): TimeoutError past it."""
    validator = Validator(endpoint, max_lines)
    for line in scan_lines(chunks, 0, max_line):
        validator.check(line)
        if validator.too_many:
            break
        if deadline is not None and line.number % 1024 == 0 and time.monotonic() > deadline:
            raise TimeoutError("validation ran past its step's deadline")
    return validator


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
        batch_id = new_batch_id()
        now_ms = int(time.time() * 1000)
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
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.batch(batch_id), mapping=record)
        pipe.zadd(self.keys.batches_of(tenant), {batch_id: now_ms})
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
        """The tenant's batches, newest first, from after the batch ``after``."""
        key = self.keys.batches_of(tenant)
        upper: str = "+inf"
        if after:
            score = await self.redis.zscore(key, after)
            if score is None:
                return [], False
            upper = f"({int(score)}"
        found: list[Batch] = []
        while len(found) <= limit:
            ids = await self.redis.zrevrangebyscore(key, upper, "-inf", start=0, num=limit + 1 - len(found),
                                                    withscores=True)
            if not ids:
                break
            batches = [await self.get(batch_id, tenant) for batch_id, _ in ids]
            gone = [batch_id for (batch_id, _), batch in zip(ids, batches, strict=True) if batch is None]
            if gone:  # records past their retention: forget them here too
                await self.redis.zrem(key, *gone)
            found += [b for b in batches if b is not None]
            upper = f"({int(ids[-1][1])}"
        return found[:limit], len(found) > limit

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
