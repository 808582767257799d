"""HTTP API v1 (docs/api.md) on FastAPI: :func:`create_app` builds it from settings, or from injected parts.

Every Redis call is bounded twice: by the client's socket timeout (``INFERQ_REDIS_TIMEOUT_S``) and by a wall-clock
``asyncio.timeout`` of that plus one second around the whole call (retries included), so a frozen or unreachable
server is a prompt 503, never a hang (G8). Authentication runs before the body is parsed, so an unauthenticated
caller learns nothing about validation.
"""

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Depends, FastAPI, Header, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.responses import Response

from inferq import __version__
from inferq.jobs import Job, JobRequest
from inferq.queue import Queue
from inferq.settings import Settings

from . import batches, console, errors, events, files
from .auth import KeyStore, StaticKeys, key_store
from .clients import QueueProvider
from .edge import Edge
from .errors import ApiError
from .models import (
    ALLOW_PRIVATE,
    JOB_CREATE_EXAMPLE,
    ErrorEnvelope,
    Health,
    JobConflict,
    JobCreate,
    JobList,
    JobObject,
    ScaleView,
)
from .telemetry import Telemetry
from .wake import HttpWaker, LambdaWaker, WakeOnEnqueue, Waker

JOB_ID_RE = re.compile(r"^job_[a-z2-7]{26}$")
TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
MAX_WAIT_S = 20.0
IDEMPOTENCY_KEY_MAX = 255
_PLAIN_WAIT_RE = re.compile(r"^(?:[0-9]|1[0-9]|20)(?:\.[0-9]{1,6})?$")
"""A ``wait`` the fast path parses itself (``float()`` and pydantic agree on these); anything else goes to FastAPI."""
KEYS_TIMEOUT_S = 8.0

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <key>`")
_api_key = APIKeyHeader(name="x-api-key", auto_error=False, description="`x-api-key: <key>`")


def _doc(model: str, description: str, **headers: str) -> dict[str, Any]:
    """A documented response by schema name; the schemas are added when the OpenAPI document is first built, so
    no response model is compiled at import (FastAPI's ``responses={..: {"model": ..}}`` would)."""
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}},
    }
    if headers:
        response["headers"] = {
            name: {"description": text, "schema": {"type": "string"}} for name, text in headers.items()
        }
    return response


_ERRORS = {
    400: "Malformed request (e.g. an invalid Content-Length, a body that cannot be decoded)",
    401: "Missing or unknown API key",
    404: "Unknown job, or another tenant's",
    409: "Conflict",
    413: "Body above INFERQ_MAX_BODY_BYTES",
    422: "Invalid request",
    429: "Unfinished jobs reached INFERQ_MAX_QUEUE_DEPTH",
    503: "Redis unreachable (on submit the outcome is unknown: retry with the same Idempotency-Key)",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {
        code: _doc("ErrorEnvelope", _ERRORS[code], **({"Retry-After": "Seconds to wait"} if code in (429, 503) else {}))
        for code in codes
    }


DOC_MODELS = (JobCreate, JobObject, ErrorEnvelope, JobConflict, JobList, ScaleView, Health)


class Gateway:
    """What the routes share: settings, the lazily created queue client, keys, wake-up and telemetry."""

    def __init__(
        self,
        settings: Settings,
        queues: QueueProvider,
        keys: KeyStore,
        wake: WakeOnEnqueue,
        telemetry: Telemetry,
    ) -> None:
        self.settings = settings
        self.queues = queues
        self.keys = keys
        self.wake = wake
        self.telemetry = telemetry
        self.op_timeout_s = settings.redis_timeout_s + 1.0
        self._keys_in_memory = type(keys) is StaticKeys

    @property
    def queue(self) -> Queue:
        return self.queues.get()

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
        """The dependency: documents both schemes in OpenAPI; :meth:`tenant_of` does the same from the raw headers."""
        return await self._tenant(request, credentials.credentials if credentials is not None else api_key)

    async def tenant_of(self, request: Request) -> str:
        """:meth:`authenticate` without FastAPI's dependency machinery: the key read exactly as ``HTTPBearer`` and
        ``APIKeyHeader`` (``auto_error=False``) read it."""
        headers = request.headers
        authorization = headers.get("authorization")
        scheme, credentials = get_authorization_scheme_param(authorization)
        if authorization and scheme and credentials and scheme.lower() == "bearer":
            return await self._tenant(request, credentials)
        return await self._tenant(request, headers.get("x-api-key") or None)

    async def _tenant(self, request: Request, key: str | None) -> str:
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
        request.state.tenant = tenant
        return tenant

    def after_enqueue(self, background: BackgroundTasks) -> None:
        if self.wake.due():
            background.add_task(self.wake.check, self.queue)

    async def aclose(self) -> None:
        await self.queues.aclose()


def job_response(request: Request, job: Job, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    request.state.job_id = job.id
    return JSONResponse(job.to_api(), status, headers=headers)


def _job_id(job_id: str) -> str:
    # Anything that is not one of our ids is unknown: no Redis lookup, and no odd strings in key names.
    if not JOB_ID_RE.match(job_id):
        raise ApiError(404, "no such job")
    return job_id


def _parse_job_request(raw: bytes, allow_private_webhooks: bool) -> JobCreate:
    try:
        return JobCreate.model_validate_json(raw or b"null", context={ALLOW_PRIVATE: allow_private_webhooks})
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors(include_input=False, include_url=False)]
        ) from None


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


def _fast_path(fast: FastPath) -> Callable[[Any], Any]:
    def mark(endpoint: Any) -> Any:
        endpoint.fast_path = fast
        return endpoint

    return mark


def _routes(gw: Gateway, router: APIRouter) -> None:
    """The API's routes, on ``router`` (the app's own: an included router would add a dispatch layer per request)."""
    router.route_class = HotRoute
    Tenant = Annotated[str, Depends(gw.authenticate)]

    async def submit_job_fast(request: Request) -> Response | None:
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

    async def get_job_fast(request: Request) -> Response | None:
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

    @router.post(
        "/v1/jobs",
        status_code=202,
        summary="Submit a job",
        response_model=None,
        responses={
            202: _doc("JobObject", "Accepted", Location="/v1/jobs/{id}"),
            200: _doc(
                "JobObject",
                "Idempotent replay: the job first created with this key, as it is now",
                **{"Idempotent-Replayed": "true", "Location": "/v1/jobs/{id}"},
            ),
            **_errors(400, 401, 409, 413, 422, 429, 503),
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"$ref": "#/components/schemas/JobCreate"},
                        "examples": {"chat": {"summary": "A chat completion", "value": JOB_CREATE_EXAMPLE}},
                    }
                },
            }
        },
    )
    @_fast_path(submit_job_fast)
    async def submit_job(
        request: Request,
        background: BackgroundTasks,
        tenant: Tenant,
        idempotency_key: Annotated[
            str | None,
            Header(alias="Idempotency-Key", min_length=1, max_length=IDEMPOTENCY_KEY_MAX,
                   description="Same as `idempotency_key` in the body; both given must be equal"),
        ] = None,
        traceparent: Annotated[str | None, Header(description="W3C trace context, passed to the worker")] = None,
    ) -> JSONResponse:
        payload = _parse_job_request(await request.body(), gw.settings.webhook_allow_private)
        key = payload.idempotency_key
        if idempotency_key is not None:
            if key is not None and key != idempotency_key:
                raise ApiError(422, "the Idempotency-Key header and body.idempotency_key differ")
            key = idempotency_key
        job_request = JobRequest(
            body=payload.body,
            url=payload.url,
            metadata=payload.metadata,
            timeout_s=payload.timeout_s,
            ttl_s=payload.ttl_s,
            webhook_url=payload.webhook_url,
            idempotency_key=key,
            traceparent=traceparent if traceparent and TRACEPARENT_RE.match(traceparent) else None,
        )
        job, replayed = await gw.call(gw.queue.enqueue(tenant, job_request))
        headers = {"Location": f"/v1/jobs/{job.id}"}
        if replayed:
            gw.telemetry.count("IdempotentReplays")
            return job_response(request, job, 200, {**headers, "Idempotent-Replayed": "true"})
        gw.telemetry.count("JobsEnqueued")
        gw.after_enqueue(background)
        return job_response(request, job, 202, headers)

    @router.get(
        "/v1/jobs/{job_id}",
        summary="Get a job, optionally waiting for it to finish",
        response_model=None,
        responses={200: _doc("JobObject", "The job"), **_errors(400, 401, 404, 413, 422, 503)},
    )
    @_fast_path(get_job_fast)
    async def get_job(
        request: Request,
        job_id: str,
        tenant: Tenant,
        wait: Annotated[
            float,
            Query(ge=0, le=MAX_WAIT_S, description="Seconds to wait for a terminal state (returns at once when "
                                                   "the job ends)"),
        ] = 0,
    ) -> JSONResponse:
        _job_id(job_id)
        if wait > 0:
            job = await gw.call(gw.queue.wait(job_id, tenant, wait), extra_s=wait)
        else:
            job = await gw.call(gw.queue.get(job_id, tenant))
        if job is None:
            raise ApiError(404, "no such job")
        return job_response(request, job)

    @router.post(
        "/v1/jobs/{job_id}/cancel",
        summary="Cancel a job",
        response_model=None,
        responses={
            200: _doc("JobObject", "Cancelled (queued) or cancellation requested (running)"),
            409: _doc("JobConflict", "Already terminal; the job is in `job`"),
            **_errors(400, 401, 404, 413, 422, 503),
        },
    )
    async def cancel_job(request: Request, job_id: str, tenant: Tenant) -> JSONResponse:
        _job_id(job_id)
        job = await gw.call(gw.queue.cancel(tenant, job_id))
        return job_response(request, job)

    @router.get(
        "/v1/dlq",
        summary="List the tenant's dead-lettered jobs, newest first",
        response_model=None,
        responses={200: _doc("JobList", "Dead-lettered jobs"), **_errors(400, 401, 413, 422, 503)},
    )
    async def list_dead_letters(
        tenant: Tenant, limit: Annotated[int, Query(ge=1, le=1000, description="At most this many jobs")] = 20
    ) -> JSONResponse:
        jobs = await gw.call(gw.queue.dead_letters(tenant, limit))
        return JSONResponse({"object": "list", "data": [job.to_api() for job in jobs]})

    @router.post(
        "/v1/dlq/{job_id}/redrive",
        status_code=202,
        summary="Queue a dead-lettered job again, attempts reset",
        response_model=None,
        responses={
            202: _doc("JobObject", "Queued again", Location="/v1/jobs/{id}"),
            409: _doc("ErrorEnvelope", "The job is not dead-lettered"),
            **_errors(400, 401, 404, 413, 422, 503),
        },
    )
    async def redrive_job(request: Request, background: BackgroundTasks, job_id: str, tenant: Tenant) -> JSONResponse:
        _job_id(job_id)
        job = await gw.call(gw.queue.redrive(tenant, job_id))
        gw.after_enqueue(background)
        return job_response(request, job, 202, {"Location": f"/v1/jobs/{job.id}"})

    @router.get(
        "/v1/scale",
        summary="The scaler's view of the queue",
        response_model=None,
        responses={200: _doc("ScaleView", "Queue depth, workers and the last decision"),
                   **_errors(400, 401, 413, 422, 503)},
    )
    async def scale(tenant: Tenant) -> JSONResponse:
        seen = await gw.call(gw.queue.observe())
        return JSONResponse(
            {
                "lag": seen.lag,
                "pending": seen.pending,
                "unfinished": seen.unfinished,
                "dlq": seen.dlq,
                "workers": seen.workers,
                "desired": seen.desired,
                "decision": {"reason": seen.reason or None, "at": seen.decided_at},
            }
        )

    @router.get("/healthz", summary="Liveness (no auth)", response_model=None,
                responses={200: _doc("Health", "The process answers"), **_errors(400, 413)})
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @router.get(
        "/readyz",
        summary="Readiness: Redis answers (no auth)",
        response_model=None,
        responses={200: _doc("Health", "Ready"), **_errors(400, 413, 503)},
    )
    async def readyz() -> JSONResponse:
        await gw.call(gw.queue.ping())
        return JSONResponse({"status": "ready"})


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
) -> FastAPI:
    """The gateway app. ``settings`` default to the environment (a bad value raises ``SettingsError`` naming the
    variable); ``queue`` (a connected :class:`Queue`), ``waker`` (an async callable) and ``keys`` (a key store or
    ``{key: tenant}``) replace what the settings would build. No client is opened here."""
    settings = settings or Settings.from_env()
    telemetry = Telemetry(level=settings.log_level)
    gw = Gateway(
        settings,
        QueueProvider(settings, queue),
        key_store(settings, keys),
        WakeOnEnqueue(waker if waker is not None else default_waker(settings), telemetry),
        telemetry,
    )
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await gw.aclose()  # uvicorn's shutdown; Mangum runs with lifespan="off" and the sandbox just ends

    app = FastAPI(
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
    _routes(gw, app.router)
    console.install(gw, app.router)
    for module in (files, batches, events):  # Files/Uploads, Batches, the results feed: routes in their own modules
        module.routes(gw, app.router)
    app.add_middleware(Edge, max_body_bytes=settings.max_body_bytes, telemetry=telemetry,
                       max_upload_bytes=settings.max_upload_bytes)

    def openapi() -> dict[str, Any]:
        # Built on first request, not at import: the schema costs more than the app does to start.
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes,
                description="Every error is `{\"error\": {\"type\", \"message\"}}`. Auth: `Authorization: Bearer "
                            "<key>` or `x-api-key: <key>`.",
            )
            # FastAPI sees no model (the submit body is parsed by hand, after auth; responses are named by
            # reference): add their schemas here.
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in DOC_MODELS:
                model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                for name, sub in model_schema.pop("$defs", {}).items():
                    components.setdefault(name, sub)
                components[model.__name__] = model_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
