"""What the Files, Uploads and Batches routes share (docs/api.md, "Files, Uploads, Batches"): the gateway's S3 file
store (``functions/storage.py``) made on first use, S3 calls as 503s when it fails, the tenant quotas
(``INFERQ_TENANT_MAX_FILES``, ``INFERQ_TENANT_MAX_FILE_BYTES``) checked before and after each write, file ids, and
reading a multipart body. The routes are :mod:`.routers.files`, :mod:`.routers.uploads` and
:mod:`.routers.batches`.
"""

import asyncio
import re
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from starlette.datastructures import UploadFile

from .errors import ApiError

FILE_ID_RE = re.compile(r"^file-[a-z2-7]{26}$")
PURPOSES = ("batch",)
T = TypeVar("T")
QUOTA_EXCEEDED = "quota_exceeded"
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


async def kept_within_quota(gw: Any, tenant: str, file_id: str, completing: str | None = None) -> None:
    """The check after a write: a file that took the tenant past a quota is removed again, and refused."""
    try:
        await check_file_quota(gw, tenant, written=True, completing=completing)
    except ApiError:
        await in_s3(file_store(gw).delete, tenant, file_id)
        raise


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
