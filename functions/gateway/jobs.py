"""Submit and get, the two busiest operations of HTTP API v1 (docs/api.md), as both of their callers run them: the
routes of :mod:`.routers.jobs` and the hand-written fast path of :mod:`.hotpath`. Each answers an :class:`Answer`,
which the caller sends its own way. Also the job id check every job route makes first."""

import functools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from inferq.config.settings import Settings
from inferq.queue.engine_body import BodyError, check_body
from inferq.queue.jobs import Job, JobRequest, Priority
from inferq.webhooks import netguard

from .errors import ApiError
from .metering import check_budget
from .request_schemas import (
    ALLOW_PRIVATE,
    NO_SURROGATES,
    WEBHOOK_BLOCKED,
    WEBHOOK_HOSTS,
    WEBHOOK_PORTS,
    JobCreate,
    surrogate_free,
)
from .responses import JSONResponse
from .waits import wait_slot

if TYPE_CHECKING:
    from .gateway import Gateway

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


@functools.cache
def _blocked_networks(cidrs: tuple[str, ...]) -> tuple[Any, ...]:
    return netguard.networks(cidrs)


def check_engine_body(gw: "Gateway", body: dict[str, Any], url: str, *, streaming: bool = False) -> None:
    """The body the engine receives, checked against what its endpoint takes (:func:`inferq.queue.engine_body.
    check_body`; ``guided_*`` rewritten in place): a 422 naming the field. Image parts only for a model the registry
    marks multimodal. ``streaming``: the OpenAI front door, where ``stream``/``stream_options`` are fields."""
    multimodal = gw.registry is not None and gw.registry.multimodal(body.get("model"))
    try:
        check_body(body, url, multimodal=multimodal, streaming=streaming)
    except BodyError as exc:  # what would crash or overload the engine is a 422 here, never queued
        raise ApiError(422, str(exc)) from None


async def submit(gw: "Gateway", tenant: str, raw: bytes, idempotency_key: str | None, traceparent: str | None
                 ) -> Answer:
    """POST /v1/jobs once authenticated: the body validated, stored in S3 first when large, the job enqueued (or
    replayed for its idempotency key)."""
    payload = _parse_job_request(raw, gw.settings)
    check_engine_body(gw, payload.body, payload.url)
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
        continuation=payload.continuation,
    )
    queue = gw.model_queue(payload.body.get("model"))  # an unknown model is a 404 before anything is stored
    await check_budget(gw, tenant, queue, key)  # past its monthly budget: 429 quota_exceeded, nothing stored
    job_request = await gw.claim_check.check_in(tenant, job_request, len(raw))  # a large body goes to S3 first
    job, replayed = await gw.call(queue.enqueue(tenant, job_request))
    location = f"/v1/jobs/{job.id}"
    if replayed:
        gw.telemetry.count("IdempotentReplays")
        return Answer(200, job.id, gw.claim_check.by_url(job), {"Location": location, "Idempotent-Replayed": "true"})
    gw.telemetry.count("JobsEnqueued")
    return Answer(202, job.id, job.to_api(), {"Location": location}, gw.wake_check(queue))


async def get(gw: "Gateway", tenant: str, job_id: str, wait: float) -> Answer:
    """GET /v1/jobs/{id} once authenticated: the job as it is, or as soon as it ends within ``wait`` seconds."""
    queue = gw.job_queue(job_id_or_404(job_id))
    if wait > 0:
        async with wait_slot(gw, tenant, wait):  # INFERQ_TENANT_MAX_WAITS: 429 past it
            waited = queue.wait(job_id, tenant, wait, shared=gw.shared_waits, with_body=False)
            job = await gw.call(waited, extra_s=wait)
    else:
        job = await gw.call(queue.get(job_id, tenant, with_body=False))  # the job object has no body
    if job is None:
        raise ApiError(404, "no such job")
    return Answer(200, job.id, await gw.claim_check.present(job))


def job_response(request: Request, job: Job, status: int = 200, headers: dict[str, str] | None = None,
                 api: dict[str, Any] | None = None) -> JSONResponse:
    """The job object (``api``: one already presented, a claimed result resolved)."""
    request.state.job_id = job.id
    return JSONResponse(api if api is not None else job.to_api(), status, headers=headers)


def job_id_or_404(job_id: str) -> str:
    """``job_id``, or 404 for anything that is not one of our ids: no Redis lookup, no odd strings in key
    names."""
    if not JOB_ID_RE.match(job_id):
        raise ApiError(404, "no such job")
    return job_id


def _parse_job_request(raw: bytes, settings: Settings) -> JobCreate:
    try:
        return JobCreate.model_validate_json(raw or b"null", context={
            ALLOW_PRIVATE: settings.webhook_allow_private, NO_SURROGATES: surrogate_free(raw),
            WEBHOOK_PORTS: settings.webhook_ports, WEBHOOK_HOSTS: settings.webhook_hosts,
            WEBHOOK_BLOCKED: _blocked_networks(settings.webhook_blocked_networks)})
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors(include_input=False, include_url=False)]
        ) from None
