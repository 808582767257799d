"""Files, as OpenAI defines them (docs/api.md, "Files, Uploads, Batches"), on S3 (``functions/storage.py``): a file
up to ``INFERQ_MAX_UPLOAD_BYTES`` (one request through API Gateway and Lambda) is one ``POST /v1/files``; a larger
one goes through the Uploads API (:mod:`.uploads`)."""

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from inferq.batches.records import Batches, new_file_id

from ..dependencies import GatewayDep, Tenant
from ..errors import ApiError
from ..files import (
    FILE_ID_RE,
    PURPOSES,
    check_file_id,
    check_file_quota,
    count_file,
    file_store,
    form_file,
    in_s3,
    storage,
)
from ..openapi import documented

router = APIRouter()


@router.post("/v1/files", summary="Upload a file (multipart: file, purpose=batch)", response_model=None,
             responses=documented("The file object", 400, 401, 413, 422, 429, 503))
async def create_file(request: Request, gw: GatewayDep, tenant: Tenant) -> JSONResponse:
    upload, fields = await form_file(request, "file", gw.settings.max_upload_bytes)
    purpose = fields.get("purpose")
    if purpose not in PURPOSES:
        raise ApiError(422, f"purpose: must be one of {', '.join(PURPOSES)}")
    await check_file_quota(gw, tenant, new_bytes=upload.size or 0)
    store = file_store(gw)
    info = await in_s3(
        store.put, tenant, new_file_id(), upload.file, upload.filename or "upload.jsonl", purpose
    )
    await count_file(gw, tenant, info.id, info.bytes)
    return JSONResponse(info.to_api())


@router.get("/v1/files", summary="List the tenant's files (in id order)", response_model=None,
            responses=documented("A list of file objects", 400, 401, 413, 422, 503))
async def list_files(
    gw: GatewayDep,
    tenant: Tenant,
    after: Annotated[str | None, Query(pattern=FILE_ID_RE.pattern)] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 100,  # each file is one HEAD: pages stay short
    purpose: Annotated[str | None, Query(max_length=64)] = None,
    order: Annotated[str | None, Query(pattern="^(asc|desc)$")] = None,
) -> JSONResponse:
    files, has_more = await in_s3(
        file_store(gw).list_files, tenant, after=after, limit=limit, purpose=purpose)
    data = [f.to_api() for f in files]
    return JSONResponse({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None, "has_more": has_more})


@router.get("/v1/files/{file_id}", summary="Get a file object", response_model=None,
            responses=documented("The file object", 400, 401, 404, 413, 422, 503))
async def get_file(file_id: str, gw: GatewayDep, tenant: Tenant) -> JSONResponse:
    info = await in_s3(file_store(gw).head, tenant, check_file_id(file_id))
    if info is None:
        raise ApiError(404, "no such file")
    return JSONResponse(info.to_api())


@router.get("/v1/files/{file_id}/content", summary="Get a file's contents", response_model=None,
            responses=documented("The file's bytes", 400, 401, 404, 413, 422, 503,
                                 content_type="application/octet-stream"))
async def file_content(file_id: str, gw: GatewayDep, tenant: Tenant) -> StreamingResponse:
    store = file_store(gw)
    info = await in_s3(store.head, tenant, check_file_id(file_id))
    if info is None:
        raise ApiError(404, "no such file")
    # a sync iterator: Starlette reads it in its thread pool, a chunk at a time
    return StreamingResponse(store.chunks(tenant, file_id), media_type="application/octet-stream",
                             headers={"Content-Length": str(info.bytes)})


@router.delete("/v1/files/{file_id}", summary="Delete a file", response_model=None,
               responses=documented("Deleted", 400, 401, 404, 409, 413, 422, 503))
async def delete_file(file_id: str, gw: GatewayDep, tenant: Tenant) -> JSONResponse:
    # a batch not yet ended reads its input file until it ends (finalising reads it again)
    user = await gw.call(Batches(gw.queue).using_file(tenant, check_file_id(file_id)))
    if user is not None:
        raise ApiError(409, f"the file is the input of batch {user}, which has not ended; delete it once the "
                            "batch ends (or cancel the batch)", type_="file_in_use")
    found = await in_s3(file_store(gw).delete, tenant, file_id)
    # counted or not: a delete resent after a failed count leaves the counts right
    await gw.call(storage(gw).drop_file(tenant, file_id))
    if not found:
        raise ApiError(404, "no such file")
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})
