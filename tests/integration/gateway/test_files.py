"""Files, Uploads, Batches and the results feed through the gateway app, on real Valkey and moto's S3 (in process):
tenancy, limits, and the shapes the ``openai`` client reads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.support.s3 import in_process_bucket

from .conftest import AppFactory
from .support import CHAT, A, B

BUCKET = "inferq-gateway-files"
LINE = json.dumps({"custom_id": "c0", "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "m", "messages": [{"role": "user", "content": "c0"}]}})


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with in_process_bucket(monkeypatch, BUCKET) as client:
        yield client


@pytest.fixture
def files(s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]) -> httpx.AsyncClient:
    return open_client(make_app(files_bucket=BUCKET, max_upload_bytes=64 * 1024, max_file_bytes=1024 * 1024,
                                batch_completion_windows=("24h", "1h")))


async def upload(client: httpx.AsyncClient, data: bytes, headers: dict[str, str] = A) -> dict[str, Any]:
    response = await client.post("/v1/files", headers=headers, files={"file": ("in.jsonl", data)},
                                 data={"purpose": "batch"})
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_file_is_its_tenants_alone(files: httpx.AsyncClient, s3: Any) -> None:
    created = await upload(files, LINE.encode() + b"\n")
    assert created["object"] == "file" and created["bytes"] == len(LINE) + 1 and created["filename"] == "in.jsonl"
    file_id = created["id"]
    assert (await files.get(f"/v1/files/{file_id}", headers=A)).json() == created
    assert (await files.get(f"/v1/files/{file_id}/content", headers=A)).content == LINE.encode() + b"\n"
    for method, path in (("GET", f"/v1/files/{file_id}"), ("GET", f"/v1/files/{file_id}/content"),
                         ("DELETE", f"/v1/files/{file_id}"), ("GET", "/v1/files/file-nonsense")):
        response = await files.request(method, path, headers=B)
        assert response.status_code == 404 and response.json()["error"]["type"] == "not_found"
    assert (await files.get("/v1/files", headers=B)).json()["data"] == []
    listing = (await files.get("/v1/files", headers=A)).json()
    assert [f["id"] for f in listing["data"]] == [file_id] and listing["has_more"] is False
    deleted = await files.delete(f"/v1/files/{file_id}", headers=A)
    assert deleted.json() == {"id": file_id, "object": "file", "deleted": True}
    assert (await files.get(f"/v1/files/{file_id}", headers=A)).status_code == 404
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    assert keys == []


async def test_files_list_pages_with_after(files: httpx.AsyncClient) -> None:
    ids = sorted([(await upload(files, b"{}\n"))["id"] for _ in range(3)])
    first = (await files.get("/v1/files", headers=A, params={"limit": 2})).json()
    assert [f["id"] for f in first["data"]] == ids[:2] and first["has_more"] is True
    rest = (await files.get("/v1/files", headers=A, params={"limit": 2, "after": first["last_id"]})).json()
    assert [f["id"] for f in rest["data"]] == ids[2:] and rest["has_more"] is False


async def test_file_limits_and_purpose(files: httpx.AsyncClient, make_app: AppFactory,
                                       open_client: Callable[[FastAPI], httpx.AsyncClient]) -> None:
    too_big = await files.post("/v1/files", headers=A, files={"file": ("x", b"x" * 200_000)},
                               data={"purpose": "batch"})
    assert too_big.status_code == 413 and too_big.json()["error"]["type"] == "request_too_large"
    wrong = await files.post("/v1/files", headers=A, files={"file": ("x", b"{}")}, data={"purpose": "fine-tune"})
    assert wrong.status_code == 422
    missing = await files.post("/v1/files", headers=A, data={"purpose": "batch"})
    assert missing.status_code == 422
    no_bucket = open_client(make_app())
    answer = await no_bucket.get("/v1/files", headers=A)
    assert answer.status_code == 503 and answer.json()["error"]["type"] == "files_unavailable"
    unauthenticated = await files.get("/v1/files")
    assert unauthenticated.status_code == 401


async def test_an_upload_assembles_its_parts_in_the_order_given(files: httpx.AsyncClient) -> None:
    parts_data = [b"a" * 50_000, b"b" * 50_000, b"c" * 10]
    opened = await files.post("/v1/uploads", headers=A, json={"filename": "big.jsonl", "purpose": "batch",
                                                              "bytes": 100_010, "mime_type": "application/jsonl"})
    assert opened.status_code == 200 and opened.json()["status"] == "pending"
    upload_id = opened.json()["id"]
    part_ids = []
    for data in parts_data:
        part = await files.post(f"/v1/uploads/{upload_id}/parts", headers=A, files={"data": ("blob", data)})
        assert part.status_code == 200 and part.json()["object"] == "upload.part"
        part_ids.append(part.json()["id"])
    other = await files.post(f"/v1/uploads/{upload_id}/parts", headers=B, files={"data": ("blob", b"x")})
    assert other.status_code == 404
    overflow = await files.post(f"/v1/uploads/{upload_id}/parts", headers=A, files={"data": ("blob", b"x")})
    assert overflow.status_code == 422, "the parts may not hold more than the upload's bytes"
    short = await files.post(f"/v1/uploads/{upload_id}/complete", headers=A, json={"part_ids": part_ids[:2]})
    assert short.status_code == 422
    order = [part_ids[1], part_ids[0], part_ids[2]]
    done = await files.post(f"/v1/uploads/{upload_id}/complete", headers=A, json={"part_ids": order})
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["status"] == "completed" and body["file"]["bytes"] == 100_010
    content = (await files.get(f"/v1/files/{body['file']['id']}/content", headers=A)).content
    assert content == parts_data[1] + parts_data[0] + parts_data[2]
    again = await files.post(f"/v1/uploads/{upload_id}/cancel", headers=A)
    assert again.status_code == 409 and again.json()["error"]["type"] == "upload_not_pending"
    huge = await files.post("/v1/uploads", headers=A, json={"filename": "x", "purpose": "batch", "bytes": 10**9,
                                                            "mime_type": "application/jsonl"})
    assert huge.status_code == 422


async def test_a_cancelled_upload_keeps_no_parts(files: httpx.AsyncClient, s3: Any) -> None:
    opened = (await files.post("/v1/uploads", headers=A, json={"filename": "x", "purpose": "batch", "bytes": 3,
                                                               "mime_type": "application/jsonl"})).json()
    await files.post(f"/v1/uploads/{opened['id']}/parts", headers=A, files={"data": ("blob", b"abc")})
    cancelled = await files.post(f"/v1/uploads/{opened['id']}/cancel", headers=A)
    assert cancelled.json()["status"] == "cancelled"
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="uploads/").get("KeyCount") == 0


async def test_a_batch_is_its_tenants_alone(files: httpx.AsyncClient) -> None:
    file_id = (await upload(files, LINE.encode() + b"\n"))["id"]
    created = await files.post("/v1/batches", headers=A, json={"input_file_id": file_id, "completion_window": "24h",
                                                               "endpoint": "/v1/chat/completions"})
    assert created.status_code == 200, created.text
    batch = created.json()
    assert batch["status"] == "validating" and batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert batch["expires_at"] == batch["created_at"] + 86400
    assert (await files.get(f"/v1/batches/{batch['id']}", headers=B)).status_code == 404
    assert (await files.post(f"/v1/batches/{batch['id']}/cancel", headers=B)).status_code == 404
    assert (await files.get("/v1/batches", headers=B)).json()["data"] == []
    of_other = await files.post("/v1/batches", headers=B, json={"input_file_id": file_id, "completion_window": "24h",
                                                                "endpoint": "/v1/chat/completions"})
    assert of_other.status_code == 404
    bad_window = await files.post("/v1/batches", headers=A, json={"input_file_id": file_id,
                                                                  "completion_window": "48h",
                                                                  "endpoint": "/v1/chat/completions"})
    assert bad_window.status_code == 422
    cancelled = await files.post(f"/v1/batches/{batch['id']}/cancel", headers=A)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelling"
    assert (await files.post(f"/v1/batches/{batch['id']}/cancel", headers=A)).json()["status"] == "cancelling"


async def test_a_batchs_metadata_is_bounded_as_a_jobs(files: httpx.AsyncClient) -> None:
    file_id = (await upload(files, LINE.encode() + b"\n"))["id"]
    request = {"input_file_id": file_id, "completion_window": "24h", "endpoint": "/v1/chat/completions"}
    at_bounds = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    created = await files.post("/v1/batches", headers=A, json={**request, "metadata": at_bounds})
    assert created.status_code == 200 and created.json()["metadata"] == at_bounds, created.text
    for metadata, bound in (({**at_bounds, "one more": "v"}, "at most 16 pairs"), ({"k" * 65: "v"}, "keys are 1-64"),
                            ({"k": "v" * 513}, "values are at most 512")):
        refused = await files.post("/v1/batches", headers=A, json={**request, "metadata": metadata})
        assert refused.status_code == 422 and bound in refused.json()["error"]["message"], refused.text


async def test_batches_list_newest_first_with_after(files: httpx.AsyncClient) -> None:
    file_id = (await upload(files, LINE.encode()))["id"]
    ids = []
    for _ in range(3):
        response = await files.post("/v1/batches", headers=A, json={
            "input_file_id": file_id, "completion_window": "1h", "endpoint": "/v1/chat/completions"})
        ids.append(response.json()["id"])
        await asyncio.sleep(0.005)  # distinct creation times
    first = (await files.get("/v1/batches", headers=A, params={"limit": 2})).json()
    assert [b["id"] for b in first["data"]] == ids[::-1][:2] and first["has_more"] is True
    rest = (await files.get("/v1/batches", headers=A, params={"after": first["last_id"]})).json()
    assert [b["id"] for b in rest["data"]] == [ids[0]] and rest["has_more"] is False


async def test_the_feed_is_the_tenants_terminal_jobs_in_order_with_a_cursor(client: httpx.AsyncClient) -> None:
    mine = [(await client.post("/v1/jobs", headers=A, json=CHAT)).json()["id"] for _ in range(5)]
    theirs = (await client.post("/v1/jobs", headers=B, json=CHAT)).json()["id"]
    start = (await client.get("/v1/events", headers=A)).json()
    assert start["data"] == [] and start["has_more"] is False
    cursor = start["cursor"]
    cursor_b = (await client.get("/v1/events", headers=B)).json()["cursor"]
    for job_id in [mine[2], theirs, mine[0], mine[4], mine[1], mine[3]]:
        await client.post(f"/v1/jobs/{job_id}/cancel", headers=A if job_id != theirs else B)
    first = (await client.get("/v1/events", headers=A, params={"after": cursor, "limit": 3})).json()
    assert [j["id"] for j in first["data"]] == [mine[2], mine[0], mine[4]] and first["has_more"] is True
    assert all(j["status"] == "cancelled" for j in first["data"])
    rest = (await client.get("/v1/events", headers=A, params={"after": first["cursor"], "limit": 3})).json()
    assert [j["id"] for j in rest["data"]] == [mine[1], mine[3]]
    other = (await client.get("/v1/events", headers=B, params={"after": cursor_b})).json()
    assert [j["id"] for j in other["data"]] == [theirs]
    assert (await client.get("/v1/events", headers=B, params={"after": cursor})).status_code == 422  # A's alone
    bad = await client.get("/v1/events", headers=A, params={"after": "not-a-cursor"})
    assert bad.status_code == 422


async def test_the_feed_waits_for_the_next_terminal_job(client: httpx.AsyncClient) -> None:
    cursor = (await client.get("/v1/events", headers=A)).json()["cursor"]
    job_id = (await client.post("/v1/jobs", headers=A, json=CHAT)).json()["id"]

    async def cancel_later() -> None:
        await asyncio.sleep(0.5)
        await client.post(f"/v1/jobs/{job_id}/cancel", headers=A)

    task = asyncio.create_task(cancel_later())
    page = (await client.get("/v1/events", headers=A, params={"after": cursor, "wait": 10}, timeout=30)).json()
    await task
    assert [j["id"] for j in page["data"]] == [job_id]


# ---------------------------------------------------------------------- quotas


async def test_the_file_quota_answers_429_until_a_file_is_deleted(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    client = open_client(make_app(files_bucket=BUCKET, tenant_max_files=2))
    kept = [await upload(client, b"{}\n") for _ in range(2)]
    over = await client.post("/v1/files", headers=A, files={"file": ("in.jsonl", b"{}\n")}, data={"purpose": "batch"})
    assert over.status_code == 429 and over.json()["error"]["type"] == "quota_exceeded"
    assert "INFERQ_TENANT_MAX_FILES" in over.json()["error"]["message"]
    assert "retry-after" not in over.headers  # time frees nothing; deleting does
    opened = await client.post("/v1/uploads", headers=A, json={"filename": "big.jsonl", "purpose": "batch",
                                                                "bytes": 2048})
    assert opened.status_code == 429 and opened.json()["error"]["type"] == "quota_exceeded"
    await upload(client, b"{}\n", headers=B)  # another tenant's count is its own
    assert (await client.delete(f"/v1/files/{kept[0]['id']}", headers=A)).status_code == 200
    await upload(client, b"{}\n")
    assert len((await client.get("/v1/files", headers=A)).json()["data"]) == 2


async def test_the_batch_quota_counts_batches_not_ended_and_answers_429_with_retry_after(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    from functions.storage import FileStore
    from inferq.batches.driver import BatchDriver

    app = make_app(files_bucket=BUCKET, tenant_max_batches=2)
    client = open_client(app)
    file_id = (await upload(client, LINE.encode() + b"\n"))["id"]
    other_file = (await upload(client, LINE.encode() + b"\n", headers=B))["id"]
    request = {"input_file_id": file_id, "completion_window": "24h", "endpoint": "/v1/chat/completions"}

    first, second = [(await client.post("/v1/batches", headers=A, json=request)).json() for _ in range(2)]
    over = await client.post("/v1/batches", headers=A, json=request)
    assert over.status_code == 429 and over.json()["error"]["type"] == "quota_exceeded"
    assert int(over.headers["retry-after"]) > 0 and "INFERQ_TENANT_MAX_BATCHES" in over.json()["error"]["message"]
    of_b = await client.post("/v1/batches", headers=B, json={**request, "input_file_id": other_file})
    assert of_b.status_code == 200  # B has none running

    # a cancelled batch is still counted until the driver has ended it, then its place is free
    assert (await client.post(f"/v1/batches/{first['id']}/cancel", headers=A)).json()["status"] == "cancelling"
    assert (await client.post("/v1/batches", headers=A, json=request)).status_code == 429
    gateway = app.state.gateway
    await BatchDriver(gateway.queue, FileStore(BUCKET), gateway.settings).run_once()
    assert (await client.get(f"/v1/batches/{first['id']}", headers=A)).json()["status"] == "cancelled"
    third = await client.post("/v1/batches", headers=A, json=request)
    assert third.status_code == 200 and third.json()["id"] not in (first["id"], second["id"])
