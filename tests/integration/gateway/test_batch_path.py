"""The whole batch path on real Valkey and moto's S3 (in process): files uploaded and batches created through the
gateway's API, the scaler's batch driver, this test acting as the worker, output read back through the API. Random
input files (hypothesis) end with every line in exactly one of the output or error file, and the batch of another
tenant made afterwards completes; a batch's input file cannot be deleted while the batch runs."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from functions.gateway.api import create_app
from functions.storage import FileStore
from inferq.batches.driver import BatchDriver
from inferq.config.settings import Settings
from inferq.queue.holds import RECORD_OVERHEAD_BYTES
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from tests.support.s3 import in_process_bucket

from .conftest import AppFactory
from .support import KEYS, A, B

BUCKET = "inferq-batch-path"
MAX_BODY = 4096
ENDED = {"completed", "failed", "expired", "cancelled"}


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with in_process_bucket(monkeypatch, BUCKET) as client:
        yield client


def request(custom_id: str, content: str = "hi", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": content}], **body}}


async def upload(client: httpx.AsyncClient, data: bytes, headers: dict[str, str]) -> str:
    response = await client.post("/v1/files", headers=headers, files={"file": ("in.jsonl", data)},
                                 data={"purpose": "batch"})
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def create_batch(client: httpx.AsyncClient, file_id: str, headers: dict[str, str]) -> str:
    response = await client.post("/v1/batches", headers=headers, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def work_off(queue: Queue) -> None:
    """Act as a worker: a body asking for ``mock.fatal`` fails, every other succeeds."""
    while True:
        deliveries, _ = await queue.read("test-worker", 500)
        if not deliveries:
            return
        await queue.finish_many([
            (d, JobStatus.FAILED, None, {"type": "model_error", "message": "refused"})
            if isinstance(d.job.body.get("mock"), dict) and d.job.body["mock"].get("fatal")
            else (d, JobStatus.SUCCEEDED, {"status_code": 200, "body": {"ok": True}}, None)
            for d in deliveries])


async def run_to_end(client: httpx.AsyncClient, driver: BatchDriver, queue: Queue,
                     batches: list[tuple[str, dict[str, str]]]) -> list[dict[str, Any]]:
    for _ in range(20):
        await driver.run_once()
        await work_off(queue)
        found = [(await client.get(f"/v1/batches/{b}", headers=h)).json() for b, h in batches]
        if all(x["status"] in ENDED for x in found):
            return found
    raise AssertionError(f"batches did not end: {found}")


async def lines_of(client: httpx.AsyncClient, file_id: str | None, headers: dict[str, str]) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    response = await client.get(f"/v1/files/{file_id}/content", headers=headers)
    assert response.status_code == 200
    return [json.loads(x) for x in response.content.splitlines() if x.strip()]


# ---------------------------------------------------------------------- random input files


@dataclass(frozen=True)
class Drawn:
    data: bytes
    custom_id: str | None
    """What the line's output or error line names (None: the line has no readable custom_id)."""
    blank: bool = False


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


IDS = st.sampled_from(["a", "b", "c", "d", "e", "f", "g"])  # few: duplicates are common

RUNNABLE = st.one_of(  # lines that pass validation: each runs, or fails alone
    st.integers(0, 10**6).map(lambda n: Drawn(_dumps(request(f"u{n}")), f"u{n}")),
    st.integers(0, 10**6).map(lambda n: Drawn(_dumps(request(f"u{n}", mock={"fatal": True})), f"u{n}")),
    st.integers(0, 10**6).map(lambda n: Drawn(_dumps(request(f"u{n}", "x" * (MAX_BODY + 10))), f"u{n}")),
    st.integers(0, 10**6).map(lambda n: Drawn(_dumps(request(f"u{n}", "y" * 1500)), f"u{n}")),
    st.sampled_from([b"", b"   "]).map(lambda b: Drawn(b, None, blank=True)),
)
LINES = st.one_of(
    RUNNABLE,
    IDS.map(lambda c: Drawn(_dumps(request(c)), c)),
    IDS.map(lambda c: Drawn(_dumps({**request(c), "url": "/v1/embeddings"}), c)),
    IDS.map(lambda c: Drawn(_dumps({**request(c), "method": "GET"}), c)),
    IDS.map(lambda c: Drawn(_dumps({**request(c), "body": "text"}), c)),
    IDS.map(lambda c: Drawn(_dumps({"body": {"custom_id": "no", "pad": "x" * MAX_BODY}, "custom_id": c}), None)),
    IDS.map(lambda c: Drawn(_dumps(request(c)).replace(b'"hi"', b'"\\ud800 lone"'), c)),  # a lone surrogate
    IDS.map(lambda c: Drawn(_dumps(request(c, "x" * (MAX_BODY + 10))), c)),  # over the body limit
    IDS.map(lambda c: Drawn(_dumps(request(c, "y" * 1500)), c)),  # over the inline limit: claim-checked
    st.binary(min_size=1, max_size=40).map(lambda b: Drawn(b"\xff" + b.replace(b"\n", b""), None)),  # not UTF-8
    st.just(Drawn(b"[1, 2]", None)),
    st.just(Drawn(b'{"custom_id": 7}', None)),
    st.sampled_from([b"", b"   ", b"\t"]).map(lambda b: Drawn(b, None, blank=True)),
)


