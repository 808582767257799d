"""Files and Uploads, as OpenAI defines them (docs/api.md, "Files, Uploads, Batches"), on S3
(``functions/storage.py``).

A file up to ``INFERQ_MAX_UPLOAD_BYTES`` (one request through API Gateway and Lambda) is one ``POST /v1/files``.
A larger one goes through the Uploads API: ``POST /v1/uploads`` opens it (its record in Redis, for an hour),
each ``/parts`` request stores one part as its own S3 object, and ``/complete`` streams the parts, in the order
the client names, into the file as one S3 multipart upload (a part of memory at most), then deletes them.
"""

import asyncio
import re
import secrets
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.datastructures import UploadFile

from inferq.batches.records import Batches, new_file_id, random_id

from .errors import ApiError
from .openapi import documented

FILE_ID_RE = re.compile(r"^file-[a-z2-7]{26}$")
UPLOAD_ID_RE = re.compile(r"^upload_[a-z2-7]{26}$")
PURPOSES = ("batch",)
T = TypeVar("T")
UPLOAD_TTL_S = 3600
"""An upload not completed within an hour expires, as OpenAI's do."""
QUOTA_EXCEEDED = "quota_exceeded"
MAX_PARTS = 10000
"""Most parts one upload holds (as many as ``complete`` may name): with parts of one byte at least, an upload's
record stays small."""
OPEN = ("pending", "completing")
"""Statuses of an upload whose parts are still stored (``completing``: a complete is assembling them)."""


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


async def check_file_quota(gw: Any, tenant: str, *, new_files: int = 1, new_bytes: int = 0, written: bool = False,
                           completing: str | None = None) -> None:
    """429 when adding ``new_files`` files of ``new_bytes`` bytes would take the tenant past
    ``INFERQ_TENANT_MAX_FILES`` or ``INFERQ_TENANT_MAX_FILE_BYTES``. ``written``: the check after the write (what is
    stored already includes it, and may only be at the bound, not past it), so writes racing each other cannot
    pass the bound together (each sees the other's, and the one past it is removed by its caller). The parts of open
    uploads count as bytes, but for ``completing``'s, whose bytes are its new file's. No ``Retry-After``: time frees
    nothing, deleting files does."""
    max_files, max_bytes = gw.settings.tenant_max_files, gw.settings.tenant_max_file_bytes
    if not max_files and not max_bytes:
        return
    store = file_store(gw)
    adding_files, adding_bytes = (0, 0) if written else (new_files, new_bytes)
    if max_bytes:
        usage = await in_s3(store.usage, tenant)
        files = usage.files
        stored = usage.bytes + await _open_parts_bytes(gw, usage.parts, completing)
        if stored + adding_bytes > max_bytes:
            raise ApiError(429, f"this key would store {stored + adding_bytes} bytes, past its quota of {max_bytes} "
                                "(INFERQ_TENANT_MAX_FILE_BYTES); delete files or cancel uploads first",
                           type_=QUOTA_EXCEEDED)
    else:
        files = await in_s3(store.count_files, tenant, max_files + 1)
    if max_files and files + adding_files > max_files:
        raise ApiError(429, f"this key stores {files} files, its quota (INFERQ_TENANT_MAX_FILES) is {max_files}; "
                            "delete some first", type_=QUOTA_EXCEEDED)


async def _open_parts_bytes(gw: Any, parts: dict[str, int], completing: str | None) -> int:
    """Bytes of the parts of uploads still open (parts an ended upload left behind are the lifecycle rule's)."""
    ids = [upload_id for upload_id in parts if upload_id != completing]
    if not ids:
        return 0
    pipe = gw.queue.redis.pipeline(transaction=False)
    for upload_id in ids:
        pipe.hget(gw.queue.keys.upload(upload_id), "status")
    statuses = await gw.call(pipe.execute())
    return sum(parts[i] for i, status in zip(ids, statuses, strict=True) if status in OPEN)


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


