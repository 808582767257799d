"""The dead-letter queue of the calling tenant: list its dead-lettered jobs, redrive one (docs/api.md)."""

import asyncio
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Query, Request

from ..dependencies import GatewayDep, Tenant
from ..jobs import job_id_or_404, job_response
from ..openapi import doc, errors
from ..responses import JSONResponse

router = APIRouter()


@router.get(
    "/v1/dlq",
    summary="List the tenant's dead-lettered jobs, newest first",
    response_model=None,
    responses={200: doc("JobList", "Dead-lettered jobs"), **errors(400, 401, 413, 422, 503)},
)
async def list_dead_letters(
    gw: GatewayDep,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many jobs")] = 20,
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
async def redrive_job(request: Request, background: BackgroundTasks, job_id: str, gw: GatewayDep,
                      tenant: Tenant) -> JSONResponse:
    queue = gw.job_queue(job_id_or_404(job_id))
    # an engine_died dead letter is an operator's (its strikes would reset); a named operator's, any tenant's
    job = await gw.call(queue.redrive(tenant, job_id, operator=gw.settings.is_admin(tenant),
                                      any_tenant=gw.settings.is_named_admin(tenant)))
    gw.after_enqueue(background, queue)
    return job_response(request, job, 202, {"Location": f"/v1/jobs/{job.id}"})
