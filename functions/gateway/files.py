"""Files and Uploads, as OpenAI defines them (docs/api.md, "Files, Uploads, Batches"), on S3
(``functions/storage.py``).

A file up to ``INFERQ_MAX_UPLOAD_BYTES`` (one request through API Gateway and Lambda) is one ``POST /v1/files``.
A larger one goes through the Uploads API: ``POST /v1/uploads`` opens it (its record in Redis, for an hour),
each ``/parts`` request stores one part as its own S3 object, and ``/complete`` streams the parts, in the order
the client names, into the file as one S3 multipart upload (a part of memory at most), then deletes them.
"""

import asyncio
import re
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.datastructures import UploadFile

from inferq.batches import Batches, new_file_id, random_id

from .errors import ApiError
from .openapi import documented

FILE_ID_RE = re.compile(r"^file-[a-z2-7]{26}$")
UPLOAD_ID_RE = re.compile(r"^upload_[a-z2-7]{26}$")
PURPOSES = ("batch",)
T = TypeVar("T")
UPLOAD_TTL_S = 3600
"""An upload not completed within an hour expires, as OpenAI's do."""
QUOTA_EXCEEDED = "quota_exceeded"


def file_store(gw: Any) -> Any:
    """The gateway's S3 file store, made on first use; 503 when no bucket is configured."""
    store = getattr(gw, "file_store", None)
    if store is None:
        if not gw.settings.files_bucket:
            raise ApiError(503, "files are not configured here (INFERQ_FILES_BUCKET is unset)",
                           type_="files_unavailable")
        from functions.storage import FileStore

        store = gw.file_store = FileStore(gw.settings.files_bucket)
    return store