def _refused_part(reply: Any, record: dict[str, str]) -> None:
    """The answer to a part addpart.lua refused (raises)."""
    code = int(reply[0])
    if code == -1:
        raise ApiError(404, "no such upload")
    if code == 0:
        raise ApiError(409, f"the upload is {reply[1]}", type_="upload_not_pending")
    if code == 2:
        raise ApiError(422, f"the upload holds {MAX_PARTS} parts, the most one may")
    raise ApiError(422, f"the parts would hold more than the {record['bytes']} bytes the upload was opened with")


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
        upload, fields = await _form_file(request, "file", settings.max_upload_bytes)
        purpose = fields.get("purpose")
        if purpose not in PURPOSES:
            raise ApiError(422, f"purpose: must be one of {', '.join(PURPOSES)}")
        await check_file_quota(gw, tenant, new_bytes=upload.size or 0)
        store = file_store(gw)
        info = await in_s3(
            store.put, tenant, new_file_id(), upload.file, upload.filename or "upload.jsonl", purpose
        )
        await _kept_within_quota(tenant, info.id)
        return JSONResponse(info.to_api())

    async def _kept_within_quota(tenant: str, file_id: str, completing: str | None = None) -> None:
        """The check after a write: a file that took the tenant past a quota is removed again, and refused."""
        try:
            await check_file_quota(gw, tenant, written=True, completing=completing)
        except ApiError:
            await in_s3(file_store(gw).delete, tenant, file_id)
            raise

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
        await check_file_quota(gw, tenant, new_bytes=payload.bytes)
        record = {"id": random_id("upload_"), "tenant": tenant, "filename": payload.filename,
                  "purpose": payload.purpose, "bytes": str(payload.bytes), "created_at": str(int(time.time())),
                  "status": "pending"}
        key = gw.queue.keys.upload(record["id"])
        pipe = gw.queue.redis.pipeline(transaction=True)  # the record never exists without its TTL
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
        if not data:
            raise ApiError(422, "data: a part holds at least one byte")
        parts = [int(v) for k, v in record.items() if k.startswith("part:")]
        if len(parts) >= MAX_PARTS:
            raise ApiError(422, f"the upload holds {MAX_PARTS} parts, the most one may")
        if sum(parts) + len(data) > int(record["bytes"]):
            raise ApiError(422, f"the parts would hold more than the {record['bytes']} bytes the upload was opened "
                                "with")
        await check_file_quota(gw, tenant, new_files=0, new_bytes=len(data))
        part_id = random_id("part_")
        store = file_store(gw)
        await in_s3(store.put_part, tenant, upload_id, part_id, data)
        # recorded in one step with the bounds (parts racing each other) and never into an expired record
        reply = await gw.call(gw.queue.scripts("addpart", [gw.queue.keys.upload(upload_id)],
                                               [f"part:{part_id}", len(data), MAX_PARTS]))
        if int(reply[0]) != 1:
            await in_s3(store.delete_parts, tenant, upload_id, [part_id])
            _refused_part(reply, record)
        return JSONResponse({"id": part_id, "object": "upload.part", "created_at": int(time.time()),
                             "upload_id": upload_id})

    async def move_upload(upload_id: str, from_: str, to: str, token: str) -> None:
        """Move the upload's status (moveupload.lua) for the request holding ``token``: 404 when it has expired, 409
        when it is not ``from_`` (another request moved it)."""
        reply = await gw.call(gw.queue.scripts("moveupload", [gw.queue.keys.upload(upload_id)], [from_, to, token]))
        if int(reply[0]) == -1:
            raise ApiError(404, "no such upload")
        if int(reply[0]) != 1:
            raise ApiError(409, f"the upload is {reply[1]}", type_="upload_not_pending")

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
        await check_file_quota(gw, tenant, new_files=1)  # its parts count already: they are its bytes
        token = secrets.token_hex(8)
        await move_upload(upload_id, "pending", "completing", token)  # one complete at a time, no part added meanwhile
        record = await upload_record(tenant, upload_id)  # with every part recorded before the move, to delete them
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
            return store.head(tenant, file_id)

        try:
            info = await in_s3(assemble)
            await _kept_within_quota(tenant, file_id, completing=upload_id)
        except BaseException:
            # the upload stays open: the client may delete files and complete again, or cancel
            await gw.call(gw.queue.scripts("moveupload", [gw.queue.keys.upload(upload_id)],
                                           ["completing", "pending", token]))
            raise
        await move_upload(upload_id, "completing", "completed", token)
        await in_s3(store.delete_parts, tenant, upload_id, [k[5:] for k in record if k.startswith("part:")])
        record["status"] = "completed"
        return JSONResponse(_upload_api(record, info.to_api()))

    @router.post("/v1/uploads/{upload_id}/cancel", summary="Cancel an upload", response_model=None,
                 responses=documented("The upload, cancelled", 400, 401, 404, 409, 413, 422, 503))
    async def cancel_upload(upload_id: str, tenant: Tenant) -> JSONResponse:
        record = await upload_record(tenant, upload_id)
        if record["status"] != "pending":
            raise ApiError(409, f"the upload is {record['status']}", type_="upload_not_pending")
        # first: no part is added after the parts are read
        await move_upload(upload_id, "pending", "cancelled", secrets.token_hex(8))
        record = await upload_record(tenant, upload_id)
        parts = [k[5:] for k in record if k.startswith("part:")]
        await in_s3(file_store(gw).delete_parts, tenant, upload_id, parts)
        return JSONResponse(_upload_api(record))