@st.composite
def input_files(draw: st.DrawFn) -> tuple[bytes, list[Drawn]]:
    if draw(st.booleans()):  # lines that all pass validation (unique custom_ids): the batch runs
        lines = draw(st.lists(RUNNABLE, min_size=1, max_size=25, unique_by=lambda x: x.custom_id or x.data))
    else:
        lines = draw(st.lists(LINES, min_size=1, max_size=25))
    crlf = draw(st.booleans())
    bom = draw(st.booleans())
    ending = b"\r\n" if crlf else b"\n"
    data = ending.join(x.data for x in lines) + (ending if draw(st.booleans()) else b"")
    if bom:
        data = b"\xef\xbb\xbf" + data
        if lines[0].blank:  # a BOM alone on a line is a line that is no JSON
            lines[0] = Drawn(b"\xef\xbb\xbf", None)
    return data, [x for x in lines if not x.blank]


def test_every_line_of_any_input_file_ends_in_exactly_one_file_and_the_next_tenant_completes(
    settings: Settings, s3: Any
) -> None:
    @given(drawn=input_files())
    @hypothesis_settings(max_examples=25, deadline=None, database=None, derandomize=True,
                         suppress_health_check=list(HealthCheck))
    def every_line_once(drawn: tuple[bytes, list[Drawn]]) -> None:
        ended.add(asyncio.run(one_file(settings, *drawn)))

    ended: set[str] = set()
    every_line_once()
    assert ended == {"completed", "failed"}, "files that run and files refused at validation were both drawn"


async def one_file(base: Settings, data: bytes, lines: list[Drawn]) -> str:
    """Run one input file through the path; how its batch ended."""
    settings = base.replace(queue="f" + uuid.uuid4().hex[:10], files_bucket=BUCKET, max_body_bytes=MAX_BODY,
                            inline_max_bytes=1024)
    app = create_app(settings, keys=KEYS)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
    try:
        queue = app.state.gateway.queue
        await queue.ensure_groups()
        driver = BatchDriver(queue, FileStore(BUCKET, None), settings)
        first = await create_batch(client, await upload(client, data, A), A)
        [batch] = await run_to_end(client, driver, queue, [(first, A)])
        output = await lines_of(client, batch["output_file_id"], A)
        errors = await lines_of(client, batch["error_file_id"], A)
        if not lines:
            assert batch["status"] == "failed" and batch["errors"]["data"][0]["code"] == "empty_file"
        else:
            assert batch["status"] in ("completed", "failed"), batch
            assert sorted(map(str, (x["custom_id"] for x in output + errors))) == sorted(
                map(str, (x.custom_id for x in lines))), "every line in exactly one of the two files"
            assert all(x["error"] is None and x["response"]["status_code"] == 200 for x in output)
            assert all(x["error"]["code"] and x["error"]["message"] for x in errors)
            if batch["status"] == "failed":
                assert output == [] and batch["errors"]["data"]
            else:
                assert batch["request_counts"] == {"total": len(lines), "completed": len(output),
                                                   "failed": len(errors)}
                assert all(x["job_id"] is None or x["job_id"].startswith("job_") for x in errors)

        # the next tenant's batch, made after that file, runs to completion
        second = await create_batch(client, await upload(client, b"\n".join(
            _dumps(request(f"b{i}")) for i in range(3)), B), B)
        [other] = await run_to_end(client, driver, queue, [(second, B)])
        assert other["status"] == "completed" and other["request_counts"]["completed"] == 3
        return str(batch["status"])
    finally:
        await client.aclose()
        await app.state.gateway.aclose()


# ---------------------------------------------------------------------- the input file while a batch runs


async def test_a_batchs_input_file_cannot_be_deleted_until_the_batch_ends(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    app = make_app(files_bucket=BUCKET)
    client = open_client(app)
    file_id = await upload(client, b"\n".join(_dumps(request(f"c{i}")) for i in range(3)), A)
    batch_id = await create_batch(client, file_id, A)
    refused = await client.delete(f"/v1/files/{file_id}", headers=A)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["type"] == "file_in_use" and batch_id in refused.json()["error"]["message"]
    assert (await client.get(f"/v1/files/{file_id}", headers=A)).status_code == 200
    assert (await client.delete(f"/v1/files/{file_id}", headers=B)).status_code == 404  # still another's

    gateway = app.state.gateway
    [batch] = await run_to_end(client, BatchDriver(gateway.queue, FileStore(BUCKET), gateway.settings),
                               gateway.queue, [(batch_id, A)])
    assert batch["status"] == "completed"
    deleted = await client.delete(f"/v1/files/{file_id}", headers=A)
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True


async def test_a_tenant_at_its_retained_quota_creates_no_batch(
    s3: Any, make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient]
) -> None:
    """G11: an ended job's or batch's record is charged to its tenant; at INFERQ_TENANT_MAX_RETAINED_BYTES a batch
    create is 429 quota_exceeded with Retry-After, as a submit is (another tenant's is not)."""
    client = open_client(make_app(files_bucket=BUCKET, tenant_max_retained_bytes=RECORD_OVERHEAD_BYTES))
    file_id = await upload(client, _dumps(request("c0")), A)
    other = await upload(client, _dumps(request("c0")), B)
    submitted = await client.post("/v1/jobs", headers=A, json={"body": request("c0")["body"]})
    assert (await client.post(f"/v1/jobs/{submitted.json()['id']}/cancel", headers=A)).status_code == 200
    refused = await client.post("/v1/batches", headers=A, json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "quota_exceeded", refused.text
    assert "INFERQ_TENANT_MAX_RETAINED_BYTES" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["Retry-After"]) <= 3600
    assert await create_batch(client, other, B)
