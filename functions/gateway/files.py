"""What the Files, Uploads and Batches routes share (docs/api.md, "Files, Uploads, Batches"): the gateway's S3 file
store (``functions/storage.py``) made on first use, S3 calls as 503s when it fails, the tenant quotas
(``INFERQ_TENANT_MAX_FILES``, ``INFERQ_TENANT_MAX_FILE_BYTES``) checked from the counts in the cache before each
write and with it (:mod:`inferq.queue.storage`; no S3 LIST), file ids, and reading a multipart body. The routes are
:mod:`.routers.files`, :mod:`.routers.uploads` and :mod:`.routers.batches`.
"""

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from starlette.datastructures import UploadFile

from inferq.queue.storage import Storage

from .errors import ApiError

log = logging.getLogger(__name__)

FILE_ID_RE = re.compile(r"^file-[a-z2-7]{26}$")
PURPOSES = ("batch",)
T = TypeVar("T")
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


def storage(gw: Any) -> Storage:
    """The tenants' storage counts (:mod:`inferq.queue.storage`), in the primary queue's slot."""
    return Storage(gw.queue)


def past_quota(gw: Any, files: int, stored: int, new_files: int, new_bytes: int) -> ApiError | None:
    """429 ``quota_exceeded`` when ``new_files`` files of ``new_bytes`` bytes would take a tenant that stores
    ``files`` files and ``stored`` bytes past a bound. No ``Retry-After``: time frees nothing, deleting files does."""
    max_files, max_bytes = gw.settings.tenant_max_files, gw.settings.tenant_max_file_bytes
    if max_bytes and stored + new_bytes > max_bytes:
        return ApiError(429, f"this key would store {stored + new_bytes} bytes, past its quota of {max_bytes} "
                             "(INFERQ_TENANT_MAX_FILE_BYTES); delete files or cancel uploads first",
                        type_=QUOTA_EXCEEDED)
    if max_files and files + new_files > max_files:
        return ApiError(429, f"this key stores {files} files, its quota (INFERQ_TENANT_MAX_FILES) is {max_files}; "
                             "delete some first", type_=QUOTA_EXCEEDED)
    return None


async def check_file_quota(gw: Any, tenant: str, *, new_files: int = 1, new_bytes: int = 0) -> None:
    """429 when adding ``new_files`` files of ``new_bytes`` bytes would take the tenant past
    ``INFERQ_TENANT_MAX_FILES`` or ``INFERQ_TENANT_MAX_FILE_BYTES`` (its files and its open uploads' parts), from the
    counts (one round trip to the cache, no S3 call): the check before a write, so nothing is written in vain. The
    write's own count (``addfile.lua``, ``addpart.lua``, ``completeupload.lua``) checks again in one step with it,
    so writes racing each other cannot pass a bound together."""
    if not gw.settings.tenant_max_files and not gw.settings.tenant_max_file_bytes:
        return
    stored = await gw.call(storage(gw).stored(tenant))
    refusal = past_quota(gw, stored.files, stored.bytes + stored.parts, new_files, new_bytes)
    if refusal is not None:
        raise refusal


async def count_file(gw: Any, tenant: str, file_id: str, size: int) -> None:
    """Count a file just written (``addfile.lua``); one that takes the tenant past a bound is removed again and
    refused, and so is one whose count could not be written (the cache unreachable: 503), best effort."""
    settings = gw.settings
    try:
        refused = await gw.call(storage(gw).add_file(
            tenant, file_id, size, settings.tenant_max_files, settings.tenant_max_file_bytes))
    except BaseException:
        await remove_quietly(gw, tenant, file_id)
        raise
    if refused is not None:
        await in_s3(file_store(gw).delete, tenant, file_id)
        raise past_quota(gw, refused.files, refused.bytes, 1, size) or ApiError(
            429, "this key is at its file quota; delete files first", type_=QUOTA_EXCEEDED)


async def remove_quietly(gw: Any, tenant: str, file_id: str) -> None:
    """Remove a file nothing counts (a recount would count it, and the client was told it failed)."""
    try:
        await in_s3(file_store(gw).delete, tenant, file_id)
    except Exception:  # S3 failing too: the file stays, and the next recount counts it
        log.warning("a file whose count failed could not be removed; the next recount counts it")


def check_file_id(file_id: str) -> str:
    if not FILE_ID_RE.match(file_id):
        raise ApiError(404, "no such file")
    return file_id


async def form_file(request: Request, field: str, limit: int) -> tuple[UploadFile, dict[str, Any]]:
    """The file part ``field`` of a multipart body (413 past ``limit`` bytes), and the body's text fields."""
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
