"""The job routes: submit, get (with wait) and cancel (docs/api.md). Submit and get run :mod:`..jobs`, as the hot
path of :mod:`..hotpath` does for the common request; these handlers stay the reference it is compared against."""

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Header, Query, Request

from inferq.queue.jobs import JobStatus

from ..dependencies import GatewayDep, Tenant
from ..jobs import answered, get, job_id_or_404, job_response, submit
from ..openapi import doc, errors
from ..request_schemas import IDEMPOTENCY_KEY_MAX, JOB_CREATE_EXAMPLE, MAX_WAIT_S
from ..responses import JSONResponse
from ..waits import wait_responses

router = APIRouter()

SUBMIT_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {"$ref": "#/components/schemas/JobCreate"},
            "examples": {"chat": {"summary": "A chat completion", "value": JOB_CREATE_EXAMPLE}},
        }
    },
}
"""The submit body as documented: it is parsed by hand after authentication (:func:`..jobs.submit`), so FastAPI
sees no body parameter."""


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
    openapi_extra={"requestBody": SUBMIT_BODY},
)
async def submit_job(
    request: Request,
    background: BackgroundTasks,
    gw: GatewayDep,
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
    gw: GatewayDep,
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
async def cancel_job(request: Request, job_id: str, gw: GatewayDep, tenant: Tenant) -> JSONResponse:
    queue = gw.job_queue(job_id_or_404(job_id))
    # a claimed body is deleted when a cancel ends the job here (queued); the record's reference goes with
    # the terminal transition, so it is read first (a running job's worker deletes it when it ends it)
    before = await gw.call(queue.get(job_id, tenant)) if gw.claim_check.store is not None else None
    job = await gw.call(queue.cancel(tenant, job_id))
    if before is not None and job.status is JobStatus.CANCELLED:
        await gw.claim_check.drop_request_body(before)
    return job_response(request, job)
