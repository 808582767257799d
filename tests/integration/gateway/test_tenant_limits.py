"""What one tenant cannot sidestep or learn, on real Valkey and moto's S3: exact paging of batches and files (same
millisecond, an ``after`` that has expired), the results feed's sealed cursor, file quotas that hold when an
upload completes (count and bytes, parts counted while open), bounded upload parts whose record keeps its TTL,
redrive under the submit limits, and a readiness probe that checks every store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from functions.gateway.routers import uploads as upload_routes
from inferq.batches.records import Batches
from inferq.queue.protocol import Queue
from tests.support.s3 import MotoS3, in_process_bucket
from tests.support.s3 import s3 as s3_server  # noqa: F401  (the moto server fixture, used by name)

from .conftest import AppFactory
from .support import A, B
from .test_jobs import dead_letter, submit
from .test_submit import assert_envelope

BUCKET = "inferq-tenant-limits"
LINE = json.dumps({"custom_id": "c0", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "m", "messages": [{"role": "user", "content": "c0"}]}})


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with in_process_bucket(monkeypatch, BUCKET) as client:
        yield client


def open_files(make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient],
               **overrides: Any) -> httpx.AsyncClient:
    return open_client(make_app(files_bucket=BUCKET, max_upload_bytes=64 * 1024, **overrides))


async def upload_file(client: httpx.AsyncClient, data: bytes, headers: dict[str, str] = A) -> httpx.Response:
    return await client.post("/v1/files", headers=headers, files={"file": ("in.jsonl", data)},
                             data={"purpose": "batch"})


async def open_upload(client: httpx.AsyncClient, size: int) -> str:
    opened = await client.post("/v1/uploads", headers=A, json={"filename": "big.jsonl", "purpose": "batch",
                                                               "bytes": size})
    assert opened.status_code == 200, opened.text
    return str(opened.json()["id"])


async def add_part(client: httpx.AsyncClient, upload_id: str, data: bytes) -> httpx.Response:
    return await client.post(f"/v1/uploads/{upload_id}/parts", headers=A, files={"data": ("blob", data)})


# ---------------------------------------------------------------------- exact paging


async def test_batches_made_in_one_millisecond_page_exactly_once_and_an_expired_after_keeps_its_place(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = open_files(make_app, open_client)
    file_id = (await upload_file(client, LINE.encode() + b"\n")).json()["id"]
    monkeypatch.setattr("inferq.batches.records.time.time", lambda: 1_800_000_000.123)  # every batch in one millisecond
    made = [await Batches(queue).create("tenant-a", file_id, "/v1/chat/completions", "24h", None) for _ in range(7)]
    monkeypatch.undo()
    seen: list[str] = []
    after = None
    while True:
        page = (await client.get("/v1/batches", headers=A, params={"limit": 2, **({"after": after} if after else {})}))
        body = page.json()
        seen += [b["id"] for b in body["data"]]
        if not body["has_more"]:
            break
        after = body["last_id"]
    assert sorted(seen) == sorted(b.id for b in made) and len(seen) == len(set(seen)) == 7

    # the record named by `after` expires between two pages: the next page starts where it stood
    first = (await client.get("/v1/batches", headers=A, params={"limit": 3})).json()
    await queue.redis.delete(queue.keys.batch(first["last_id"]))
    rest = (await client.get("/v1/batches", headers=A, params={"after": first["last_id"]})).json()
    assert [b["id"] for b in rest["data"]] == seen[3:] and rest["has_more"] is False
    # a batch id the index never held (another tenant's, or forgotten long ago): a clear 422, not an empty page
    theirs = (await Batches(queue).create("tenant-b", file_id, "/v1/chat/completions", "24h", None)).id
    unknown = await client.get("/v1/batches", headers=A, params={"after": theirs})
    assert_envelope(unknown, 422, "invalid_cursor")


async def test_files_page_exactly_once_and_a_deleted_after_keeps_its_place(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    client = open_files(make_app, open_client)
    # uploaded at once: the same second (and, for S3, the same millisecond) for many of them
    made = await asyncio.gather(*(upload_file(client, b"{}\n") for _ in range(7)))
    ids = sorted(r.json()["id"] for r in made)
    seen: list[str] = []
    after = None
    while True:
        body = (await client.get("/v1/files", headers=A, params={"limit": 3, **({"after": after} if after else {})}))
        seen += [f["id"] for f in body.json()["data"]]
        if not body.json()["has_more"]:
            break
        after = body.json()["last_id"]
    assert seen == ids
    assert (await client.delete(f"/v1/files/{ids[2]}", headers=A)).status_code == 200
    rest = (await client.get("/v1/files", headers=A, params={"after": ids[2]})).json()
    assert [f["id"] for f in rest["data"]] == ids[3:] and rest["has_more"] is False


# ---------------------------------------------------------------------- the feed's cursor


async def test_the_feed_cursor_is_sealed_for_its_tenant_and_reveals_no_other_tenants_traffic(
    client: httpx.AsyncClient, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient],
    queue: Queue,
) -> None:
    start = (await client.get("/v1/events", headers=A)).json()["cursor"]
    again = (await client.get("/v1/events", headers=A, params={"after": start})).json()["cursor"]
    theirs = [await submit(client, B) for _ in range(3)]
    for job_id in theirs:
        await client.post(f"/v1/jobs/{job_id}/cancel", headers=B)
    after_theirs = (await client.get("/v1/events", headers=A, params={"after": start})).json()
    assert after_theirs["data"] == []
    entries = [entry_id for entry_id, _ in await queue.redis.xrange(queue.keys.events)]
    cursors = [start, again, after_theirs["cursor"]]
    # a fresh nonce each time: equal positions look unrelated, and no stream id shows through
    assert len(set(cursors)) == 3 and len({len(c) for c in cursors}) == 1
    assert not any(part in c for c in cursors for e in entries for part in e.split("-") if len(part) > 3)
    # B's own cursor finds B's jobs; A's cursor is A's alone; a changed character is refused
    b_start = (await client.get("/v1/events", headers=B)).json()
    assert sorted(j["id"] for j in b_start["data"]) == sorted(theirs)
    assert_envelope(await client.get("/v1/events", headers=B, params={"after": start}), 422, "invalid_cursor")
    tampered = start[:-2] + ("A" if start[-2] != "A" else "B") + start[-1]
    assert_envelope(await client.get("/v1/events", headers=A, params={"after": tampered}), 422, "invalid_cursor")
    # another gateway (another Lambda, another process) reads the same cursor: the key is the deployment's, in Redis
    mine = await submit(client, A)
    await client.post(f"/v1/jobs/{mine}/cancel", headers=A)
    other_gateway = open_client(make_app())
    page = (await other_gateway.get("/v1/events", headers=A, params={"after": after_theirs["cursor"]})).json()
    assert [j["id"] for j in page["data"]] == [mine]
    # a bare stream position is not a cursor
    assert_envelope(await client.get("/v1/events", headers=A, params={"after": "0-0"}), 422, "invalid_cursor")


# ---------------------------------------------------------------------- quotas on uploads


async def test_an_upload_within_the_file_quota_when_opened_but_over_it_when_completed_is_refused(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    client = open_files(make_app, open_client, tenant_max_files=1)
    upload_id = await open_upload(client, 3)
    part = (await add_part(client, upload_id, b"{}\n")).json()["id"]
    kept = await upload_file(client, b"{}\n")  # the quota's one file, while the upload is open
    assert kept.status_code == 200
    over = await client.post(f"/v1/uploads/{upload_id}/complete", headers=A, json={"part_ids": [part]})
    assert_envelope(over, 429, "quota_exceeded")
    assert "INFERQ_TENANT_MAX_FILES" in over.json()["error"]["message"]
    assert [f["id"] for f in (await client.get("/v1/files", headers=A)).json()["data"]] == [kept.json()["id"]]
    # the upload stays open: delete a file, complete again
    assert (await client.delete(f"/v1/files/{kept.json()['id']}", headers=A)).status_code == 200
    done = await client.post(f"/v1/uploads/{upload_id}/complete", headers=A, json={"part_ids": [part]})
    assert done.status_code == 200 and done.json()["status"] == "completed"


async def test_uploads_completing_together_cannot_pass_the_file_quota_together(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    client = open_files(make_app, open_client, tenant_max_files=1)
    uploads = [await open_upload(client, 3) for _ in range(3)]
    parts = [(await add_part(client, u, b"{}\n")).json()["id"] for u in uploads]
    answers = await asyncio.gather(*(client.post(f"/v1/uploads/{u}/complete", headers=A, json={"part_ids": [p]})
                                     for u, p in zip(uploads, parts, strict=True)))
    assert all(a.status_code in (200, 429) for a in answers)
    stored = (await client.get("/v1/files", headers=A)).json()["data"]
    assert len(stored) == sum(a.status_code == 200 for a in answers) <= 1


async def test_one_upload_completed_twice_at_once_makes_one_file(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    client = open_files(make_app, open_client)
    upload_id = await open_upload(client, 3)
    part = (await add_part(client, upload_id, b"{}\n")).json()["id"]
    answers = await asyncio.gather(*(client.post(f"/v1/uploads/{upload_id}/complete", headers=A,
                                                 json={"part_ids": [part]}) for _ in range(4)))
    assert sorted(a.status_code for a in answers) == [200, 409, 409, 409]
    assert len((await client.get("/v1/files", headers=A)).json()["data"]) == 1
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="uploads/").get("KeyCount") == 0


async def test_an_upload_move_is_won_once_and_a_resent_copy_answers_the_same(queue: Queue) -> None:
    key = queue.keys.upload("upload_x")
    await queue.redis.hset(key, mapping={"status": "pending", "tenant": "t"})
    await queue.redis.expire(key, 100)
    first = await queue.scripts("moveupload", [key], ["pending", "completing", "request-1"])
    resent = await queue.scripts("moveupload", [key], ["pending", "completing", "request-1"])
    other = await queue.scripts("moveupload", [key], ["pending", "completing", "request-2"])
    assert (int(first[0]), int(resent[0]), int(other[0])) == (1, 1, 0) and other[1] == "completing"
    assert 0 < await queue.redis.ttl(key) <= 100


async def test_the_bytes_quota_counts_files_and_open_uploads_parts(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    client = open_files(make_app, open_client, tenant_max_file_bytes=100)
    upload_id = await open_upload(client, 60)
    part = (await add_part(client, upload_id, b"x" * 60)).json()["id"]
    over = await upload_file(client, b"y" * 50)  # 60 bytes of parts + 50 > 100
    assert_envelope(over, 429, "quota_exceeded")
    assert "INFERQ_TENANT_MAX_FILE_BYTES" in over.json()["error"]["message"]
    assert_envelope(await client.post("/v1/uploads", headers=A, json={"filename": "x", "purpose": "batch",
                                                                      "bytes": 41}), 429, "quota_exceeded")
    assert (await upload_file(client, b"y" * 40)).status_code == 200  # exactly at the bound
    assert (await upload_file(client, b"{}\n", headers=B)).status_code == 200  # another tenant's bytes are its own
    done = await client.post(f"/v1/uploads/{upload_id}/complete", headers=A, json={"part_ids": [part]})
    assert done.status_code == 200, done.text  # the parts' bytes become the file's: counted once
    assert_envelope(await upload_file(client, b"z"), 429, "quota_exceeded")


async def test_upload_parts_are_bounded_and_never_write_an_expired_record(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = open_files(make_app, open_client)
    upload_id = await open_upload(client, 10)
    assert_envelope(await add_part(client, upload_id, b""), 422)
    monkeypatch.setattr(upload_routes, "MAX_PARTS", 2)
    assert (await add_part(client, upload_id, b"a")).status_code == 200
    assert (await add_part(client, upload_id, b"b")).status_code == 200
    assert_envelope(await add_part(client, upload_id, b"c"), 422)
    key = queue.keys.upload(upload_id)
    assert 0 < await queue.redis.ttl(key) <= upload_routes.UPLOAD_TTL_S
    # the record expires (here: now); no write brings it back, with or without a TTL
    await queue.redis.delete(key)
    monkeypatch.setattr(upload_routes, "MAX_PARTS", 10)
    record = {"id": upload_id, "tenant": "tenant-a", "filename": "x", "purpose": "batch", "bytes": "10",
              "created_at": "1", "status": "pending"}
    # a part request that read the record just before it expired writes into nothing
    storage = [queue.keys.storage("tenant-a"), queue.keys.storage_open("tenant-a")]
    reply = await queue.scripts("addpart", [key, queue.keys.bounds, *storage], ["part:part_x", 1, 10, 0, 0])
    assert int(reply[0]) == -1 and not await queue.redis.exists(key)
    assert int((await queue.scripts("moveupload", [key], ["pending", "completed", "token"]))[0]) == -1
    assert not await queue.redis.exists(key)
    assert_envelope(await add_part(client, upload_id, b"d"), 404)
    assert_envelope(await client.post(f"/v1/uploads/{upload_id}/cancel", headers=A), 404)
    assert not await queue.redis.exists(key)
    # a record written again by hand keeps its TTL through a part
    await queue.redis.hset(key, mapping=record)
    await queue.redis.expire(key, 100)
    assert (await add_part(client, upload_id, b"e")).status_code == 200
    assert 0 < await queue.redis.ttl(key) <= 100
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="uploads/").get("KeyCount") == 3  # refused parts not kept



async def test_an_open_upload_and_its_parts_are_charged_to_the_tenant_and_none_opens_at_its_quota(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue,
) -> None:
    """G11: an upload's record lives an hour in the cache; opened at the rate limit, records with 512-character
    file names would hold hundreds of MB per tenant. Each is charged to the tenant's retained-records quota
    (openupload.lua, and each part by addpart.lua) until it expires; at the quota 429 quota_exceeded."""
    client = open_files(make_app, open_client)
    upload_id = await open_upload(client, 10)
    key = queue.keys.upload(upload_id)
    kept = int(await queue.redis.hget(queue.keys.bounds, "tenant-a|kept") or 0)
    assert kept >= int(await queue.redis.memory_usage(key, samples=0) or 0) + 1024
    hour = await queue.redis.hget(key, "held_hour")
    assert int(await queue.redis.hget(queue.keys.bounds, f"tenant-a|{hour}") or 0) == kept
    assert (await add_part(client, upload_id, b"a")).status_code == 200
    parted = int(await queue.redis.hget(queue.keys.bounds, "tenant-a|kept") or 0)
    assert parted - kept >= 64  # a part field's own cost
    # resent: the same answer, charged once
    args = ["tenant-a", 0, 3600, 0, "id", upload_id]
    assert [int(x) for x in await queue.scripts("openupload", [key, queue.keys.bounds], args)] == [1, kept]
    assert int(await queue.redis.hget(queue.keys.bounds, "tenant-a|kept") or 0) == parted

    full = open_files(make_app, open_client, tenant_max_retained_bytes=parted)
    refused = await full.post("/v1/uploads", headers=A, json={
        "filename": "big.jsonl", "purpose": "batch", "bytes": 10, "mime_type": "application/jsonl"})
    assert_envelope(refused, 429, "quota_exceeded")
    assert 1 <= int(refused.headers["Retry-After"]) <= 2 * 3600
    assert (await full.post("/v1/uploads", headers=B, json={
        "filename": "big.jsonl", "purpose": "batch", "bytes": 10, "mime_type": "application/jsonl"})).status_code == 200


# ---------------------------------------------------------------------- redrive


async def test_redrive_obeys_the_queue_depth_and_the_tenants_quota(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    client = open_client(make_app(max_queue_depth=3, tenant_max_depth=2))
    dead = await submit(client, A)
    await dead_letter(queue, dead)
    mine = [await submit(client, A) for _ in range(2)]  # A's quota is full
    over_quota = await client.post(f"/v1/dlq/{dead}/redrive", headers=A)
    assert_envelope(over_quota, 429)
    assert int(over_quota.headers["retry-after"]) > 0
    assert (await queue.get(dead)).dead_lettered  # type: ignore[union-attr]  # untouched
    await client.post(f"/v1/jobs/{mine[0]}/cancel", headers=A)
    await submit(client, B)
    await submit(client, B)  # the queue is full (3 unfinished), A's quota is not
    over_depth = await client.post(f"/v1/dlq/{dead}/redrive", headers=A)
    assert_envelope(over_depth, 429)
    assert int(over_depth.headers["retry-after"]) > 0
    await client.post(f"/v1/jobs/{mine[1]}/cancel", headers=A)
    redriven = await client.post(f"/v1/dlq/{dead}/redrive", headers=A)
    assert redriven.status_code == 202 and redriven.json()["status"] == "queued"


# ---------------------------------------------------------------------- readiness


async def test_readyz_is_503_while_s3_or_the_bucket_is_missing(
    s3_server: MotoS3, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]  # noqa: F811
) -> None:
    bucket = "inferq-readyz"
    client = open_client(make_app(files_bucket=bucket))
    no_bucket = await client.get("/readyz")
    assert_envelope(no_bucket, 503, "files_unavailable")
    assert int(no_bucket.headers["retry-after"]) > 0
    s3_server.client().create_bucket(Bucket=bucket)
    assert (await client.get("/readyz")).status_code == 200
    s3_server.stop()
    try:
        down = await client.get("/readyz")
        assert_envelope(down, 503, "files_unavailable")
        assert int(down.headers["retry-after"]) > 0
    finally:
        s3_server.start()
    assert (await client.get("/readyz")).status_code == 200
    assert (await open_client(make_app()).get("/readyz")).status_code == 200  # no bucket set: Redis alone
