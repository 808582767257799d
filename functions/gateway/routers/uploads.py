"""Uploads, as OpenAI defines them (docs/api.md, "Files, Uploads, Batches"): a file larger than one request.
``POST /v1/uploads`` opens it (its record in Redis, for an hour), each ``/parts`` request stores one part as its
own S3 object, and ``/complete`` streams the parts, in the order the client names, into the file as one S3
multipart upload (a part of memory at most), then deletes them."""

import re
import secrets
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from inferq.batches.records import new_file_id, random_id
from inferq.queue.refusals import RetainedQuotaFull
from inferq.redis.scripting import Code

from ..dependencies import GatewayDep, Tenant
from ..errors import ApiError
from ..files import (
    PURPOSES,
    QUOTA_EXCEEDED,
    check_file_quota,
    file_store,
    form_file,
    in_s3,
    past_quota,
    remove_quietly,
    storage,
)
from ..gateway import Gateway
from ..openapi import documented

router = APIRouter()

UPLOAD_ID_RE = re.compile(r"^upload_[a-z2-7]{26}$")
UPLOAD_TTL_S = 3600
"""An upload not completed within an hour expires, as OpenAI's do."""
MAX_PARTS = 10000
"""Most parts one upload holds (as many as ``complete`` may name): with parts of one byte at least, an upload's
record stays small."""


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


async def upload_record(gw: Gateway, tenant: str, upload_id: str) -> dict[str, str]:
    """The tenant's upload record; 404 for another tenant's, an expired one, or an id that is not one."""
    if not UPLOAD_ID_RE.match(upload_id):
        raise ApiError(404, "no such upload")
    record = await gw.call(gw.queue.redis.hgetall(gw.queue.keys.upload(upload_id)))
    if not record or record.get("tenant") != tenant:
        raise ApiError(404, "no such upload")
    return dict(record)


async def pending_record(gw: Gateway, tenant: str, upload_id: str) -> dict[str, str]:
    """:func:`upload_record`, 409 unless the upload is still pending."""
    record = await upload_record(gw, tenant, upload_id)
    if record["status"] != "pending":
        raise ApiError(409, f"the upload is {record['status']}", type_="upload_not_pending")
    return record


async def move_upload(gw: Gateway, tenant: str, upload_id: str, from_: str, to: str, token: str) -> None:
    """Move the upload's status (moveupload.lua) for the request holding ``token``: 404 when it has expired, 409
    when it is not ``from_`` (another request moved it). A move to ``cancelled`` gives back its parts' charge."""
    keys = gw.queue.keys
    reply = await gw.call(gw.queue.scripts(
        "moveupload", [keys.upload(upload_id), keys.storage(tenant), keys.storage_open(tenant)], [from_, to, token]))
    if int(reply[0]) == -1:
        raise ApiError(404, "no such upload")
    if int(reply[0]) != 1:
        raise ApiError(409, f"the upload is {reply[1]}", type_="upload_not_pending")


def _refused_part(gw: Gateway, reply: Any, record: dict[str, str], size: int) -> None:
    """The answer to a part addpart.lua refused (raises)."""
    code = int(reply[0])
    if code == -1:
        raise ApiError(404, "no such upload")
    if code == 0:
        raise ApiError(409, f"the upload is {reply[1]}", type_="upload_not_pending")
    if code == 2:
        raise ApiError(422, f"the upload holds {MAX_PARTS} parts, the most one may")
    if code == 4:
        raise past_quota(gw, 0, int(reply[1]), 0, size) or ApiError(429, "past the file quota", type_=QUOTA_EXCEEDED)
    raise ApiError(422, f"the parts would hold more than the {record['bytes']} bytes the upload was opened with")


@router.post("/v1/uploads", summary="Open an upload (for files larger than one request)", response_model=None,
             responses=documented("The upload object", 400, 401, 413, 422, 429, 503))
async def create_upload(payload: UploadCreate, gw: GatewayDep, tenant: Tenant) -> JSONResponse:
    if payload.purpose not in PURPOSES:
        raise ApiError(422, f"purpose: must be one of {', '.join(PURPOSES)}")
    if payload.bytes > gw.settings.max_file_bytes:
        raise ApiError(422, f"bytes: a file holds at most {gw.settings.max_file_bytes} bytes")
    await check_file_quota(gw, tenant, new_bytes=payload.bytes)
    record = {"id": random_id("upload_"), "tenant": tenant, "filename": payload.filename,
              "purpose": payload.purpose, "bytes": str(payload.bytes), "created_at": str(int(time.time())),
              "status": "pending"}
    # the record with its TTL and its charge to the tenant (G11), or 429 quota_exceeded at its quota
    keys = gw.queue.keys
    reply = await gw.call(gw.queue.scripts(
        "openupload", [keys.upload(record["id"]), keys.bounds],
        [tenant, int(time.time() * 1000), UPLOAD_TTL_S, gw.settings.tenant_max_retained_bytes,
         *(x for pair in record.items() for x in pair)]))
    if int(reply[0]) == Code.RETAINED_FULL:
        raise RetainedQuotaFull(int(reply[1]) / 1000)
    return JSONResponse(_upload_api(record))


@router.post("/v1/uploads/{upload_id}/parts", summary="Add a part (multipart: data)", response_model=None,
             responses=documented("The upload part object", 400, 401, 404, 409, 413, 422, 503))
