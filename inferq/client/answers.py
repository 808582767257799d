"""What HTTP API v1 answers, typed: :class:`Job` (the job object) and one exception class per error ``type`` of
the envelope, each carrying the HTTP status and the envelope. No HTTP client in here: :mod:`inferq.client` builds
these from its responses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inferq.queue.jobs import JobStatus


@dataclass(frozen=True)
class Job:
    """The job object of HTTP API v1 (``raw`` keeps the whole answer, fields added later included)."""

    id: str
    status: JobStatus
    url: str
    attempts: int
    created_at: float
    started_at: float | None
    finished_at: float | None
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    dead_lettered: bool
    metadata: dict[str, str]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, data: Mapping[str, Any]) -> Job:
        return cls(
            id=data["id"],
            status=JobStatus(data["status"]),
            url=data.get("url", "/v1/chat/completions"),
            attempts=int(data.get("attempts") or 0),
            created_at=float(data.get("created_at") or 0.0),
            started_at=data.get("started_at"),
            finished_at=data.get("finished_at"),
            result=data.get("result"),
            error=data.get("error"),
            dead_lettered=bool(data.get("dead_lettered")),
            metadata=dict(data.get("metadata") or {}),
            raw=dict(data),
        )

    @property
    def terminal(self) -> bool:
        return self.status.terminal

    @property
    def output(self) -> Any:
        """The model server's response body (``result.body``) of a succeeded job, else None."""
        return (self.result or {}).get("body")

    @property
    def text(self) -> str | None:
        """The first choice's text of a chat or text completion, when there is one."""
        try:
            choice = self.output["choices"][0]
        except (KeyError, IndexError, TypeError):
            return None
        message = choice.get("message")
        return message.get("content") if isinstance(message, dict) else choice.get("text")


