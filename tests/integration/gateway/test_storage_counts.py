"""The file quotas from counts in the cache, not S3 LISTs (inferq/queue/storage.py), on real Valkey and moto's S3:
the counts after each write the gateway makes (a file, its delete, an upload's parts, its complete and its cancel),
a resent script counting once, no LIST on the request path (the S3 calls counted), an upload's parts given back
when its record expires, and what no request sees (the lifecycle rule's deletes, a process that died between S3
and the count) corrected by the scaler's recount without undoing a write it raced."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from functions.gateway.routers.uploads import UPLOAD_TTL_S
from functions.storage import FileStore
from inferq.queue.protocol import Queue, now_ms
from inferq.queue.storage import Storage, Stored
from tests.support.s3 import in_process_bucket

from .conftest import AppFactory
from .support import A
from .test_submit import assert_envelope

BUCKET = "inferq-storage-counts"
TENANT = "tenant-a"
LISTS = ("ListObjectsV2", "ListObjects", "ListObjectVersions")


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with in_process_bucket(monkeypatch, BUCKET) as client:
        yield client


class Calls:
    """The S3 operations one client made, by name (botocore's ``before-call`` event)."""

    def __init__(self, client: Any) -> None:
        self.names: list[str] = []
        client.meta.events.register("before-call.s3", self._seen)

    def _seen(self, model: Any, **_: Any) -> None:
        self.names.append(model.name)


def open_app(make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient],
             **overrides: Any) -> tuple[httpx.AsyncClient, Calls]:
    """A gateway on the bucket whose file store's S3 calls are recorded."""
    app = make_app(files_bucket=BUCKET, max_upload_bytes=64 * 1024, **overrides)
    store = FileStore(BUCKET)
    calls = Calls(store.client)
    app.state.gateway.file_store = store
    return open_client(app), calls


async def post_file(client: httpx.AsyncClient, data: bytes) -> httpx.Response:
    return await client.post("/v1/files", headers=A, files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})


async def open_upload(client: httpx.AsyncClient, size: int) -> str:
    opened = await client.post("/v1/uploads", headers=A, json={"filename": "big.jsonl", "purpose": "batch",
                                                               "bytes": size})
    assert opened.status_code == 200, opened.text
    return str(opened.json()["id"])


async def add_part(client: httpx.AsyncClient, upload_id: str, data: bytes) -> httpx.Response:
    return await client.post(f"/v1/uploads/{upload_id}/parts", headers=A, files={"data": ("blob", data)})


def listed(s3: Any, tenant: str = TENANT) -> dict[str, int]:
    return FileStore(BUCKET, client=s3).file_sizes(tenant)