async def add_part(request: Request, upload_id: str, gw: GatewayDep, tenant: Tenant) -> JSONResponse:
    record = await pending_record(gw, tenant, upload_id)
    upload, _ = await form_file(request, "data", gw.settings.max_upload_bytes)
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
    # recorded in one step with the bounds and the tenant's bytes quota (parts racing each other), never into an
    # expired record
    keys = gw.queue.keys
    reply = await gw.call(gw.queue.scripts(
        "addpart", [keys.upload(upload_id), keys.bounds, keys.storage(tenant), keys.storage_open(tenant)],
        [f"part:{part_id}", len(data), MAX_PARTS, int(time.time() * 1000), gw.settings.tenant_max_file_bytes]))
    if int(reply[0]) != 1:
        await in_s3(store.delete_parts, tenant, upload_id, [part_id])
        _refused_part(gw, reply, record, len(data))
    return JSONResponse({"id": part_id, "object": "upload.part", "created_at": int(time.time()),
                         "upload_id": upload_id})


def _check_parts(record: dict[str, str], part_ids: list[str]) -> None:
    """422 unless ``part_ids`` names each of the upload's parts at most once and they hold its bytes exactly."""
    if len(set(part_ids)) != len(part_ids):
        raise ApiError(422, "part_ids: a part is named twice")
    sizes = [record.get(f"part:{p}") for p in part_ids]
    if None in sizes:
        raise ApiError(422, "part_ids: a part is not one of this upload's")
    if sum(int(s or 0) for s in sizes) != int(record["bytes"]):
        raise ApiError(422, f"the parts hold {sum(int(s or 0) for s in sizes)} bytes, not the "
                            f"{record['bytes']} the upload was opened with")


def _assemble(store: Any, tenant: str, upload_id: str, file_id: str, record: dict[str, str],
              part_ids: list[str]) -> Any:
    """The parts, in order, streamed into the file as one S3 multipart upload (blocking: run in a thread)."""
    writer = store.writer(tenant, file_id, record["filename"], record["purpose"])
    try:
        for part_id in part_ids:
            for chunk in store.part_chunks(tenant, upload_id, part_id):
                writer.write(chunk)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return store.head(tenant, file_id)


@router.post("/v1/uploads/{upload_id}/complete", summary="Assemble the parts into a file", response_model=None,
             responses=documented("The upload, completed, with its file", 400, 401, 404, 409, 413, 422, 503))
async def complete_upload(upload_id: str, payload: UploadComplete, gw: GatewayDep, tenant: Tenant) -> JSONResponse:
    record = await pending_record(gw, tenant, upload_id)
    _check_parts(record, payload.part_ids)
    await check_file_quota(gw, tenant, new_files=1)  # its parts count already: they are its bytes
    token = secrets.token_hex(8)
    await move_upload(gw, tenant, upload_id, "pending", "completing", token)  # one at a time, no part added meanwhile
    record = await upload_record(gw, tenant, upload_id)  # with every part recorded before the move, to delete them
    store = file_store(gw)
    file_id = new_file_id()
    try:
        info = await in_s3(_assemble, store, tenant, upload_id, file_id, record, payload.part_ids)
        await _complete(gw, tenant, upload_id, info, token)
    except BaseException:
        # the upload stays open: the client may delete files and complete again, or cancel
        await gw.call(gw.queue.scripts("moveupload", [gw.queue.keys.upload(upload_id)],
                                       ["completing", "pending", token]))
        raise
    await in_s3(store.delete_parts, tenant, upload_id, [k[5:] for k in record if k.startswith("part:")])
    record["status"] = "completed"
    return JSONResponse(_upload_api(record, info.to_api()))


async def _complete(gw: Gateway, tenant: str, upload_id: str, info: Any, token: str) -> None:
    """The file counted in place of the parts and the upload completed, in one step (completeupload.lua); a file
    refused (a bound, the upload expired or moved, the count unwritten) is removed again."""
    try:
        code, rest = await gw.call(storage(gw).complete_upload(
            tenant, gw.queue.keys.upload(upload_id), info.id, info.bytes, token,
            gw.settings.tenant_max_files, gw.settings.tenant_max_file_bytes))
    except BaseException:
        await remove_quietly(gw, tenant, info.id)
        raise
    if code == 1:
        return
    await in_s3(file_store(gw).delete, tenant, info.id)
    if code == 0:
        raise past_quota(gw, int(rest[0]), int(rest[1]), 1, info.bytes) or ApiError(
            429, "past the file quota", type_=QUOTA_EXCEEDED)
    if code == -1:
        raise ApiError(404, "no such upload")
    raise ApiError(409, f"the upload is {rest[0]}", type_="upload_not_pending")


@router.post("/v1/uploads/{upload_id}/cancel", summary="Cancel an upload", response_model=None,
             responses=documented("The upload, cancelled", 400, 401, 404, 409, 413, 422, 503))
async def cancel_upload(upload_id: str, gw: GatewayDep, tenant: Tenant) -> JSONResponse:
    await pending_record(gw, tenant, upload_id)
    # first: no part is added after the parts are read
    await move_upload(gw, tenant, upload_id, "pending", "cancelled", secrets.token_hex(8))
    record = await upload_record(gw, tenant, upload_id)
    parts = [k[5:] for k in record if k.startswith("part:")]
    await in_s3(file_store(gw).delete_parts, tenant, upload_id, parts)
    return JSONResponse(_upload_api(record))