async def in_s3(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A blocking S3 call in a thread; S3 failing or unreachable is a 503, like Redis (G8)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return await asyncio.to_thread(call, *args, **kwargs)
    except (BotoCoreError, ClientError) as exc:
        raise ApiError(503, f"the file store is unavailable ({type(exc).__name__}); retry later",
                       type_="files_unavailable", headers={"Retry-After": "2"}) from None


async def check_file_quota(gw: Any, tenant: str) -> None:
    """429 when the tenant stores ``INFERQ_TENANT_MAX_FILES`` files already. No ``Retry-After``: time frees
    nothing, deleting files does."""
    bound = gw.settings.tenant_max_files
    if bound and await in_s3(file_store(gw).count_files, tenant, bound) >= bound:
        raise ApiError(429, f"this key stores {bound} files, its quota (INFERQ_TENANT_MAX_FILES); delete some first",
                       type_=QUOTA_EXCEEDED)


def check_file_id(file_id: str) -> str:
    if not FILE_ID_RE.match(file_id):
        raise ApiError(404, "no such file")
    return file_id


class UploadCreate(BaseModel):
    filename: str = Field(min_length=1, max_length=512)
    purpose: str
    bytes: int = Field(ge=1)
    mime_type: str = "application/jsonl"


class UploadComplete(BaseModel):
    part_ids: list[str] = Field(min_length=1, max_length=10000)
    md5: str | None = None


def _upload_api(record: dict[str, str], file: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": record["id"],
        "object": "upload",
        "bytes": int(record["bytes"]),
        "created_at": int(record["created_at"]),
        "filename": record["filename"],
        "purpose": record["purpose"],
        "status": record["status"],
        "expires_at": int(record["created_at"]) + UPLOAD_TTL_S,
        "file": file,
    }


async def _form_file(request: Request, field: str, limit: int) -> tuple[UploadFile, dict[str, Any]]:
    try:
        form = await request.form()
    except Exception as exc:  # malformed multipart framing
        raise ApiError(400, f"the body is not multipart/form-data: {type(exc).__name__}") from None
    upload = form.get(field)
    if not isinstance(upload, UploadFile):
        raise ApiError(422, f"{field}: a file part is required (multipart/form-data)")
    if upload.size is not None and upload.size > limit:
        raise ApiError(413, f"the file exceeds {limit} bytes", type_="request_too_large")
    return upload, {k: v for k, v in form.items() if isinstance(v, str)}


def routes(gw: Any, router: APIRouter) -> None:
    Tenant = Annotated[str, Depends(gw.authenticate)]
    settings = gw.settings

    @router.post("/v1/files", summary="Upload a file (multipart: file, purpose=batch)", response_model=None,
                 responses=documented("The file object", 400, 401, 413, 422, 429, 503))
    async def create_file(request: Request, tenant: Tenant) -> JSONResponse:
        await check_file_quota(gw, tenant)
        upload, fields = await _form_file(request, "file", settings.max_upload_bytes)
        purpose = fields.get("purpose")
        if purpose not in PURPOSES:
            raise ApiError(422, f"purpose: must be one of {', '.join(PURPOSES)}")
        store = file_store(gw)
        info = await in_s3(
            store.put, tenant, new_file_id(), upload.file, upload.filename or "upload.jsonl", purpose
        )
        return JSONResponse(info.to_api())

    @router.get("/v1/files", summary="List the tenant's files (in id order)", response_model=None,
                responses=documented("A list of file objects", 400, 401, 413, 422, 503))
    async def list_files(
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
    async def get_file(file_id: str, tenant: Tenant) -> JSONResponse:
        info = await in_s3(file_store(gw).head, tenant, check_file_id(file_id))
        if info is None:
            raise ApiError(404, "no such file")
        return JSONResponse(info.to_api())

    @router.get("/v1/files/{file_id}/content", summary="Get a file's contents", response_model=None,
                responses=documented("The file's bytes", 400, 401, 404, 413, 422, 503,
                                     content_type="application/octet-stream"))
    async def file_content(file_id: str, tenant: Tenant) -> StreamingResponse:
        store = file_store(gw)
        info = await in_s3(store.head, tenant, check_file_id(file_id))
        if info is None:
            raise ApiError(404, "no such file")
        # a sync iterator: Starlette reads it in its thread pool, a chunk at a time
        return StreamingResponse(store.chunks(tenant, file_id), media_type="application/octet-stream",
                                 headers={"Content-Length": str(info.bytes)})

    @router.delete("/v1/files/{file_id}", summary="Delete a file", response_model=None,
                   responses=documented("Deleted", 400, 401, 404, 409, 413, 422, 503))
    async def delete_file(file_id: str, tenant: Tenant) -> JSONResponse:
        # a batch not yet ended reads its input file until it ends (finalising reads it again)
        user = await gw.call(Batches(gw.queue).using_file(tenant, check_file_id(file_id)))
        if user is not None:
            raise ApiError(409, f"the file is the input of batch {user}, which has not ended; delete it once the "
                                "batch ends (or cancel the batch)", type_="file_in_use")
        if not await in_s3(file_store(gw).delete, tenant, file_id):
            raise ApiError(404, "no such file")
        return JSONResponse({"id": file_id, "object": "file", "deleted": True})

    # ------------------------------------------------------------------ uploads

    async def upload_record(tenant: str, upload_id: str) -> dict[str, str]:
        if not UPLOAD_ID_RE.match(upload_id):
            raise ApiError(404, "no such upload")
        record = await gw.call(gw.queue.redis.hgetall(gw.queue.keys.upload(upload_id)))
        if not record or record.get("tenant") != tenant:
            raise ApiError(404, "no such upload")
        return dict(record)

    @router.post("/v1/uploads", summary="Open an upload (for files larger than one request)", response_model=None,
                 responses=documented("The upload object", 400, 401, 413, 422, 429, 503))
    async def create_upload(payload: UploadCreate, tenant: Tenant) -> JSONResponse:
        if payload.purpose not in PURPOSES:
            raise ApiError(422, f"purpose: must be one of {', '.join(PURPOSES)}")
        if payload.bytes > settings.max_file_bytes:
            raise ApiError(422, f"bytes: a file holds at most {settings.max_file_bytes} bytes")
        await check_file_quota(gw, tenant)
        record = {"id": random_id("upload_"), "tenant": tenant, "filename": payload.filename,
                  "purpose": payload.purpose, "bytes": str(payload.bytes), "created_at": str(int(time.time())),
                  "status": "pending"}
        key = gw.queue.keys.upload(record["id"])
        pipe = gw.queue.redis.pipeline(transaction=False)
        pipe.hset(key, mapping=record)
        pipe.expire(key, UPLOAD_TTL_S)
        await gw.call(pipe.execute())
        return JSONResponse(_upload_api(record))

    @router.post("/v1/uploads/{upload_id}/parts", summary="Add a part (multipart: data)", response_model=None,
                 responses=documented("The upload part object", 400, 401, 404, 409, 413, 422, 503))
    async def add_part(request: Request, upload_id: str, tenant: Tenant) -> JSONResponse:
        record = await upload_record(tenant, upload_id)
        if record["status"] != "pending":
            raise ApiError(409, f"the upload is {record['status']}", type_="upload_not_pending")
        upload, _ = await _form_file(request, "data", settings.max_upload_bytes)
        data = await upload.read()
        stored = sum(int(v) for k, v in record.items() if k.startswith("part:"))
        if stored + len(data) > int(record["bytes"]):
            raise ApiError(422, f"the parts would hold more than the {record['bytes']} bytes the upload was opened "
                                "with")
        part_id = random_id("part_")
        await in_s3(file_store(gw).put_part, tenant, upload_id, part_id, data)
        await gw.call(gw.queue.redis.hset(gw.queue.keys.upload(upload_id), f"part:{part_id}", len(data)))
        return JSONResponse({"id": part_id, "object": "upload.part", "created_at": int(time.time()),
                             "upload_id": upload_id})

    @router.post("/v1/uploads/{upload_id}/complete", summary="Assemble the parts into a file", response_model=None,
                 responses=documented("The upload, completed, with its file", 400, 401, 404, 409, 413, 422, 503))
    async def complete_upload(upload_id: str, payload: UploadComplete, tenant: Tenant) -> JSONResponse:
        record = await upload_record(tenant, upload_id)
        if record["status"] != "pending":
            raise ApiError(409, f"the upload is {record['status']}", type_="upload_not_pending")
        if len(set(payload.part_ids)) != len(payload.part_ids):
            raise ApiError(422, "part_ids: a part is named twice")
        sizes = [record.get(f"part:{p}") for p in payload.part_ids]
        if None in sizes:
            raise ApiError(422, "part_ids: a part is not one of this upload's")
        if sum(int(s or 0) for s in sizes) != int(record["bytes"]):
            raise ApiError(422, f"the parts hold {sum(int(s or 0) for s in sizes)} bytes, not the "
                                f"{record['bytes']} the upload was opened with")
        store = file_store(gw)
        file_id = new_file_id()

        def assemble() -> Any:
            writer = store.writer(tenant, file_id, record["filename"], record["purpose"])
            try:
                for part_id in payload.part_ids:
                    for chunk in store.part_chunks(tenant, upload_id, part_id):
                        writer.write(chunk)
                writer.close()
            except BaseException:
                writer.abort()
                raise
            store.delete_parts(tenant, upload_id, [k[5:] for k in record if k.startswith("part:")])
            return store.head(tenant, file_id)

        info = await in_s3(assemble)
        record["status"] = "completed"
        await gw.call(gw.queue.redis.hset(gw.queue.keys.upload(upload_id), "status", "completed"))
        return JSONResponse(_upload_api(record, info.to_api()))

    @router.post("/v1/uploads/{upload_id}/cancel", summary="Cancel an upload", response_model=None,
                 responses=documented("The upload, cancelled", 400, 401, 404, 409, 413, 422, 503))
    async def cancel_upload(upload_id: str, tenant: Tenant) -> JSONResponse:
        record = await upload_record(tenant, upload_id)
        if record["status"] != "pending":
            raise ApiError(409, f"the upload is {record['status']}", type_="upload_not_pending")
        parts = [k[5:] for k in record if k.startswith("part:")]
        await in_s3(file_store(gw).delete_parts, tenant, upload_id, parts)
        await gw.call(gw.queue.redis.hset(gw.queue.keys.upload(upload_id), "status", "cancelled"))
        record["status"] = "cancelled"
        return JSONResponse(_upload_api(record))