async def test_each_write_keeps_the_counts_and_no_quota_check_lists(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    client, calls = open_app(make_app, open_client, tenant_max_files=3, tenant_max_file_bytes=100)
    storage = Storage(queue)

    first = (await post_file(client, b"x" * 10)).json()
    assert await storage.stored(TENANT) == Stored(1, 10, 0)
    upload_id = await open_upload(client, 20)
    part = (await add_part(client, upload_id, b"y" * 20)).json()["id"]
    assert await storage.stored(TENANT) == Stored(1, 10, 20)
    done = await client.post(f"/v1/uploads/{upload_id}/complete", headers=A, json={"part_ids": [part]})
    assert done.status_code == 200, done.text
    assert await storage.stored(TENANT) == Stored(2, 30, 0)  # the parts' bytes became the file's: counted once
    cancelled = await open_upload(client, 5)
    assert (await add_part(client, cancelled, b"z" * 5)).status_code == 200
    assert await storage.stored(TENANT) == Stored(2, 30, 5)
    assert (await client.post(f"/v1/uploads/{cancelled}/cancel", headers=A)).status_code == 200
    assert await storage.stored(TENANT) == Stored(2, 30, 0)
    assert (await client.delete(f"/v1/files/{first['id']}", headers=A)).status_code == 200
    assert await storage.stored(TENANT) == Stored(1, 20, 0)
    assert_envelope(await client.delete(f"/v1/files/{first['id']}", headers=A), 404)  # a resent delete
    assert await storage.stored(TENANT) == Stored(1, 20, 0)

    # the quotas, from the counts: the bytes bound (a part, a file), then the files bound
    bounded, racing = await open_upload(client, 80), await open_upload(client, 80)  # each within it when opened
    assert (await add_part(client, bounded, b"p" * 80)).status_code == 200  # exactly at the bound
    assert_envelope(await add_part(client, racing, b"p"), 429, "quota_exceeded")  # 20 + 80 + 1 > 100
    assert_envelope(await post_file(client, b"q"), 429, "quota_exceeded")
    assert (await client.post(f"/v1/uploads/{bounded}/cancel", headers=A)).status_code == 200
    assert (await post_file(client, b"q")).status_code == 200
    assert (await post_file(client, b"r")).status_code == 200
    refused = await post_file(client, b"s")
    assert_envelope(refused, 429, "quota_exceeded")
    assert "INFERQ_TENANT_MAX_FILES" in refused.json()["error"]["message"]
    assert await storage.stored(TENANT) == Stored(3, 22, 0)
    assert len(listed(s3)) == 3  # nothing refused was kept
    assert "PutObject" in calls.names and not set(LISTS) & set(calls.names), calls.names


async def test_files_written_at_once_cannot_pass_the_bound_together(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    client, _ = open_app(make_app, open_client, tenant_max_files=2)
    answers = await asyncio.gather(*(post_file(client, b"{}\n") for _ in range(6)))
    assert sum(a.status_code == 200 for a in answers) <= 2
    assert all(a.status_code in (200, 429) for a in answers)
    kept = listed(s3)
    assert (await Storage(queue).stored(TENANT)).files == len(kept) == sum(a.status_code == 200 for a in answers)


async def test_a_resent_script_counts_once(queue: Queue) -> None:
    storage, keys = Storage(queue), queue.keys
    assert await storage.add_file(TENANT, "file-a", 7, 10, 100) is None
    assert await storage.add_file(TENANT, "file-a", 7, 10, 100) is None  # again: counted already, same answer
    assert await storage.stored(TENANT) == Stored(1, 7, 0)

    upload = keys.upload("upload_r")
    await queue.redis.hset(upload, mapping={"id": "upload_r", "tenant": TENANT, "bytes": "9", "status": "pending"})
    await queue.redis.expire(upload, UPLOAD_TTL_S)
    part = [upload, keys.bounds, keys.storage(TENANT), keys.storage_open(TENANT)]
    for _ in range(2):
        assert [int(x) for x in await queue.scripts("addpart", part, ["part:p1", 9, 10, now_ms(), 100])] == [1]
    assert await storage.stored(TENANT) == Stored(1, 7, 9)

    assert int((await queue.scripts("moveupload", [upload], ["pending", "completing", "tok"]))[0]) == 1
    for _ in range(2):
        code, _ = await storage.complete_upload(TENANT, upload, "file-b", 9, "tok", 10, 100)
        assert code == 1
    assert await storage.stored(TENANT) == Stored(2, 16, 0)
    assert await queue.redis.hget(upload, "status") == "completed"

    for _ in range(2):
        await storage.drop_file(TENANT, "file-a")
    assert await storage.stored(TENANT) == Stored(1, 9, 0)


async def test_every_storage_script_answers_the_same_and_changes_nothing_when_resent(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    """G9 with the protocol tests' harness: each script call run twice, the second answering what the first did and
    leaving every key of the queue as the first left it; through the gateway's own routes, refusals included, and
    the scaler's recount (one that corrects, one that forgets a tenant, one a write raced)."""
    from tests.integration.protocol.resend import Resending

    resending = Resending(queue)
    queue.scripts = resending
    client, _ = open_app(make_app, open_client, queue=queue, tenant_max_files=2, tenant_max_file_bytes=100)
    kept = (await post_file(client, b"x" * 10)).json()                                  # addfile
    opened, racing, cancelled = [await open_upload(client, size) for size in (20, 75, 5)]  # openupload
    part = (await add_part(client, opened, b"y" * 20)).json()["id"]                     # addpart
    assert (await add_part(client, cancelled, b"v" * 5)).status_code == 200
    assert_envelope(await add_part(client, racing, b"z" * 66), 429)                     # addpart: past the bytes
    assert (await client.post(f"/v1/uploads/{opened}/complete", headers=A,
                              json={"part_ids": [part]})).status_code == 200            # moveupload, completeupload
    assert_envelope(await post_file(client, b"w"), 429)                                 # addfile: past the files
    assert (await client.post(f"/v1/uploads/{cancelled}/cancel", headers=A)).status_code == 200  # moveupload: cancel
    assert (await client.delete(f"/v1/files/{kept['id']}", headers=A)).status_code == 200       # dropfile
    storage = Storage(queue)
    store = FileStore(BUCKET, client=s3)
    s3.delete_object(Bucket=BUCKET, Key=store.file_key(TENANT, next(iter(listed(s3)))))  # the lifecycle rule's
    assert await storage.recount(TENANT, store) is True                                 # recountfiles: corrects
    assert await storage.recount(TENANT, store) is False
    assert not await queue.redis.exists(queue.keys.storage(TENANT))  # nothing left: forgotten
    for name in ("addfile", "addpart", "completeupload", "moveupload", "dropfile", "recountfiles"):
        assert resending.checked.get(name), name


async def test_a_cancel_resent_gives_the_parts_back_once(queue: Queue) -> None:
    keys = queue.keys
    upload = keys.upload("upload_c")
    await queue.redis.hset(upload, mapping={"id": "upload_c", "tenant": TENANT, "bytes": "9", "status": "pending"})
    await queue.redis.expire(upload, UPLOAD_TTL_S)
    other = keys.upload("upload_d")
    await queue.redis.hset(other, mapping={"id": "upload_d", "tenant": TENANT, "bytes": "9", "status": "pending"})
    await queue.redis.expire(other, UPLOAD_TTL_S)
    storage_keys = [keys.storage(TENANT), keys.storage_open(TENANT)]
    for key, size in ((upload, 4), (other, 3)):
        await queue.scripts("addpart", [key, keys.bounds, *storage_keys], ["part:p", size, 10, now_ms(), 0])
    for _ in range(2):
        await queue.scripts("moveupload", [upload, *storage_keys], ["pending", "cancelled", "tok"])
    assert await Storage(queue).stored(TENANT) == Stored(0, 0, 3)


async def test_an_uploads_parts_are_given_back_when_its_record_expires(queue: Queue) -> None:
    storage, keys = Storage(queue), queue.keys
    upload = keys.upload("upload_e")
    await queue.redis.hset(upload, mapping={"id": "upload_e", "tenant": TENANT, "bytes": "50", "status": "pending"})
    await queue.redis.expire(upload, UPLOAD_TTL_S)
    storage_keys = [keys.storage(TENANT), keys.storage_open(TENANT)]
    now = 1_000_000
    await queue.scripts("addpart", [upload, keys.bounds, *storage_keys], ["part:p", 50, 10, now, 60])
    expires = now + UPLOAD_TTL_S * 1000
    assert await storage.stored(TENANT, now=expires - 1000) == Stored(0, 0, 50)
    assert await storage.stored(TENANT, now=expires + 1000) == Stored(0, 0, 0)  # read: the expired left out
    # a write after the expiry gives the charge back for good, and is admitted within it
    reply = await queue.scripts("addfile", [*storage_keys, keys.storage_due],
                                [TENANT, "file-e", 60, expires + 1000, 0, 60, "token"])
    assert int(reply[0]) == 1
    assert await storage.stored(TENANT, now=expires + 1000) == Stored(1, 60, 0)
    assert await queue.redis.zcard(keys.storage_open(TENANT)) == 0
    assert await queue.redis.hget(keys.storage(TENANT), "upload_e") is None


async def test_the_recount_corrects_what_no_request_saw(s3: Any, queue: Queue) -> None:
    storage, keys = Storage(queue), queue.keys
    store = FileStore(BUCKET, client=s3)
    for file_id, data in (("file-kept", b"abc"), ("file-expired", b"defgh")):
        store.put(TENANT, file_id, data, "x.jsonl", "batch")
        await storage.add_file(TENANT, file_id, len(data))
    s3.delete_object(Bucket=BUCKET, Key=store.file_key(TENANT, "file-expired"))  # the lifecycle rule's delete
    store.put(TENANT, "file-uncounted", b"ij", "x.jsonl", "batch")  # a gateway that died before counting it
    store.put("tenant-c", "file-only", b"klmn", "x.jsonl", "batch")  # a tenant whose counts the cache lost
    assert await storage.stored(TENANT) == Stored(2, 8, 0)

    assert await storage.recount_due(store, interval_s=0, budget_s=30) == 2
    assert await storage.stored(TENANT) == Stored(2, 5, 0)
    assert await storage.stored("tenant-c") == Stored(1, 4, 0)
    assert await storage.recount(TENANT, store) is False  # right now: nothing to change

    # a tenant that stores nothing any more is forgotten
    for file_id in ("file-kept", "file-uncounted"):
        store.delete(TENANT, file_id)
    assert await storage.recount(TENANT, store) is True
    assert not await queue.redis.exists(keys.storage(TENANT))
    assert await queue.redis.zscore(keys.storage_due, TENANT) is None


async def test_the_recount_never_undoes_a_write_made_while_it_listed(s3: Any, queue: Queue) -> None:
    storage = Storage(queue)
    store = FileStore(BUCKET, client=s3)
    store.put(TENANT, "file-old", b"abc", "x.jsonl", "batch")
    await storage.add_file(TENANT, "file-old", 3)
    loop = asyncio.get_running_loop()

    class Racing:
        """Lists the bucket, then a gateway stores and counts a file before the recount applies the LIST."""

        def file_sizes(self, tenant: str) -> dict[str, int]:
            sizes = store.file_sizes(tenant)
            store.put(TENANT, "file-new", b"defg", "x.jsonl", "batch")
            asyncio.run_coroutine_threadsafe(storage.add_file(TENANT, "file-new", 4), loop).result(timeout=10)
            return sizes

        def file_tenants(self) -> list[str]:
            return [TENANT]

    assert await storage.recount(TENANT, Racing()) is None  # left for a later pass
    assert await storage.stored(TENANT) == Stored(2, 7, 0)
    assert await storage.recount(TENANT, store) is False


async def test_the_scaler_recounts_the_due_tenants(s3: Any, queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    from functions.scaler.app import recount_files

    storage, keys = Storage(queue), queue.keys
    store = FileStore(BUCKET, client=s3)
    monkeypatch.setattr(FileStore, "client", property(lambda self: s3))
    store.put(TENANT, "file-a", b"abc", "x.jsonl", "batch")
    await storage.add_file(TENANT, "file-a", 3)
    s3.delete_object(Bucket=BUCKET, Key=store.file_key(TENANT, "file-a"))
    settings = queue.settings.replace(files_bucket=BUCKET, file_recount_s=3600)
    await recount_files(settings, queue, budget_s=30)  # counted just now: not due for an hour
    assert await storage.stored(TENANT) == Stored(1, 3, 0)
    await queue.redis.zadd(keys.storage_due, {TENANT: 0})  # an hour later
    await recount_files(settings, queue, budget_s=30)
    assert await storage.stored(TENANT) == Stored(0, 0, 0)


async def test_a_batchs_output_files_are_counted_and_past_the_quota_no_batch_is_made(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    from inferq.batches.driver import BatchDriver

    app = make_app(files_bucket=BUCKET, tenant_max_files=1)
    client = open_client(app)
    bad = json.dumps({"custom_id": "c0", "method": "POST", "url": "/v1/nowhere", "body": {}}).encode() + b"\n"
    file_id = (await post_file(client, bad)).json()["id"]
    batch = (await client.post("/v1/batches", headers=A, json={
        "input_file_id": file_id, "completion_window": "24h", "endpoint": "/v1/chat/completions"})).json()
    gateway = app.state.gateway
    driver = BatchDriver(gateway.queue, FileStore(BUCKET), gateway.settings)
    for _ in range(10):
        await driver.run_once()
        ended = (await client.get(f"/v1/batches/{batch['id']}", headers=A)).json()
        if ended["status"] == "failed":
            break
    assert ended["status"] == "failed" and ended["error_file_id"], ended
    sizes = listed(s3)
    assert len(sizes) == 2  # the input and the error file
    assert await Storage(queue).stored(TENANT) == Stored(2, sum(sizes.values()), 0)
    # the error file is never refused, and took the tenant past its quota: it makes no more batches until it deletes
    again = await client.post("/v1/batches", headers=A, json={
        "input_file_id": file_id, "completion_window": "24h", "endpoint": "/v1/chat/completions"})
    assert_envelope(again, 429, "quota_exceeded")
    assert (await client.delete(f"/v1/files/{ended['error_file_id']}", headers=A)).status_code == 200
    assert (await client.post("/v1/batches", headers=A, json={
        "input_file_id": file_id, "completion_window": "24h", "endpoint": "/v1/chat/completions"})).status_code == 200
