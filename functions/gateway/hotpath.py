"""The hand-written hot path of the two busiest routes, submit and get: the common, valid request read straight
from the raw request, skipping FastAPI's dependency resolution and parameter models. Measured the way Lambda runs
the gateway (one request per invocation through Mangum), it takes about a third off a get and a quarter off a
submit; anything unusual returns None before any side effect and takes FastAPI's path, which stays the reference.
"""

import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import BackgroundTasks, Request
from fastapi.routing import APIRoute
from starlette.responses import Response

from .models import IDEMPOTENCY_KEY_MAX, MAX_WAIT_S

_PLAIN_WAIT_RE = re.compile(r"^(?:[0-9]|1[0-9]|20)(?:\.[0-9]{1,6})?$")
"""A ``wait`` the fast path parses itself (``float()`` and pydantic agree on these); anything else goes to FastAPI."""

FastPath = Callable[[Request], Awaitable[Response | None]]


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
