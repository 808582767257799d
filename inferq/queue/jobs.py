"""The job: its status enum, its record in Redis and the public job object of HTTP API v1."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from inferq import fastjson


class JobStatus(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED})

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")


class Priority(StrEnum):
    """The lane of a job within its queue: a worker takes higher lanes first, with a starvation bound
    (:mod:`inferq.queue.lanes`). Retries, releases, reclaims and redrives keep the job's lane. A StrEnum, so that it
    formats as its value wherever it names a key."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


LANES = (Priority.HIGH, Priority.NORMAL, Priority.LOW)
"""The lanes in the order a worker takes them."""


_B32 = "abcdefghijklmnopqrstuvwxyz234567"
_B32_PAIRS = tuple(a + b for a in _B32 for b in _B32)
"""Two base32 characters for each 10-bit value."""
_PAIR_SHIFTS = tuple(range(120, -1, -10))


def new_job_id() -> str:
    """``job_`` + 128 random bits in lower-case base32 (26 characters): unguessable, URL- and key-safe.

    The characters ``base64.b32encode`` gives the same 16 bytes (its padding stripped, lower-cased), ten bits at a
    time: the standard library's base32 is written in Python and took a fifth of a submit's id-and-digest work."""
    bits = int.from_bytes(secrets.token_bytes(16), "big") << 2  # 130 bits: 26 characters of 5, as b32encode pads
    return "job_" + "".join([_B32_PAIRS[(bits >> shift) & 1023] for shift in _PAIR_SHIFTS])


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""One encoder for every call: ``json.dumps`` with options builds a new one each time, a third of its cost here."""


def canonical_json(value: Any) -> str:
    return _CANONICAL.encode(value)


def request_digest(request: dict[str, Any]) -> str:
    """SHA-256 of the canonical request: the same idempotency key with another request is a conflict."""
    return hashlib.sha256(canonical_json(request).encode()).hexdigest()


def idempotency_digest(key: str) -> str:
    """The client's idempotency key is hashed so any string (spaces, colons, unicode) makes a safe key name."""
    return hashlib.sha256(key.encode()).hexdigest()


DEFAULT_EXPECTED_TOKENS = 256
"""The expected tokens of a job whose body names no ``max_tokens`` (nor ``max_completion_tokens``): what the
scaler counts for it in ``backlog_tokens`` (docs/data-model.md)."""


