"""Every error is ``{"error": {"type", "message"}}`` (docs/api.md): one exception type for the API's own
refusals, and handlers that turn FastAPI's, Starlette's, the queue's and Redis's exceptions into the envelope.

Redis errors follow the shared fault model (:mod:`inferq.redis.faults`): unreachable, frozen, failing over (TRANSIENT)
or full (CAPACITY, ``OOM``) is a 503 with ``Retry-After`` (G8); any other Redis error is a bug of ours, logged and
answered 500. A 503 on submit means the outcome is unknown (the command may have reached the server before it
stopped answering): clients retry with the same ``Idempotency-Key``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from redis import exceptions as redis_errors
from starlette.exceptions import HTTPException as StarletteHTTPException

from inferq.queue.protocol import (
    EngineCoolOff,
    IdempotencyConflict,
    JobNotFound,
    JobTerminal,
    NotDeadLettered,
    OperatorOnly,
    QueueFull,
    RetainedQuotaFull,
)
from inferq.redis.faults import Fault, classify

from .auth import KeysUnavailable
from .responses import JSONResponse

log = logging.getLogger(__name__)

RETRY_AFTER_UNAVAILABLE_S = 2
RETRY_AFTER_QUEUE_FULL_S = 5

_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "queue_full",
    500: "internal_error",
    503: "unavailable",
}

STORE_ERRORS: tuple[type[Exception], ...] = (
    redis_errors.RedisError,
    TimeoutError,  # asyncio.timeout() around every Redis call
    ConnectionError,  # a socket reset redis-py did not wrap
)
"""Exceptions of the backing store, answered by :func:`store_error_response` through the fault model."""


class ApiError(Exception):
    """A refusal of the API, rendered as the envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_ or _TYPES.get(status, "error")
        self.message = message
        self.headers = headers
        self.extra = extra


def envelope(type_: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"type": type_, "message": message}, **extra}


def error_response(
    status: int, message: str, *, type_: str | None = None, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse(envelope(type_ or _TYPES.get(status, "error"), message, **extra), status, headers=headers)


def unavailable_response(message: str = "the queue store is unavailable; retry later") -> JSONResponse:
    return error_response(503, message, headers={"Retry-After": str(RETRY_AFTER_UNAVAILABLE_S)})


def store_error_response(exc: BaseException) -> JSONResponse:
    """503 + ``Retry-After`` for a TRANSIENT or CAPACITY fault; a logged 500 for anything else (a bug: no request
    a client can send may lead here)."""
    fault = classify(exc)
    if fault is Fault.CAPACITY:
        log.warning("the queue store is full: %s", exc)
        return unavailable_response("the queue store is full; retry later")
    if fault is Fault.TRANSIENT:
        return unavailable_response()
    log.error("unexpected error from the queue store", exc_info=exc)
    return error_response(500, "internal error")


def describe_validation(errors: Iterable[Any], limit: int = 5) -> str:
    """``loc: msg`` for the first few errors. Never the offending input: it may be a prompt."""
    parts = []
    items = list(errors)
    for err in items[:limit]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__") or "request"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    if len(items) > limit:
        parts.append(f"... and {len(items) - limit} more")
    return "; ".join(parts) or "invalid request"


# The tenant bounds' refusals (G11): module-level, so install stays one screen.


async def retained_full(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RetainedQuotaFull)
    return error_response(
        429, "the records this key's ended jobs, batches and open uploads hold its quota "
             "(INFERQ_TENANT_MAX_RETAINED_BYTES); they expire with the result TTL: retry later", type_="quota_exceeded",
        headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))})


async def engine_cooloff(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EngineCoolOff)
    return error_response(
        429, "jobs of this key killed the model server too often (INFERQ_ENGINE_STRIKES); its submits to this "
             "model are refused until the cool-off ends", type_="engine_cooloff",
        headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))})


async def operator_only(request: Request, exc: Exception) -> JSONResponse:
    return error_response(403, "this job was dead-lettered because the model server died running it "
                               "(engine_died): only an operator key may redrive it (INFERQ_ADMIN_TENANTS)",
                          type_="operator_only")


def install(app: FastAPI) -> None:
    """Register the envelope handlers on ``app``."""

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc.status, exc.message, type_=exc.type, headers=exc.headers, **(exc.extra or {}))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        message = exc.detail if isinstance(exc.detail, str) else _TYPES.get(exc.status_code, "error")
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(422, describe_validation(exc.errors()))

    async def queue_full(request: Request, exc: Exception) -> JSONResponse:
        return error_response(
            429, "too many unfinished jobs; retry later", headers={"Retry-After": str(RETRY_AFTER_QUEUE_FULL_S)}
        )

    async def idempotency_conflict(request: Request, exc: Exception) -> JSONResponse:
        return error_response(
            409, "this idempotency key was already used with a different request", type_="idempotency_conflict"
        )

    async def job_not_found(request: Request, exc: Exception) -> JSONResponse:
        return error_response(404, "no such job")

    async def job_terminal(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, JobTerminal)
        return error_response(
            409, f"the job is already {exc.job.status.value}", type_="job_terminal",
            job=request.app.state.gateway.claim_check.by_url(exc.job)
        )

    async def not_dead_lettered(request: Request, exc: Exception) -> JSONResponse:
        return error_response(409, "the job is not dead-lettered", type_="not_dead_lettered")

    async def keys_unavailable(request: Request, exc: Exception) -> JSONResponse:
        request.scope.setdefault("state", {})["error"] = type(exc).__name__
        return unavailable_response()

    async def store_error(request: Request, exc: Exception) -> JSONResponse:
        request.scope.setdefault("state", {})["error"] = type(exc).__name__
        return store_error_response(exc)

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(QueueFull, queue_full)
    app.add_exception_handler(RetainedQuotaFull, retained_full)
    app.add_exception_handler(EngineCoolOff, engine_cooloff)
    app.add_exception_handler(IdempotencyConflict, idempotency_conflict)
    app.add_exception_handler(JobNotFound, job_not_found)
    app.add_exception_handler(JobTerminal, job_terminal)
    app.add_exception_handler(NotDeadLettered, not_dead_lettered)
    app.add_exception_handler(OperatorOnly, operator_only)
    app.add_exception_handler(KeysUnavailable, keys_unavailable)
    for exc_type in STORE_ERRORS:
        app.add_exception_handler(exc_type, store_error)
