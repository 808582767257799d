"""The hand-written hot path of the two busiest routes, submit (``POST /v1/jobs``) and get (``GET /v1/jobs/{id}``).

:class:`HotApp` serves them from the top of the app, past every layer that does nothing for them: FastAPI's
telemetry wrapper (while no OpenTelemetry provider is configured), the server-error and body-limit layers, the
router's scan (two string tests instead), the per-request ``AsyncExitStack``s, the dependency resolution and
parameter models, the exception middleware's wrapping of ``send``, and Starlette's ``Request`` and ``Response``
objects: the common, valid request is read from the raw ASGI scope, handed to the same code the routes run
(:func:`.jobs.submit`, :func:`.jobs.get`), and the answer is written with two ``send`` calls.

It still runs every user middleware (:class:`.edge.Edge`: request id, the body bound, the access log) and the app's
exception handlers, so its answers, errors included, are the full stack's; anything unusual (an idempotency key of
the wrong length, a ``wait`` that is not a plain number) is declined before any side effect and takes the route's
own handler, which stays the reference (tests/integration/gateway/test_hotpath.py compares them request by request).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, NamedTuple

from fastapi import FastAPI
from fastapi.middleware.asyncexitstack import AsyncExitStackMiddleware
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from inferq import fastjson

from . import jobs
from .request_schemas import IDEMPOTENCY_KEY_MAX, MAX_WAIT_S

_PLAIN_WAIT_RE = re.compile(r"^(?:[0-9]|1[0-9]|20)(?:\.[0-9]{1,6})?$")
"""A ``wait`` the fast path parses itself (``float()`` and pydantic agree on these); anything else goes to FastAPI."""
_WAIT_QUERY_RE = re.compile(r"^wait=([^&]*)$")
"""The one query the fast path reads itself: ``wait=`` alone (repeated, or with others, the route reads it)."""

TELEMETRY_RECHECK_S = 1.0
"""How long :class:`HotApp` keeps FastAPI's answer that no OpenTelemetry provider is configured."""

SUBMIT_PATH = "/v1/jobs"
JOB_PATH = "/v1/jobs/"
_WANTED = frozenset({b"authorization", b"x-api-key", b"idempotency-key", b"traceparent"})

Serve = Callable[[Scope, Receive], Awaitable["jobs.Answer | None"]]


class HotRoute(NamedTuple):
    route: APIRoute
    serve: Serve


def _headers(scope: Scope) -> dict[bytes, str]:
    """The request headers the hot path reads, each its first value, decoded as Starlette decodes them."""
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in _WANTED and name not in found:
            found[name] = value.decode("latin-1")
    return found


async def _body(receive: Receive) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    while message.get("more_body", False):  # Edge replays the body whole: one message
        message = await receive()
        body += message.get("body", b"")
    return body


def submit_serve(gw: Any) -> Serve:
    async def serve(scope: Scope, receive: Receive) -> jobs.Answer | None:
        headers = _headers(scope)
        idempotency_key = headers.get(b"idempotency-key")
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= IDEMPOTENCY_KEY_MAX:
            return None  # FastAPI's 422, after authentication
        tenant = await gw.tenant_from(headers.get(b"authorization"), headers.get(b"x-api-key"), scope["state"])
        return await jobs.submit(gw, tenant, await _body(receive), idempotency_key, headers.get(b"traceparent"))

    return serve


def get_serve(gw: Any) -> Serve:
    async def serve(scope: Scope, receive: Receive) -> jobs.Answer | None:
        wait = 0.0
        query = scope.get("query_string")
        if query:
            match = _WAIT_QUERY_RE.match(query.decode("latin-1"))
            if match is None or not _PLAIN_WAIT_RE.match(match.group(1)):
                return None  # FastAPI's reading (or its 422), after authentication
            wait = float(match.group(1))
            if wait > MAX_WAIT_S:
                return None
        headers = _headers(scope)
        tenant = await gw.tenant_from(headers.get(b"authorization"), headers.get(b"x-api-key"), scope["state"])
        return await jobs.get(gw, tenant, scope["path"][len(JOB_PATH):], wait)

    return serve