def expected_tokens(body: dict[str, Any]) -> int:
    """The most tokens a job may produce, from its body: the work the scaler sizes the fleet by."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return DEFAULT_EXPECTED_TOKENS


@dataclass(frozen=True)
class JobRequest:
    """What a client submits (POST /v1/jobs), already validated."""

    body: dict[str, Any]
    url: str = "/v1/chat/completions"
    metadata: dict[str, str] = field(default_factory=dict)
    timeout_s: int | None = None
    ttl_s: int | None = None
    webhook_url: str | None = None
    idempotency_key: str | None = None
    traceparent: str | None = None
    priority: Priority = Priority.NORMAL
    work: int | None = None
    """The job's work in fair share when the caller knows it better than its body can tell (a claimed body: the
    gateway estimates it before the body goes to S3); None: :func:`inferq.queue.fairshare.estimated_work` of the
    body. Not part of the request: the digest leaves it out."""
    watch: bool = False
    """Its output is read as it is made from the start (the front door's ``stream: true``); not part of the request
    an idempotency key is checked against: a streamed and an unstreamed call are the same job."""
    continuation: bool = True
    """A later attempt continues after the output earlier ones made (False: each starts over; docs/api.md)."""

    def digest(self) -> str:
        request: dict[str, Any] = {
            "body": self.body,
            "url": self.url,
            "metadata": self.metadata,
            "timeout_s": self.timeout_s,
            "ttl_s": self.ttl_s,
            "webhook_url": self.webhook_url,
            "priority": self.priority.value,
        }
        if not self.continuation:  # digests of requests made before the opt-out existed stay the same
            request["continuation"] = False
        return request_digest(request)


def _seconds(ms: str | None) -> float | None:
    return int(ms) / 1000.0 if ms else None


_STATUSES = {status.value: status for status in JobStatus}
_LANES = {lane.value: lane for lane in Priority}


@dataclass(frozen=True)
class Job:
    """A job as stored in ``inferq:{Q}:job:<id>``."""

    id: str
    tenant: str
    status: JobStatus
    url: str
    body: dict[str, Any]
    attempts: int
    deliveries: int
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    dead_lettered: bool = False
    cancel_requested: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    timeout_s: int | None = None
    ttl_s: int | None = None
    webhook_url: str | None = None
    traceparent: str | None = None
    entry: str | None = None
    priority: Priority = Priority.NORMAL
    has_output: bool = False
    """The job has written output an attempt continues after (``inferq.queue.output``)."""
    watched: bool = False
    """Someone reads the job's output while it runs: its worker writes it as it is made (``inferq.queue.output``)."""
    continuation: bool = True
    """Whether a later attempt continues after the output earlier ones made (the record's ``continuation``, "0"
    when the job opted out)."""

    @classmethod
    def from_hash(cls, record: dict[str, str]) -> Job:
        """The job a record holds. Made without the dataclass's ``__init__``: a frozen dataclass sets each of its
        21 fields through ``object.__setattr__``, and this runs for every job a worker starts and every job object
        the gateway answers (about half the time it took, measured)."""
        get = record.get
        body, result, error, metadata = get("body"), get("result"), get("error"), get("metadata")
        timeout_s, ttl_s, lane = get("timeout_s"), get("ttl_s"), get("lane") or "normal"
        job = object.__new__(cls)
        job.__dict__.update(
            id=record["id"],
            tenant=record["tenant"],
            status=_STATUSES.get(record["status"]) or JobStatus(record["status"]),
            url=get("url") or ENDPOINTS[0],
            body=(fastjson.loads(body) or {}) if body else {},
            attempts=int(get("attempts") or 1),
            deliveries=int(get("deliveries") or 0),
            created_at=_seconds(get("created_at")) or 0.0,
            started_at=_seconds(get("started_at")),
            finished_at=_seconds(get("finished_at")),
            result=fastjson.loads(result) if result else None,
            error=fastjson.loads(error) if error else None,
            dead_lettered=get("dead_lettered") == "1",
            cancel_requested=get("cancel") == "1",
            metadata=(fastjson.loads(metadata) or {}) if metadata else {},
            timeout_s=int(timeout_s) if timeout_s else None,
            ttl_s=int(ttl_s) if ttl_s else None,
            webhook_url=get("webhook_url") or None,
            traceparent=get("trace") or None,
            entry=get("entry") or None,
            priority=_LANES.get(lane) or Priority(lane),
            has_output=get("out") not in (None, "", "0"),
            watched=get("watch") == "1",
            continuation=get("continuation") != "0",
        )
        return job

    def to_api(self) -> dict[str, Any]:
        """The job object of HTTP API v1 (docs/api.md)."""
        return {
            "id": self.id,
            "object": "job",
            "status": self.status.value,
            "url": self.url,
            "attempts": self.attempts,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "result": self.result,
            "error": self.error,
            "dead_lettered": self.dead_lettered,
            "metadata": self.metadata,
            "priority": self.priority.value,
        }


RECORD_FIELDS_BUT_BODY = (
    "id", "tenant", "status", "url", "attempts", "deliveries", "created_at", "started_at", "finished_at", "result",
    "error", "dead_lettered", "cancel", "metadata", "timeout_s", "ttl_s", "webhook_url", "trace", "entry", "lane",
    "expires_at", "out", "watch", "continuation",
)
"""The job record's fields that :meth:`Job.from_hash` and :meth:`~.producer.Producer.get` read, but the request
body: the gateway reads a job with ``HMGET`` of these, so a body of up to ``INFERQ_INLINE_MAX_BYTES`` need not travel
on every read and long-poll. A field :meth:`Job.from_hash` starts reading must be added here (a test holds it)."""


def record_of(fields: Sequence[str], values: Sequence[str | None]) -> dict[str, str]:
    """A job record from an ``HMGET`` of ``fields``: the fields the record has (an absent one answers None)."""
    return {name: value for name, value in zip(fields, values, strict=True) if value is not None}