class InferqError(Exception):
    """An error answer of the API: ``status`` (HTTP), ``type`` and ``message`` from ``envelope`` (the whole body).
    Each ``type`` has its class (:data:`ERRORS`), under one class per status (``except Conflict`` catches every
    409, ``except TooManyRequests`` every 429)."""

    status_default: int = 0
    """The status whose answers of an unknown ``type`` become this class (set on one class per status)."""

    def __init__(self, status: int, type_: str, message: str, envelope: dict[str, Any] | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(f"{status} {type_}: {message}")
        self.status = status
        self.type = type_
        self.message = message
        self.envelope = envelope or {"error": {"type": type_, "message": message}}
        self.retry_after_s = retry_after_s


class BadRequest(InferqError):
    """400: a request the gateway could not read."""

    status_default = 400


class Unauthorized(InferqError):
    """401: missing or unknown API key; in AWS, API Gateway's 403 ``{"message":"Forbidden"}`` from the API key
    authorizer, which refuses such a request before the gateway runs (DEPLOY.md, "API keys")."""

    status_default = 401


class Forbidden(InferqError):
    """403: the key is known but may not do this."""

    status_default = 403


class PriorityNotAllowed(Forbidden):
    """403 ``priority_not_allowed``: a submit's ``priority`` above the tenant's ceiling."""


class OperatorOnly(Forbidden):
    """403 ``operator_only``: a route for the operators' tenants (``INFERQ_ADMIN_TENANTS``) only."""


class NotFound(InferqError):
    """404: unknown job, or another tenant's."""

    status_default = 404


class ModelNotFound(NotFound):
    """404 ``model_not_found``: ``body.model`` names no configured model."""


class MethodNotAllowed(InferqError):
    """405: a known path with another method."""

    status_default = 405


class Conflict(InferqError):
    """409."""

    status_default = 409


class IdempotencyConflict(Conflict):
    """409: the idempotency key was used before with a different request."""


class JobTerminal(Conflict):
    """409 on cancel: the job has already ended; :attr:`job` is the job as it is."""

    @property
    def job(self) -> Job | None:
        data = self.envelope.get("job")
        return Job.from_api(data) if isinstance(data, dict) else None


class NotDeadLettered(Conflict):
    """409 on redrive: the job is not in the dead-letter queue."""


class BatchTerminal(Conflict):
    """409 on a batch's cancel: it is finalizing or has ended; :attr:`batch` is the batch object as it is."""

    @property
    def batch(self) -> dict[str, Any] | None:
        data = self.envelope.get("batch")
        return data if isinstance(data, dict) else None


class FileInUse(Conflict):
    """409 on a file's delete: it is the input of a batch that has not ended."""


class UploadNotPending(Conflict):
    """409: a part, complete or cancel of an upload that is completed, cancelled or being completed."""


class RequestTooLarge(InferqError):
    """413: the body is above ``INFERQ_MAX_BODY_BYTES``."""

    status_default = 413


class UnsupportedMediaType(InferqError):
    """415."""

    status_default = 415


class InvalidRequest(InferqError):
    """422."""

    status_default = 422


class InvalidCursor(InvalidRequest):
    """422 ``invalid_cursor``: an ``after`` cursor this key was not given."""


class TooManyRequests(InferqError):
    """429: come back later (``retry_after_s``, when the gateway said when)."""

    status_default = 429


class QueueFull(TooManyRequests):
    """429 ``queue_full``: unfinished jobs reached ``INFERQ_MAX_QUEUE_DEPTH``."""


class RateLimited(TooManyRequests):
    """429 ``rate_limited``: the tenant's requests passed ``INFERQ_RATE_LIMIT_PER_S``."""


class QuotaExceeded(TooManyRequests):
    """429 ``quota_exceeded``: a tenant quota, or (on submit) the tenant's monthly budget (``INFERQ_TENANT_BUDGETS``):
    the message names it. Not worth retrying soon: ``submit`` does not."""


class EngineCoolOff(TooManyRequests):
    """429 ``engine_cooloff``: the tenant's jobs killed the model server ``INFERQ_ENGINE_STRIKES`` times within the
    window; its submits to that model are refused for the cool-off (``retry_after_s``: up to an hour). Not worth
    retrying soon: ``submit`` does not."""


class ServerError(InferqError):
    """5xx: the deployment could not answer (any 5xx without a class of its own too)."""


class InternalError(ServerError):
    """500 ``internal_error``: a bug; the request id is in the gateway's logs."""

    status_default = 500


class Unavailable(ServerError):
    """503: the queue store is unreachable (on submit: outcome unknown, retry with the same key)."""

    status_default = 503


class FilesUnavailable(Unavailable):
    """503 ``files_unavailable``: Files, Uploads or Batches without a bucket, or S3 not answering."""


class GatewayUnreachable(InferqError):
    """No HTTP answer at all (connection refused, reset, timed out); ``status`` is 0."""


ERRORS: dict[str, type[InferqError]] = {
    "bad_request": BadRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "priority_not_allowed": PriorityNotAllowed,
    "operator_only": OperatorOnly,
    "not_found": NotFound,
    "model_not_found": ModelNotFound,
    "method_not_allowed": MethodNotAllowed,
    "conflict": Conflict,
    "idempotency_conflict": IdempotencyConflict,
    "job_terminal": JobTerminal,
    "not_dead_lettered": NotDeadLettered,
    "batch_terminal": BatchTerminal,
    "file_in_use": FileInUse,
    "upload_not_pending": UploadNotPending,
    "request_too_large": RequestTooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "invalid_request": InvalidRequest,
    "invalid_cursor": InvalidCursor,
    "queue_full": QueueFull,
    "rate_limited": RateLimited,
    "quota_exceeded": QuotaExceeded,
    "engine_cooloff": EngineCoolOff,
    "internal_error": InternalError,
    "unavailable": Unavailable,
    "files_unavailable": FilesUnavailable,
}
"""Every error ``type`` of the envelope (docs/api.md's table) -> its class: a new type is one row here and a class
beside its status's (tests/unit/test_client_errors.py fails naming a type of the table that has no row, or shares
one)."""

def _classes(base: type[InferqError]) -> list[type[InferqError]]:
    return [base] + [c for sub in base.__subclasses__() for c in _classes(sub)]


BY_STATUS: dict[int, type[InferqError]] = {
    cls.status_default: cls for cls in _classes(InferqError) if "status_default" in vars(cls) and cls.status_default
}
"""The class of each status (the one setting ``status_default``), for an answer of a type this client does not
know yet."""


def error_for(status: int, body: Any, text: str = "", retry_after_s: float | None = None) -> InferqError:
    """The typed exception of an error answer (``body``: its parsed JSON, or None): by the envelope's ``type``,
    else by the HTTP status."""
    envelope = body if isinstance(body, dict) and isinstance(body.get("error"), dict) else None
    if envelope is not None:
        type_ = str(envelope["error"].get("type") or "error")
        message = str(envelope["error"].get("message") or "")
    else:
        type_, message = "error", text[:500]
    if envelope is None and status == 403:  # the authorizer's refusal: every 403 of the gateway has the envelope
        return Unauthorized(status, "unauthorized", message, None, retry_after_s)
    cls = ERRORS.get(type_) or BY_STATUS.get(status) or (ServerError if status >= 500 else InferqError)
    return cls(status, type_, message, envelope, retry_after_s)
