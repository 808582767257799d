"""The job routes of HTTP API v1 (docs/api.md): submit, get (with wait), cancel, the dead-letter queue, the scale
view and the health checks. Their OpenAPI responses come from :mod:`.openapi`; submit and get also have the
hand-written fast path of :mod:`.hotpath`."""

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from inferq.config.registry import ALIAS_RE
from inferq.queue.engine_body import BodyError, check_body
from inferq.queue.jobs import Job, JobRequest, JobStatus, Priority

from .errors import ApiError
from .models import (
    ALLOW_PRIVATE,
    IDEMPOTENCY_KEY_MAX,
    JOB_CREATE_EXAMPLE,
    MAX_WAIT_S,
    NO_SURROGATES,
    JobCreate,
    surrogate_free,
)
from .openapi import doc, errors
from .responses import JSONResponse
from .waits import wait_responses, wait_slot

if TYPE_CHECKING:
    from .shared import Gateway

JOB_ID_RE = re.compile(r"^job_[a-z2-7]{26}(?:_[A-Za-z0-9_-]{1,64})?$")
"""A job id; under a model registry it ends with its queue (``inferq.config.registry.queue_of_job``)."""
TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


@dataclass(frozen=True)
class Answer:
    """What submit or get answers: the status, the job object, headers, and what runs once it is sent (waking the
    fleet). The FastAPI routes and the hot path (:mod:`.hotpath`) send the same answer each their own way."""

    status: int
    job_id: str
    api: dict[str, Any]
    headers: dict[str, str] | None = None
    after: Callable[[], Awaitable[None]] | None = None


def answered(request: Request, answer: Answer) -> JSONResponse:
    request.state.job_id = answer.job_id
    return JSONResponse(answer.api, answer.status, headers=answer.headers)


async def submit(gw: "Gateway", tenant: str, raw: bytes, idempotency_key: str | None, traceparent: str | None
                 ) -> Answer:
    """POST /v1/jobs once authenticated: the body validated, stored in S3 first when large, the job enqueued (or
    replayed for its idempotency key)."""
    payload = _parse_job_request(raw, gw.settings.webhook_allow_private)
    try:
        check_body(payload.body, payload.url)  # what would crash or overload the engine is a 422 here
    except BodyError as exc:
        raise ApiError(422, str(exc)) from None
    if payload.priority is not None and not gw.settings.priority_allowed(tenant, Priority(payload.priority)):
        ceiling = gw.settings.max_priority_of(tenant).value
        raise ApiError(403, f"priority {payload.priority!r} is above this tenant's ceiling ({ceiling!r})",
                       type_="priority_not_allowed")
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
        priority=Priority(payload.priority) if payload.priority else gw.settings.priority_of(tenant),
    )
    queue = gw.model_queue(payload.body.get("model"))  # an unknown model is a 404 before anything is stored
    job_request = await gw.claims.check_in(tenant, job_request, len(raw))  # a large body goes to S3 first
    job, replayed = await gw.call(queue.enqueue(tenant, job_request))
    location = f"/v1/jobs/{job.id}"
    if replayed:
        gw.telemetry.count("IdempotentReplays")
        return Answer(200, job.id, gw.claims.by_url(job), {"Location": location, "Idempotent-Replayed": "true"})
    gw.telemetry.count("JobsEnqueued")
    return Answer(202, job.id, job.to_api(), {"Location": location}, gw.wake_check(queue))


async def get(gw: "Gateway", tenant: str, job_id: str, wait: float) -> Answer:
    """GET /v1/jobs/{id} once authenticated: the job as it is, or as soon as it ends within ``wait`` seconds."""
    queue = gw.job_queue(_job_id(job_id))
    if wait > 0:
        async with wait_slot(gw, tenant, wait):  # INFERQ_TENANT_MAX_WAITS: 429 past it
            waited = queue.wait(job_id, tenant, wait, shared=gw.shared_waits, with_body=False)
            job = await gw.call(waited, extra_s=wait)
    else:
        job = await gw.call(queue.get(job_id, tenant, with_body=False))  # the job object has no body
    if job is None:
        raise ApiError(404, "no such job")
    return Answer(200, job.id, await gw.claims.present(job))


def job_response(request: Request, job: Job, status: int = 200, headers: dict[str, str] | None = None,
                 api: dict[str, Any] | None = None) -> JSONResponse:
    """The job object (``api``: one already presented, a claimed result resolved)."""
    request.state.job_id = job.id
    return JSONResponse(api if api is not None else job.to_api(), status, headers=headers)


def _job_id(job_id: str) -> str:
    # Anything that is not one of our ids is unknown: no Redis lookup, and no odd strings in key names.
    if not JOB_ID_RE.match(job_id):
        raise ApiError(404, "no such job")
    return job_id


def _parse_job_request(raw: bytes, allow_private_webhooks: bool) -> JobCreate:
    try:
        return JobCreate.model_validate_json(raw or b"null", context={ALLOW_PRIVATE: allow_private_webhooks,
                                                                     NO_SURROGATES: surrogate_free(raw)})
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors(include_input=False, include_url=False)]
        ) from None


