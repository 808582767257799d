"""``GET /v1/jobs/{id}/stream``: a job's output as it is made (docs/api.md), read from its output stream by
:class:`inferq.queue.output.OutputReader`: the deltas after the cursor ``after``, with ``wait`` as soon as there
are some or the job ends; once the job has ended, what the reader has not read of the final text, and ``done``."""

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from inferq.queue.output import Cursor

from ..dependencies import GatewayDep, Tenant
from ..errors import ApiError
from ..joboutput import reader
from ..openapi import documented
from ..request_schemas import MAX_WAIT_S
from ..responses import JSONResponse
from ..waits import wait_responses, wait_slot

router = APIRouter()

BAD_CURSOR = "after: must be a cursor this endpoint returned for this job"


@router.get("/v1/jobs/{job_id}/stream", summary="A job's output as it is made", response_model=None,
            responses=documented("The deltas since the cursor: `{\"object\": \"list\", \"data\": [{\"index\", "
                                 "\"delta\"}], \"cursor\", \"done\", \"status\"}`", 400, 401, 404, 413, 422, 503)
            | wait_responses())
async def stream_job(
    request: Request,
    job_id: str,
    gw: GatewayDep,
    tenant: Tenant,
    after: Annotated[str | None, Query(max_length=80, description="The `cursor` of the previous answer")] = None,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="Seconds to wait for output (returns at once "
                                                                  "when some arrives or the job ends)")] = 0,
) -> JSONResponse:
    cursor = Cursor.parse(after)
    if cursor is None:
        raise ApiError(422, BAD_CURSOR, type_="invalid_cursor")
    output = reader(gw, job_id, tenant)
    request.state.job_id = job_id
    page: Any
    async with wait_slot(gw, tenant, wait):  # none for a wait of 0
        page = await gw.call(output.read(cursor, wait), extra_s=wait)
    if page.job is None:
        raise ApiError(404, "no such job")
    return JSONResponse(page.to_api())
