"""The Python client of HTTP API v1: :class:`Client` (blocking) and :class:`AsyncClient`, both on httpx.

What every caller of the API writes again otherwise, done once:

- ``submit`` sends an ``Idempotency-Key`` (a random one when none is given) and retries a 503 (outcome unknown),
  a 429 (queue full) and a lost connection with THE SAME key after ``Retry-After``, within a bounded number of
  attempts and a bounded total time. The key makes the retry safe: a job accepted before the failure comes back
  as the same job (200, ``Idempotent-Replayed``), never as a second one.
- ``wait`` long-polls ``GET /v1/jobs/{id}?wait=`` in slices of at most 20 s until the job ends or the deadline.
- Answers are typed: :class:`Job` (the job object) with :class:`~inferq.queue.jobs.JobStatus`, and one exception class
  per error ``type`` of the envelope (:data:`ERRORS`), under one class per HTTP status, each carrying the status and
  the envelope itself.
- :func:`verify_webhook` checks a delivery's Standard Webhooks signature with the tenant's secret (or both during a
  rotation), which ``Client.webhook_secret()`` reads and ``Client.rotate_webhook_secret()`` replaces.

The typed answers live in :mod:`inferq.client.answers` and the webhook check in :mod:`inferq.webhooks.signing`; all are
importable from here. The blocking client is in :mod:`.blocking`, the asyncio one in :mod:`.aio`; each keeps only
its I/O. Every method is written once, without I/O, in :mod:`.calls`, and what else both share is in
:mod:`.common`. This package is the only part of ``inferq`` that imports httpx: the queue protocol never needs
it (tests/unit/test_layout.py).
- ``stream`` iterates a job's output as it is made (``GET /v1/jobs/{id}/stream``): text pieces that, joined, are the
  final text of its first choice, long-polling until the job ends.
- ``usage`` reads the tenant's metered usage (``GET /v1/usage``), for chargeback.
- ``events`` iterates the results feed (``GET /v1/events``): the tenant's terminal jobs in the order they ended,
  long-polling for more, resumable from a cursor the caller persists, bounded by an optional deadline or count.

Files, Uploads and Batches (``/v1/files``, ``/v1/uploads``, ``/v1/batches``) have no typed objects here: they are
the OpenAI API, so the official ``openai`` client, its ``base_url`` set to the gateway's ``/v1``, is the client for
them.
"""

from __future__ import annotations

from inferq.queue.jobs import JobStatus
from inferq.webhooks.signing import WebhookVerificationError, verify_webhook

from .aio import AsyncClient
from .answers import (
    ERRORS,
    BadRequest,
    BatchTerminal,
    Conflict,
    EngineCoolOff,
    FileInUse,
    FilesUnavailable,
    Forbidden,
    GatewayUnreachable,
    IdempotencyConflict,
    InferqError,
    InternalError,
    InvalidCursor,
    InvalidRequest,
    Job,
    JobTerminal,
    MethodNotAllowed,
    ModelNotFound,
    NotDeadLettered,
    NotFound,
    OperatorOnly,
    PriorityNotAllowed,
    QueueFull,
    QuotaExceeded,
    RateLimited,
    RequestTooLarge,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    UploadNotPending,
)
from .blocking import Client
from .common import AsyncEventStream, AsyncTextStream, EventStream, TextStream
from .common import RetryPolicy as RetryPolicy  # re-exported: the building blocks a caller may use directly
from .common import error_from as error_from
from .common import new_idempotency_key as new_idempotency_key
from .common import retry_after_s as retry_after_s
from .common import submit_request as submit_request

__all__ = [
    "ERRORS",
    "AsyncClient",
    "AsyncEventStream",
    "AsyncTextStream",
    "BadRequest",
    "BatchTerminal",
    "Client",
    "Conflict",
    "EngineCoolOff",
    "EventStream",
    "FileInUse",
    "FilesUnavailable",
    "Forbidden",
    "GatewayUnreachable",
    "IdempotencyConflict",
    "InferqError",
    "InternalError",
    "InvalidCursor",
    "InvalidRequest",
    "Job",
    "JobStatus",
    "JobTerminal",
    "MethodNotAllowed",
    "ModelNotFound",
    "NotDeadLettered",
    "NotFound",
    "OperatorOnly",
    "PriorityNotAllowed",
    "QueueFull",
    "QuotaExceeded",
    "RateLimited",
    "RequestTooLarge",
    "ServerError",
    "TextStream",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "UploadNotPending",
    "WebhookVerificationError",
    "verify_webhook",
]
