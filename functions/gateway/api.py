"""HTTP API v1 (docs/api.md) on FastAPI: :func:`create_app` builds it from settings, or from injected parts, and
:class:`Gateway` is what every route shares. The routes live by concern: the job routes in :mod:`.routes` (their
hand-written fast path in :mod:`.hotpath`), Files/Uploads/Batches/events in their own modules, the console in
:mod:`.console`; the OpenAPI plumbing in :mod:`.openapi`, the outer ASGI layer in :mod:`.edge`.

Every Redis call is bounded twice: by the client's socket timeout (``INFERQ_REDIS_TIMEOUT_S``) and by a wall-clock
``asyncio.timeout`` of that plus one second around the whole call (retries included), so a frozen or unreachable
server is a prompt 503, never a hang (G8). Authentication runs before the body is parsed, so an unauthenticated
caller learns nothing about validation.
"""

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated, Any

from fastapi import BackgroundTasks, FastAPI, Request, Security
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from starlette.types import Receive, Scope, Send

from inferq import __version__
from inferq.config.registry import Registry, queue_of_job
from inferq.config.registry import load as load_registry
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue

from . import errors, openapi, routes
from .auth import KeyStore, StaticKeys, key_store
from .claims import Claims
from .clients import QueueProvider
from .edge import Edge
from .errors import ApiError
from .hotpath import HotApp, HotRoute, Serve, get_serve, submit_serve
from .telemetry import Telemetry
from .wake import HttpWaker, LambdaWaker, WakeOnEnqueue, Waker

