"""The hand-written hot path of the two busiest routes, submit and get, at two levels.

- :class:`HotRoute`: the common, valid request read straight from the raw request, skipping FastAPI's dependency
  resolution and parameter models. Measured the way Lambda runs the gateway (one request per invocation through
  Mangum), it takes about a third off a get and a quarter off a submit; anything unusual returns None before any
  side effect and takes FastAPI's path, which stays the reference.
- :class:`HotApp`: the app serves those fast paths from its top, past the layers that do nothing for them (FastAPI's
  telemetry wrapper while no OpenTelemetry provider is configured, the server-error and body-limit layers, the
  router's scan, three ``AsyncExitStack``s per request): about 8% fewer Python calls per submit or get. It runs the
  user middleware (:class:`.edge.Edge`) and the app's exception handlers as the full stack does, so the answers are
  the same (tests/integration/gateway/test_hotpath.py compares them request by request).
"""

import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import BackgroundTasks, FastAPI, Request
from fastapi.middleware.asyncexitstack import AsyncExitStackMiddleware
from fastapi.routing import APIRoute
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

from .models import IDEMPOTENCY_KEY_MAX, MAX_WAIT_S

_PLAIN_WAIT_RE = re.compile(r"^(?:[0-9]|1[0-9]|20)(?:\.[0-9]{1,6})?$")
"""A ``wait`` the fast path parses itself (``float()`` and pydantic agree on these); anything else goes to FastAPI."""

FastPath = Callable[[Request], Awaitable[Response | None]]

TELEMETRY_RECHECK_S = 1.0
"""How long :class:`HotApp` keeps FastAPI's answer that no OpenTelemetry provider is configured."""


class HotRoute(APIRoute):
    """An :class:`APIRoute` whose endpoint may have a hand-written fast path (``endpoint.fast_path``): it reads the
    common, valid request straight from the raw request (no dependency resolution, no parameter models) and
    returns None, before any side effect, for anything else, which then takes FastAPI's path. The endpoint's
    signature still defines the OpenAPI operation (security schemes, headers, query)."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:  # type: ignore[override]
        slow = super().get_route_handler()
        fast: FastPath | None = getattr(self.endpoint, "fast_path", None)
        if fast is None:
            return slow

        async def handler(request: Request) -> Response:
            response = await fast(request)
            return response if response is not None else await slow(request)

        return handler


def fast_path(make: Callable[[Any], FastPath]) -> Callable[[Any], Any]:
    """Give an endpoint a fast path, made from the endpoint itself (the fast path ends by calling it)."""

    def mark(endpoint: Any) -> Any:
        endpoint.fast_path = make(endpoint)
        return endpoint

    return mark


def submit_job_fast(gw: Any, submit_job: Any) -> FastPath:
    async def fast(request: Request) -> Response | None:
        headers = request.headers
        idempotency_key = headers.get("idempotency-key")
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= IDEMPOTENCY_KEY_MAX:
            return None  # FastAPI's 422, after authentication
        tenant = await gw.tenant_of(request)
        background = BackgroundTasks()
        response = await submit_job(request, background, tenant, idempotency_key, headers.get("traceparent"))
        if response.background is None and background.tasks:
            response.background = background
        return response

    return fast


def get_job_fast(gw: Any, get_job: Any) -> FastPath:
    async def fast(request: Request) -> Response | None:
        wait = 0.0
        if request.scope.get("query_string"):
            raw = request.query_params.get("wait")
            if raw is not None:
                if not _PLAIN_WAIT_RE.match(raw):
                    return None  # FastAPI's 422 (or its reading of an odd number), after authentication
                wait = float(raw)
                if wait > MAX_WAIT_S:
                    return None
        tenant = await gw.tenant_of(request)
        return await get_job(request, request.path_params["job_id"], tenant, wait)

    return fast


class HotApp(FastAPI):
    """FastAPI, with the fast paths of :class:`HotRoute` served from the top of the app.

    A request whose route (the first that fully matches, as the router picks it) has a fast path skips the layers
    between the server and the route that do nothing for it: FastAPI's native-telemetry wrapper (taken only while
    no OpenTelemetry provider is configured: with one, every request takes the full stack and gets its spans),
    ``ServerErrorMiddleware`` (our :class:`.edge.Edge` already answers an unhandled error with the 500 envelope, and
    no 500 handler is registered), the body-limit layer (FastAPI's own ``max_body_size`` is not set), the router's
    scan, the per-request ``AsyncExitStack``s and the route's parameter models. It still runs every user middleware
    (:class:`.edge.Edge`: request id, the body bound, the access log) and the app's exception handlers, so its
    answers, errors included, are the full stack's. Anything the fast path declines takes the route's own handler.
    """

    hot_paths = True
    """Off: every request takes the full stack (tests compare the two)."""

    _hot_stack: ASGIApp | None = None
    _telemetry_off_until = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hot_paths and scope["type"] == "http" and "fastapi.telemetry" not in scope:
            if self.root_path:
                scope["root_path"] = self.root_path
            route, child = _hot_route(self.router.routes, scope)
            if route is not None and not self._telemetry_enabled():
                stack = self._hot_stack or self._build_hot_stack()
                if stack is not None:
                    scope.update(child)
                    scope["app"] = self
                    scope.setdefault("router", self.router)
                    await stack(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)

    def _telemetry_enabled(self) -> bool:
        """FastAPI's own check (is an OpenTelemetry provider configured?), which looks the global providers up each
        time: a "no" is kept for ``TELEMETRY_RECHECK_S``, so a provider set up while the app runs (a global one is
        set once) is found within that; a "yes" is asked again every time, as FastAPI does."""
        telemetry = getattr(self, "_native_telemetry", None)
        if telemetry is None or time.monotonic() < self._telemetry_off_until:
            return False
        if telemetry.enabled():
            return True
        self._telemetry_off_until = time.monotonic() + TELEMETRY_RECHECK_S
        return False

    def _build_hot_stack(self) -> ASGIApp | None:
        handlers = dict(self.exception_handlers)
        if 500 in handlers or Exception in handlers:  # ServerErrorMiddleware's: only the full stack runs them
            self.hot_paths = False
            return None
        app: ASGIApp = ExceptionMiddleware(_serve_hot, handlers=handlers, debug=self.debug)
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        self._hot_stack = app
        return app


def _hot_route(routes: list[BaseRoute], scope: Scope) -> tuple[BaseRoute | None, Scope]:
    """The route the router would pick, when it has a fast path."""
    for route in routes:
        match, child = route.matches(scope)
        if match is Match.FULL:
            if getattr(getattr(route, "endpoint", None), "fast_path", None) is None:
                break
            return route, child
    return None, {}


async def _serve_hot(scope: Scope, receive: Receive, send: Send) -> None:
    route = scope["route"]
    response = await route.endpoint.fast_path(Request(scope, receive, send))
    if response is None:  # declined before any side effect: the route's own handler, as the router would call it
        await AsyncExitStackMiddleware(route.handle)(scope, receive, send)
        return
    await response(scope, receive, send)