class HotApp(FastAPI):
    """FastAPI, with submit and get served from the top of the app (see the module's docstring).

    A request takes the hot path when it is ``POST /v1/jobs`` or ``GET /v1/jobs/{id}`` (the routes the router itself
    would pick: checked when the hot stack is built, and otherwise the hot path is off), the app has no root path and
    no OpenTelemetry provider is configured (with one, every request takes the full stack and gets its spans).
    No handler for 500 or ``Exception`` may be registered: only the full stack's server-error layer runs those.
    """

    hot_paths = True
    """Off: every request takes the full stack (tests compare the two)."""

    _hot_stack: ASGIApp | None = None
    _hot_submit: HotRoute | None = None
    _hot_get: HotRoute | None = None
    _hot_handlers: tuple[dict[Any, Any], dict[int, Any]] = ({}, {})
    _telemetry_off_until = 0.0
    telemetry_clock: Callable[[], float] = staticmethod(time.monotonic)
    """The clock the kept "no" runs on (a test sets one it moves by hand)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hot_paths and scope["type"] == "http" and not self.root_path and not scope.get("root_path"):
            hot = self._hot_route(scope["method"], scope["path"])
            if hot is not None and "fastapi.telemetry" not in scope and not self._telemetry_enabled():
                stack = self._hot_stack or self._build_hot_stack()
                if stack is not None:
                    scope["app"] = self
                    scope["inferq.hot"] = hot
                    await stack(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)

    def _hot_route(self, method: str, path: str) -> HotRoute | None:
        if method == "POST":
            return self._hot_submit if path == SUBMIT_PATH else None
        if method == "GET" and path.startswith(JOB_PATH) and len(path) > len(JOB_PATH) \
                and "/" not in path[len(JOB_PATH):]:
            return self._hot_get
        return None

    def serve_hot(self, submit: Serve, get: Serve) -> None:
        """Serve the routes named ``submit_job`` and ``get_job`` from the hot path with these."""
        by_name = {r.name: r for r in api_routes(self.router.routes)}
        self._hot_submit = HotRoute(by_name["submit_job"], submit)
        self._hot_get = HotRoute(by_name["get_job"], get)

    def _telemetry_enabled(self) -> bool:
        """FastAPI's own check (is an OpenTelemetry provider configured?), which looks the global providers up each
        time: a "no" is kept for ``TELEMETRY_RECHECK_S``, so a provider set up while the app runs (a global one is
        set once) is found within that; a "yes" is asked again every time, as FastAPI does."""
        telemetry = getattr(self, "_native_telemetry", None)
        if telemetry is None or self.telemetry_clock() < self._telemetry_off_until:
            return False
        if telemetry.enabled():
            return True
        self._telemetry_off_until = self.telemetry_clock() + TELEMETRY_RECHECK_S
        return False

    def _build_hot_stack(self) -> ASGIApp | None:
        handlers = dict(self.exception_handlers)
        if 500 in handlers or Exception in handlers or not self._routed_as_hot():
            self.hot_paths = False
            return None
        self._hot_handlers = ({k: v for k, v in handlers.items() if not isinstance(k, int)},
                              {k: v for k, v in handlers.items() if isinstance(k, int)})
        app: ASGIApp = _serve_hot
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        self._hot_stack = app
        return app

    def _routed_as_hot(self) -> bool:
        """Whether the router picks the hot routes for the requests the hot path takes."""
        for hot, method, path in ((self._hot_submit, "POST", SUBMIT_PATH), (self._hot_get, "GET", JOB_PATH + "x")):
            if hot is None or _first_match(list(api_routes(self.router.routes)), method, path) is not hot.route:
                return False
        return True


def api_routes(routes: Sequence[BaseRoute]) -> Iterator[APIRoute]:
    """The FastAPI routes among ``routes``, those of included routers in their place: the order the router tries
    them in."""
    for context in iter_route_contexts(routes):
        if isinstance(context.original_route, APIRoute):
            yield context.original_route


def _first_match(candidates: Sequence[BaseRoute], method: str, path: str) -> BaseRoute | None:
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    for route in candidates:
        if route.matches(scope)[0] is Match.FULL:
            return route
    return None


def _class_handler(handlers: dict[Any, Any], exc: Exception) -> Any:
    """The handler registered for the nearest class of ``exc``'s MRO, as Starlette's exception middleware picks it."""
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None


async def _serve_hot(scope: Scope, receive: Receive, send: Send) -> None:
    app: HotApp = scope["app"]
    hot: HotRoute = scope["inferq.hot"]
    scope.setdefault("state", {})
    try:
        answer = await hot.serve(scope, receive)
    except Exception as exc:  # the app's handlers, as the exception middleware would pick them
        classes, statuses = app._hot_handlers
        handler: Any = statuses.get(exc.status_code) if isinstance(exc, HTTPException) else None
        handler = handler or _class_handler(classes, exc)
        if handler is None:
            raise
        response = await handler(Request(scope, receive, send), exc)  # every handler of the app is async
        await response(scope, receive, send)
        return
    if answer is None:  # declined before any side effect: the route's own handler, as the router would call it
        scope["starlette.exception_handlers"] = app._hot_handlers  # what the exception middleware would have set
        scope.update(hot.route.matches(scope)[1])
        await AsyncExitStackMiddleware(hot.route.handle)(scope, receive, send)
        return
    scope["state"]["job_id"] = answer.job_id
    body = fastjson.dumps(answer.api, allow_nan=False)
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (answer.headers or {}).items()]
    headers += [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    if answer.after is not None:
        await answer.after()