KEYS_TIMEOUT_S = 8.0

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <key>`")
_api_key = APIKeyHeader(name="x-api-key", auto_error=False, description="`x-api-key: <key>`")


class Gateway:
    """What the routes share: settings, the lazily created queue clients (one per model of the registry), keys,
    wake-up and telemetry."""

    def __init__(
        self,
        settings: Settings,
        queues: QueueProvider,
        keys: KeyStore,
        wake: WakeOnEnqueue | Mapping[str, WakeOnEnqueue],
        telemetry: Telemetry,
    ) -> None:
        self.settings = settings
        self.queues = queues
        self.registry: Registry | None = queues.registry
        self.keys = keys
        self.wakes = dict(wake) if isinstance(wake, Mapping) else {queues.primary: wake}
        self.wake = self.wakes[queues.primary]
        self.telemetry = telemetry
        self.claims = Claims(settings)
        self.op_timeout_s = settings.redis_timeout_s + 1.0
        self._keys_in_memory = type(keys) is StaticKeys
        self.shared_waits = True
        """Long-poll waits share one reader of terminal events per queue (a long-lived process: uvicorn); the
        Lambda handler turns it off, since a frozen sandbox would stall a background reader (inferq.queue.waiters)."""

    @property
    def queue(self) -> Queue:
        """The primary queue: the only one without a registry; what is not per model with one."""
        return self.queues.get()

    def all_queues(self) -> list[Queue]:
        return [self.queues.get(name) for name in self.queues.names()]

    def model_queue(self, requested: Any) -> Queue:
        """The queue of the model ``body.model`` names (a name or an alias; absent: the registry's default). Without
        a registry every job goes to the one queue, whatever it names."""
        if self.registry is None:
            return self.queue
        if requested is not None and not isinstance(requested, str):
            raise ApiError(422, "body.model: must be a string")
        model = self.registry.resolve(requested)
        if model is None:
            if requested is None:
                raise ApiError(422, "body.model: required (this gateway serves several models and has no default)")
            raise ApiError(404, f"the model {requested[:128]!r} does not exist; GET /v1/models lists them",
                           type_="model_not_found")
        return self.queues.get(model.queue)

    def job_queue(self, job_id: str) -> Queue:
        """The queue a job id names (a registry's ids carry it); 404 when no queue of this gateway has that name."""
        queue = queue_of_job(job_id)
        if queue is None:
            return self.queue
        if self.registry is None or self.registry.by_queue(queue) is None:
            raise ApiError(404, "no such job")
        return self.queues.get(queue)

    async def call(self, awaitable: Any, extra_s: float = 0.0) -> Any:
        """One queue operation under the wall-clock bound."""
        async with asyncio.timeout(self.op_timeout_s + extra_s):
            return await awaitable

    async def authenticate(
        self,
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
        api_key: Annotated[str | None, Security(_api_key)],
    ) -> str:
        """The dependency: documents both schemes in OpenAPI; :meth:`tenant_from` does the same from the raw headers."""
        key = credentials.credentials if credentials is not None else api_key
        return await self._tenant(request.scope.setdefault("state", {}), key)

    async def tenant_from(self, authorization: str | None, api_key: str | None, state: dict[str, Any]) -> str:
        """:meth:`authenticate` without FastAPI's dependency machinery (the hot path): the key read from the raw
        headers exactly as ``HTTPBearer`` and ``APIKeyHeader`` (``auto_error=False``) read it; the tenant noted in
        the request's ``state`` (the access log)."""
        scheme, credentials = get_authorization_scheme_param(authorization)
        if authorization and scheme and credentials and scheme.lower() == "bearer":
            return await self._tenant(state, credentials)
        return await self._tenant(state, api_key or None)

    async def _tenant(self, state: dict[str, Any], key: str | None) -> str:
        tenant = None
        if key:
            if self._keys_in_memory:
                tenant = await self.keys.tenant_for(key)  # never suspends: no timeout to arm
            else:
                async with asyncio.timeout(KEYS_TIMEOUT_S):  # a Secrets Manager read on a cold start takes a while
                    tenant = await self.keys.tenant_for(key)
        if tenant is None:
            raise ApiError(
                401,
                "missing or unknown API key (Authorization: Bearer <key> or x-api-key)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        state["tenant"] = tenant
        if self.settings.rate_limit_per_s > 0:
            await self._take_rate(tenant)
        return tenant

    async def _take_rate(self, tenant: str) -> None:
        """429 with ``Retry-After`` past the tenant's rate limit (counted in Redis: shared by every gateway)."""
        settings = self.settings
        wait_s = await self.call(self.queue.take_rate(tenant, settings.rate_limit_per_s, settings.rate_limit_burst))
        if wait_s > 0:
            raise ApiError(429, f"rate limit of {settings.rate_limit_per_s:g} requests per second reached; retry "
                           f"in {wait_s:.3f} s", type_="rate_limited",
                           headers={"Retry-After": str(max(1, math.ceil(wait_s)))})

    def require_admin(self, tenant: str) -> None:
        """403 unless ``tenant`` is an operator (``INFERQ_ADMIN_TENANTS``): queue-wide numbers tell one tenant how
        busy the others are."""
        if not self.settings.is_admin(tenant):
            raise ApiError(403, "queue-wide numbers are for operator keys only (INFERQ_ADMIN_TENANTS)",
                           type_="operator_only")

    def wake_check(self, queue: Queue | None = None) -> Callable[[], Awaitable[None]] | None:
        """What wakes the fleet of ``queue`` (default: the primary one) if it is at zero, to run once the answer is
        sent; None when no check is due."""
        queue = queue or self.queue
        wake = self.wakes.get(queue.settings.queue, self.wake)
        return partial(wake.check, queue) if wake.due() else None

    def after_enqueue(self, background: BackgroundTasks, queue: Queue | None = None) -> None:
        """Wake the fleet of ``queue`` (default: the primary one) if it is at zero, once the answer is sent."""
        check = self.wake_check(queue)
        if check is not None:
            background.add_task(check)

    async def aclose(self) -> None:
        await self.queues.aclose()


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
        docs_url=None,  # G7: nothing but health and the API description answers without a key
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
    app.defer_routes(partial(_all_routes, gw, app))
    if not defer_routes:
        app.complete_routes()
    return app


def _all_routes(gw: Gateway, app: FastAPI) -> None:
    """The job routes first (the hot path's submit and get among them), then the console, Files/Uploads, Batches,
    the feed and /v1/models (own modules, imported here: a Lambda sandbox that only submits and gets never imports
    them, nor builds a FastAPI route)."""
    from . import batches, catalog, console, events, files, webhooks

    routes.routes(gw, app.router)
    console.install(gw, app.router)
    for module in (files, batches, events, catalog, webhooks):  # Files/Uploads, Batches, the feed, /v1/models, secrets
        module.routes(gw, app.router)


class _RouteToBuild:
    """The hot path's fallback route (a request it declines) while the routes are not built: builds them all, then
    answers as the real route does."""

    def __init__(self, app: "GatewayApp", name: str) -> None:
        self.app = app
        self.name = name

    def _real(self) -> APIRoute:
        self.app.complete_routes()
        return next(r for r in self.app.router.routes if isinstance(r, APIRoute) and r.name == self.name)

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
