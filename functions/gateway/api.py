"""HTTP API v1 (docs/api.md) on FastAPI: :func:`create_app` assembles the app from settings, or from injected parts.
What every route shares is :class:`.gateway.Gateway`, which the handlers get through :mod:`.dependencies`; the routes
live by concern in :mod:`.routers` (one ``APIRouter`` per module, its handlers module-level functions), which this
module includes and which never import it. Submit and get also have a hand-written fast path (:mod:`.hotpath`);
the OpenAPI plumbing is :mod:`.openapi`, the outer ASGI layer :mod:`.edge`.
"""

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from inferq import __version__
from inferq.config.registry import load as load_registry
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue

from . import errors, openapi
from .auth import KeyStore, key_store
from .clients import QueueProvider
from .edge import Edge
from .gateway import Gateway
from .hotpath import HotApp, HotRoute, Serve, api_routes, get_serve, submit_serve
from .telemetry import Telemetry
from .wake import HttpWaker, LambdaWaker, WakeOnEnqueue, Waker

__all__ = ["Gateway", "GatewayApp", "create_app", "default_waker"]


def default_waker(settings: Settings) -> Waker | None:
    if settings.scaler_function:
        return LambdaWaker(settings.scaler_function, settings.queue)
    if settings.scaler_wake_url:
        return HttpWaker(settings.scaler_wake_url, settings.queue)
    return None


def create_app(
    settings: Settings | None = None,
    *,
    queue: Queue | None = None,
    waker: Waker | None = None,
    keys: KeyStore | Mapping[str, str] | None = None,
    defer_routes: bool = False,
) -> FastAPI:
    """The gateway app. ``settings`` default to the environment (a bad value raises ``SettingsError`` naming the
    variable); ``queue`` (a connected :class:`Queue`), ``waker`` (an async callable) and ``keys`` (a key store or
    ``{key: tenant}``) replace what the settings would build. No client is opened here. ``defer_routes``: the
    routes other than the job routes are built on the first request that needs them (:class:`GatewayApp`)."""
    settings = settings or Settings.from_env()
    registry = load_registry(settings)  # a bad file stops the gateway here, naming INFERQ_MODELS
    telemetry = Telemetry(level=settings.log_level)
    fleets = [m.settings for m in registry.models] if registry else [settings]
    gw = Gateway(
        settings,
        QueueProvider(settings, queue, registry),
        key_store(settings, keys),
        {s.queue: WakeOnEnqueue(waker if waker is not None else default_waker(s), telemetry) for s in fleets},
        telemetry,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await gw.aclose()  # uvicorn's shutdown; Mangum runs with lifespan="off" and the sandbox just ends

    app = GatewayApp(
        lifespan=lifespan,
        title="inferq",
        version=__version__,
        summary="Asynchronous LLM inference: submit OpenAI-compatible requests as jobs, poll or wait for results.",
        docs_url=None,  # G7: nothing but health, the API description and the console's files answers without a key
        redoc_url=None,
        redirect_slashes=False,  # "/v1/jobs/" is 404 in the envelope, not an undocumented 307
    )
    app.state.gateway = gw
    app.state.telemetry = telemetry
    errors.install(app)
    app.serve_hot_deferred(submit_serve(gw), get_serve(gw))
    app.add_middleware(Edge, max_body_bytes=settings.max_body_bytes, telemetry=telemetry,
                       max_upload_bytes=settings.max_upload_bytes)
    openapi.install(app)
    document = app.openapi

    def openapi_of_every_route() -> dict[str, Any]:
        app.complete_routes()
        return document()

    app.openapi = openapi_of_every_route  # type: ignore[method-assign]
    app.defer_routes(partial(_include_routers, app))
    if not defer_routes:
        app.complete_routes()
    return app


def _include_routers(app: FastAPI) -> None:
    """Every router, the job routes first (the hot path's submit and get among them), in the order the OpenAPI
    document lists them. Imported here: a Lambda sandbox that only submits and gets never imports one, nor builds
    a FastAPI route."""
    from .routers import (
        batches,
        catalog,
        completions,
        console,
        dlq,
        events,
        files,
        jobs,
        operations,
        streams,
        uploads,
        usage,
        webhooks,
    )

    for module in (jobs, streams, dlq, operations, console, files, uploads, batches, events, catalog, webhooks, usage,
                   completions):
        app.include_router(module.router)


class _RouteToBuild:
    """The hot path's fallback route (a request it declines) while the routes are not built: builds them all, then
    answers as the real route does."""

    def __init__(self, app: "GatewayApp", name: str) -> None:
        self.app = app
        self.name = name

    def _real(self) -> APIRoute:
        self.app.complete_routes()
        return next(r for r in api_routes(self.app.router.routes) if r.name == self.name)

    def matches(self, scope: Scope) -> Any:
        return self._real().matches(scope)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._real().handle(scope, receive, send)


class GatewayApp(HotApp):
    """The gateway's app: :class:`HotApp`, whose routes may be built on the first request that needs them
    (:func:`create_app`'s ``defer_routes``: the Lambda, where a cold start pays for every route it builds, about a
    third of the module's import). Until then a hot submit or get is served by the hot path alone; any other request,
    or one the hot path would not take, builds them all first. Built, they are exactly what an eager app has."""

    _pending_routes: Callable[[], None] | None = None

    def serve_hot_deferred(self, submit: Serve, get: Serve) -> None:
        """Like :meth:`serve_hot`, before the routes exist: their stand-ins build them when first needed."""
        self._hot_submit = HotRoute(_RouteToBuild(self, "submit_job"), submit)  # type: ignore[arg-type]
        self._hot_get = HotRoute(_RouteToBuild(self, "get_job"), get)  # type: ignore[arg-type]

    def defer_routes(self, install: Callable[[], None]) -> None:
        self._pending_routes = install

    def complete_routes(self) -> None:
        """Build the routes now (the first request that needs them; the OpenAPI document; SnapStart's
        before-snapshot hook, so that restored sandboxes have them all) and hand the hot path the real ones."""
        install, self._pending_routes = self._pending_routes, None
        if install is None:
            return
        install()
        self.openapi_schema = None
        if self._hot_submit is not None and self._hot_get is not None:
            self.serve_hot(self._hot_submit.serve, self._hot_get.serve)
            if not super()._routed_as_hot():  # the check the hot stack makes when built, made now that it can be
                self.hot_paths = False

    def _routed_as_hot(self) -> bool:
        if self._pending_routes is not None:
            return True  # checked by complete_routes once they exist
        return super()._routed_as_hot()

    def _takes_hot_path(self, scope: Scope) -> bool:
        """What :meth:`HotApp.__call__` decides, asked before it: whether this request needs no route built."""
        return (self.hot_paths and scope["type"] == "http" and not self.root_path and not scope.get("root_path")
                and self._hot_route(scope["method"], scope["path"]) is not None and "fastapi.telemetry" not in scope
                and not self._telemetry_enabled())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._pending_routes is not None and not self._takes_hot_path(scope):
            self.complete_routes()
        await super().__call__(scope, receive, send)
