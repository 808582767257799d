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
    """An error answer of the API: ``status`` (HTTP), ``type`` and ``message`` from ``envelope`` (the whole body)."""

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


class Unauthorized(InferqError):
    """401: missing or unknown API key; in AWS, API Gateway's 403 ``{"message":"Forbidden"}`` from the API key
    authorizer, which refuses such a request before the gateway runs (DEPLOY.md, "API keys")."""


class NotFound(InferqError):
    """404: unknown job, or another tenant's."""


class ModelNotFound(NotFound):
    """404 ``model_not_found``: ``body.model`` names no configured model."""


class Conflict(InferqError):
    """409."""


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


class RequestTooLarge(InferqError):
    """413: the body is above ``INFERQ_MAX_BODY_BYTES``."""


class InvalidRequest(InferqError):
    """422."""


class QueueFull(InferqError):
    """429: unfinished jobs reached ``INFERQ_MAX_QUEUE_DEPTH``; ``retry_after_s`` says when to try again."""


class QuotaExceeded(InferqError):
    """429 ``quota_exceeded``: a tenant quota, or (on submit) the tenant's monthly budget (``INFERQ_TENANT_BUDGETS``):
    the message names it. Not worth retrying soon: ``submit`` does not."""


class Forbidden(InferqError):
    """403: not allowed for this key (``operator_only``: another tenant's usage, queue-wide numbers;
    ``priority_not_allowed``)."""


class Unavailable(InferqError):
    """503: the queue store is unreachable (on submit: outcome unknown, retry with the same key)."""


class ServerError(InferqError):
    """Any other 5xx."""


class GatewayUnreachable(InferqError):
    """No HTTP answer at all (connection refused, reset, timed out); ``status`` is 0."""


_BY_TYPE: dict[str, type[InferqError]] = {
    "bad_request": BadRequest,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "model_not_found": ModelNotFound,
    "conflict": Conflict,
    "idempotency_conflict": IdempotencyConflict,
    "job_terminal": JobTerminal,
    "not_dead_lettered": NotDeadLettered,
    "request_too_large": RequestTooLarge,
    "invalid_request": InvalidRequest,
    "queue_full": QueueFull,
    "quota_exceeded": QuotaExceeded,
    "unavailable": Unavailable,
}
_BY_STATUS: dict[int, type[InferqError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 413: RequestTooLarge,
    422: InvalidRequest, 429: QueueFull, 503: Unavailable,
}


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
    cls = _BY_TYPE.get(type_) or _BY_STATUS.get(status) or (ServerError if status >= 500 else InferqError)
    return cls(status, type_, message, envelope, retry_after_s)
