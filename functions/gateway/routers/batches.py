"""Batches, as OpenAI defines them (docs/api.md, "Files, Uploads, Batches"). The routes only create, read and
cancel batch records (:mod:`inferq.batches.records`); the driver in the scaler turns lines into jobs and writes the
output."""

import re
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from inferq.batches.records import Batches, BatchNotFound, BatchTerminal
from inferq.queue.jobs import ENDPOINTS

from ..dependencies import GatewayDep, Tenant
from ..errors import ApiError
from ..files import QUOTA_EXCEEDED, check_file_id, check_file_quota, file_store, in_s3
from ..metering import check_budget
from ..openapi import documented
from ..request_schemas import Metadata

router = APIRouter()

BATCH_ID_RE = re.compile(r"^batch_[a-z2-7]{26}$")
RETRY_AFTER_BATCH_QUOTA_S = 60
"""A batch takes minutes: asking again every minute is often enough."""


class BatchCreate(BaseModel):
    input_file_id: str = Field(max_length=64)
    endpoint: str
    completion_window: str = Field(max_length=16)
    metadata: Metadata | None = None


def _batch_id(batch_id: str) -> str:
    if not BATCH_ID_RE.match(batch_id):
        raise ApiError(404, "no such batch")
    return batch_id



@router.post("/v1/batches", summary="Create a batch from an uploaded JSONL file", response_model=None,
             responses=documented("The batch object", 400, 401, 404, 413, 422, 429, 503))
async def create_batch(payload: BatchCreate, background: BackgroundTasks, gw: GatewayDep, tenant: Tenant
                       ) -> JSONResponse:
    if payload.endpoint not in ENDPOINTS:
        raise ApiError(422, f"endpoint: must be one of {', '.join(ENDPOINTS)}")
    if payload.completion_window not in gw.settings.batch_completion_windows:
        raise ApiError(422, "completion_window: must be one of "
                            + ", ".join(gw.settings.batch_completion_windows))
    info = await in_s3(file_store(gw).head, tenant, check_file_id(payload.input_file_id))
    if info is None:
        raise ApiError(404, "no such file")
    bound = gw.settings.tenant_max_batches
    if bound and await gw.call(Batches(gw.queue).unfinished(tenant, bound)) >= bound:
        raise ApiError(429, f"this key has {bound} batches not yet ended, its quota (INFERQ_TENANT_MAX_BATCHES); "
                            "retry when one ends", type_=QUOTA_EXCEEDED,
                       headers={"Retry-After": str(RETRY_AFTER_BATCH_QUOTA_S)})
    # a batch's output files are never refused: a tenant they took past its file quotas makes no more
    await check_file_quota(gw, tenant, new_files=0)
    await check_budget(gw, tenant)  # a batch's lines are submits: none past the tenant's monthly budget
    batch = await gw.call(Batches(gw.queue).create(
        tenant, payload.input_file_id, payload.endpoint, payload.completion_window, payload.metadata))
    gw.after_enqueue(background)  # wake the scaler at zero workers: its driver validates the batch
    return JSONResponse(batch.to_api())


@router.get("/v1/batches/{batch_id}", summary="Get a batch", response_model=None,
            responses=documented("The batch object", 400, 401, 404, 413, 422, 503))
async def get_batch(batch_id: str, gw: GatewayDep, tenant: Tenant) -> JSONResponse:
    batch = await gw.call(Batches(gw.queue).get(_batch_id(batch_id), tenant))
    if batch is None:
        raise ApiError(404, "no such batch")
    return JSONResponse(batch.to_api())


@router.get("/v1/batches", summary="List the tenant's batches, newest first", response_model=None,
            responses=documented("A list of batch objects", 400, 401, 413, 422, 503))
async def list_batches(
    gw: GatewayDep,
    tenant: Tenant,
    after: Annotated[str | None, Query(pattern=BATCH_ID_RE.pattern)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> JSONResponse:
    try:
        batches, has_more = await gw.call(Batches(gw.queue).list(tenant, after=after, limit=limit))
    except BatchNotFound:  # never an empty last page for a cursor that lost its place
        raise ApiError(422, "after: no such batch of this key's (or it expired long ago); list from the start",
                       type_="invalid_cursor") from None
    data = [b.to_api() for b in batches]
    return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": has_more})


@router.post("/v1/batches/{batch_id}/cancel", summary="Cancel a batch", response_model=None,
             responses=documented("The batch, cancelling", 400, 401, 404, 409, 413, 422, 503))
async def cancel_batch(batch_id: str, gw: GatewayDep, tenant: Tenant) -> JSONResponse:
    try:
        batch = await gw.call(Batches(gw.queue).cancel(tenant, _batch_id(batch_id)))
    except BatchNotFound:
        raise ApiError(404, "no such batch") from None
    except BatchTerminal as exc:
        raise ApiError(409, f"the batch is already {exc.batch.status.value}", type_="batch_terminal",
                       extra={"batch": exc.batch.to_api()}) from None
    return JSONResponse(batch.to_api())
