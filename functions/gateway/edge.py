"""The outermost layer of the app (plain ASGI, before routing): request id, the body bound (413), the access log,
per-reason rejection counts for submits, and a last-resort 500 that still speaks the envelope.

The body bound is checked on ``Content-Length`` first (refused without reading a byte), then on the bytes
actually received (a chunked or lying client is cut off at the limit); the body is buffered here, never more than
``INFERQ_MAX_BODY_BYTES``, and replayed to the app. Nothing parses JSON before this check.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .errors import envelope
from .telemetry import Telemetry

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:=-]{1,128}$")


class RequestIds:
    """Request ids made here: 32 hex characters, a random 64-bit prefix of this process and a counter. Unique
    without a system call per request (``uuid4`` reads the kernel's random source each time); not secret, which a
    correlation id need not be. A forked child draws its own prefix."""

    def __init__(self) -> None:
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):016x}"


_request_ids = RequestIds()


def reseed_request_ids() -> None:
    """A fresh prefix for this process's request ids (a Lambda SnapStart restore: functions.gateway.snapstart)."""
    _request_ids.reseed()

_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})
SUBMIT_PATH = "/v1/jobs"
UPLOAD_PATH_RE = re.compile(r"^/v1/(?:files|uploads/[^/]+/(?:parts|complete))$")  # complete: up to 10,000 part ids
UPLOAD_FRAMING_BYTES = 64 * 1024
REJECT_REASONS = {
    400: "invalid",
    401: "unauthorized",
    409: "idempotency_conflict",
    413: "too_large",
    422: "invalid",
    429: "queue_full",
    503: "unavailable",
}


class Edge:
    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, telemetry: Telemetry, max_upload_bytes: int | None = None
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.telemetry = telemetry
        # file bodies (POST /v1/files, upload parts and their list) have their own bound, plus room for the framing
        self.max_upload_bytes = (max_upload_bytes or max_body_bytes) + UPLOAD_FRAMING_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        request_id = state["request_id"] = _request_id(scope)
        response: dict[str, Any] = {"status": 0}

        async def send_tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            replay = await self._bounded_body(scope, receive, send_tagged)
            if replay is not None:
                await self.app(scope, replay, send_tagged)
        except Exception:
            self.telemetry.logger.exception("unhandled error", extra={"request_id": request_id})
            if not response["status"]:
                await _send_json(send_tagged, 500, envelope("internal_error", "internal error"))
        finally:
            self._account(scope, state, response["status"], started)

    async def _bounded_body(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """The app's ``receive`` with the whole body buffered, or None when an answer (413, 400) was sent or
        the client left."""
        limit = self.max_upload_bytes if UPLOAD_PATH_RE.match(scope["path"]) else self.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                length = int(declared)
                if length < 0:
                    raise ValueError
            except ValueError:
                await _send_json(send, 400, envelope("bad_request", "invalid Content-Length"))
                return None
            if length > limit:
                await self._too_large(send, limit)
                return None
        if scope["method"] in _BODYLESS:
            return receive
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._too_large(send, limit)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay

    async def _too_large(self, send: Send, limit: int) -> None:
        await _send_json(send, 413, envelope("request_too_large", f"the request body exceeds {limit} bytes"))

    def _account(self, scope: Scope, state: dict[str, Any], status: int, started: float) -> None:
        if status >= 400:
            if scope["method"] == "POST" and scope["path"] == SUBMIT_PATH:
                self.telemetry.count("JobsRejected", REJECT_REASONS.get(status, "error"))
        elif not self.telemetry.logs_successes:
            return  # no access line for it at this level: nothing to build
        fields: dict[str, Any] = {
            "request_id": state.get("request_id"),
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "duration_ms": round((time.perf_counter() - started) * 1000, 2),
        }
        for key in ("tenant", "job_id", "lambda_request_id", "error"):
            if state.get(key):
                fields[key] = state[key]
        self.telemetry.access(status, fields)


def _header(scope: Scope, name: bytes) -> str | None:
    """A header's first value; ``name`` lower case, as ASGI servers (uvicorn, Mangum) give every header name."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _request_id(scope: Scope) -> str:
    """API Gateway's request id under Mangum, else a well-formed ``X-Request-Id``, else a new one."""
    event = scope.get("aws.event")
    if isinstance(event, dict):
        context = scope.get("aws.context")
        lambda_id = getattr(context, "aws_request_id", None)
        if lambda_id:
            scope["state"]["lambda_request_id"] = lambda_id
        api_id = (event.get("requestContext") or {}).get("requestId")
        if isinstance(api_id, str) and _REQUEST_ID_RE.match(api_id):
            return api_id
    given = _header(scope, b"x-request-id")
    if given and _REQUEST_ID_RE.match(given):
        return given
    return _request_ids.next()


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})