def routes(gw: "Gateway", router: APIRouter) -> None:
    """The API's routes, on ``router`` (the app's own: an included router would add a dispatch layer per request)."""
    Tenant = Annotated[str, Depends(gw.authenticate)]

    @router.post(
        "/v1/jobs",
        status_code=202,
        summary="Submit a job",
        response_model=None,
        responses={
            202: doc("JobObject", "Accepted", Location="/v1/jobs/{id}"),
            200: doc(
                "JobObject",
                "Idempotent replay: the job first created with this key, as it is now",
                **{"Idempotent-Replayed": "true", "Location": "/v1/jobs/{id}"},
            ),
            **errors(400, 401, 403, 409, 413, 422, 429, 503),
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
        answer = await submit(gw, tenant, await request.body(), idempotency_key, traceparent)
        if answer.after is not None:
            background.add_task(answer.after)
        return answered(request, answer)

    @router.get(
        "/v1/jobs/{job_id}",
        summary="Get a job, optionally waiting for it to finish",
        response_model=None,
        responses={200: doc("JobObject", "The job"), **errors(400, 401, 404, 413, 422, 503), **wait_responses()},
    )
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
        return answered(request, await get(gw, tenant, job_id, wait))

    @router.post(
        "/v1/jobs/{job_id}/cancel",
        summary="Cancel a job",
        response_model=None,
        responses={
            200: doc("JobObject", "Cancelled (queued) or cancellation requested (running)"),
            409: doc("JobConflict", "Already terminal; the job is in `job`"),
            **errors(400, 401, 404, 413, 422, 503),
        },
    )
    async def cancel_job(request: Request, job_id: str, tenant: Tenant) -> JSONResponse:
        queue = gw.job_queue(_job_id(job_id))
        # a claimed body is deleted when a cancel ends the job here (queued); the record's reference goes with
        # the terminal transition, so it is read first (a running job's worker deletes it when it ends it)
        before = await gw.call(queue.get(job_id, tenant)) if gw.claims.store is not None else None
        job = await gw.call(queue.cancel(tenant, job_id))
        if before is not None and job.status is JobStatus.CANCELLED:
            await gw.claims.drop_request_body(before)
        return job_response(request, job)

    @router.get(
        "/v1/dlq",
        summary="List the tenant's dead-lettered jobs, newest first",
        response_model=None,
        responses={200: doc("JobList", "Dead-lettered jobs"), **errors(400, 401, 413, 422, 503)},
    )
    async def list_dead_letters(
        tenant: Tenant, limit: Annotated[int, Query(ge=1, le=1000, description="At most this many jobs")] = 20
    ) -> JSONResponse:
        lists = await gw.call(asyncio.gather(*(q.dead_letters(tenant, limit) for q in gw.all_queues())))
        jobs = lists[0] if len(lists) == 1 else sorted(  # several models: merged, newest first
            (job for jobs in lists for job in jobs), key=lambda job: job.finished_at or 0.0, reverse=True)[:limit]
        return JSONResponse({"object": "list", "data": [job.to_api() for job in jobs]})

    @router.post(
        "/v1/dlq/{job_id}/redrive",
        status_code=202,
        summary="Queue a dead-lettered job again, attempts reset",
        response_model=None,
        responses={
            202: doc("JobObject", "Queued again", Location="/v1/jobs/{id}"),
            409: doc("ErrorEnvelope", "The job is not dead-lettered"),
            **errors(400, 401, 403, 404, 413, 422, 429, 503),
        },
    )
    async def redrive_job(request: Request, background: BackgroundTasks, job_id: str, tenant: Tenant) -> JSONResponse:
        queue = gw.job_queue(_job_id(job_id))
        job = await gw.call(queue.redrive(tenant, job_id, operator=gw.settings.is_admin(tenant),
                                          any_tenant=gw.settings.is_named_admin(tenant)))
        gw.after_enqueue(background, queue)
        return job_response(request, job, 202, {"Location": f"/v1/jobs/{job.id}"})

    @router.get(
        "/v1/scale",
        summary="The scaler's view of the queue",
        response_model=None,
        responses={200: doc("ScaleView", "Queue depth, workers and the last decision"),
                   **errors(400, 401, 403, 404, 413, 422, 503)},
    )
    async def scale(
        request: Request,
        tenant: Tenant,
        model: Annotated[str | None, Query(pattern=ALIAS_RE.pattern, description=(
            "A model's name or alias (a model registry): that model's queue; default: the default model's"))] = None,
    ) -> JSONResponse:
        gw.require_admin(tenant)  # queue-wide numbers: operators only
        if len(request.query_params.getlist("model")) > 1:  # FastAPI would take the last one silently
            raise ApiError(422, "model: give one model")
        queue = gw.queue if model is None else gw.model_queue(model)  # unknown: 404 model_not_found
        seen = await gw.call(queue.observe())
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
                responses={200: doc("Health", "The process answers"), **errors(400, 413)})
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @router.get(
        "/readyz",
        summary="Readiness: Redis, and S3 where a files bucket is set, answer (no auth)",
        response_model=None,
        responses={200: doc("Health", "Ready"), **errors(400, 413, 503)},
    )
    async def readyz() -> JSONResponse:
        await gw.call(gw.queue.ping())
        if gw.settings.files_bucket:  # every store the gateway needs: a missing bucket is not ready either
            from .files import file_store, in_s3

            await in_s3(file_store(gw).ready)
        return JSONResponse({"status": "ready"})
