"""Files, Uploads, Batches and the results feed through the official ``openai`` client against ``inferq up`` (mock
backend, moto's S3)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import APIStatusError, NotFoundError, OpenAI

from tests.support.waiting import eventually

from .conftest import Emulator, running_emulator

pytestmark = pytest.mark.timeout(600)

BATCH_ENV = {"INFERQ_BATCH_COMPLETION_WINDOWS": "24h,20s", "INFERQ_WINDOW": "16"}
TERMINAL_BATCH = {"completed", "failed", "expired", "cancelled"}


@pytest.fixture(scope="module")
def batch_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    with running_emulator(tmp_path_factory, **BATCH_ENV) as stack:
        yield stack


def client_for(stack: Emulator) -> OpenAI:
    key = (stack.data_dir / "dev-api-key").read_text().strip()
    return OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0, timeout=60)


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def request_line(n: int, **mock: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "mock", "messages": [{"role": "user", "content": f"line {n}"}]}
    if mock:
        body["mock"] = mock
    return {"custom_id": f"req-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def finish(client: OpenAI, batch_id: str, timeout: float = 300.0) -> Any:
    def ended() -> Any:
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in TERMINAL_BATCH else None

    return eventually(ended, what=f"batch {batch_id} to end", timeout=timeout, interval=0.5)


def lines_of(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).content.splitlines() if line.strip()]


def test_a_batch_answers_every_custom_id_once(batch_stack: Emulator) -> None:
    client = client_for(batch_stack)
    n = 10_000
    lines = [request_line(i) for i in range(n - 1)] + [request_line(n - 1, fatal=True)]
    uploaded = client.files.create(file=("input.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    assert client.files.retrieve(uploaded.id).filename == "input.jsonl"
    assert uploaded.id in {f.id for f in client.files.list()}

    started = time.monotonic()
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"run": "e2e"})
    assert batch.status == "validating" and batch.metadata == {"run": "e2e"}
    batch = finish(client, batch.id)
    took = time.monotonic() - started
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (n, n - 1, 1)
    for stamp in ("created_at", "in_progress_at", "finalizing_at", "completed_at", "expires_at"):
        assert getattr(batch, stamp), stamp

    output = lines_of(client, batch.output_file_id)
    errors = lines_of(client, batch.error_file_id)
    answered = [line["custom_id"] for line in output + errors]
    assert sorted(answered) == sorted(f"req-{i}" for i in range(n)), "every custom_id answered exactly once"
    good = next(line for line in output if line["custom_id"] == "req-7")
    assert good["error"] is None and good["id"].startswith("batch_req_")
    assert good["response"]["status_code"] == 200 and good["response"]["request_id"].startswith("job_")
    assert good["response"]["body"]["choices"][0]["message"]["content"].endswith("line 7")
    assert errors[0]["custom_id"] == f"req-{n - 1}" and errors[0]["error"]["code"]
    assert batch.id in {b.id for b in client.batches.list(limit=100)}
    gateway = next(pid for pid, cmd in batch_stack.processes().items() if "functions.gateway.app:app" in cmd)
    status = Path(f"/proc/{gateway}/status").read_text().splitlines()
    peak = next(line for line in status if line.startswith("VmHWM")).split(":")[1].strip()
    print(f"\n{n}-line batch: {took:.1f}s end to end, {n / took:.0f} lines/s; gateway peak RSS {peak}")

    client.files.delete(uploaded.id)
    with pytest.raises(NotFoundError):
        client.files.retrieve(uploaded.id)


def test_an_invalid_file_fails_the_batch_with_line_errors(batch_stack: Emulator) -> None:
    client = client_for(batch_stack)
    lines = [request_line(0), request_line(0), {**request_line(2), "url": "/v1/completions"},
             {**request_line(3), "method": "GET"}, {**request_line(4), "body": "text"}]
    data = jsonl(lines) + b"not json\n"
    uploaded = client.files.create(file=("bad.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    batch = finish(client, batch.id, timeout=120)
    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data is not None
    found = {(e.code, e.line) for e in batch.errors.data}
    assert found == {("duplicate_custom_id", 2), ("mismatched_endpoint", 3), ("invalid_method", 4),
                     ("invalid_body", 5), ("invalid_json_line", 6)}


def test_cancel_mid_way_keeps_the_partial_output(batch_stack: Emulator) -> None:
    client = client_for(batch_stack)
    # the workers of the test before stop first: one that is scaled in just as this batch arrives gives back the
    # lines it read (a drain releases them to the end of their lane), and the batch's counts, which move over the
    # lines in file order, then stay at 0 until those lines run last, so "a few lines done" comes only at the end
    eventually(lambda: not batch_stack.workers(), what="the previous batch's workers to stop", timeout=60, interval=0.2)
    n = 400
    lines = [request_line(i, latency_ms=3000) for i in range(n)]  # long enough that the cancel finds lines queued
    uploaded = client.files.create(file=("slow.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")

    def some_done() -> bool:
        counts = client.batches.retrieve(batch.id).request_counts
        return counts is not None and counts.completed >= 5

    eventually(some_done, what="a few lines done", timeout=180, interval=0.3)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = finish(client, batch.id, timeout=180)
    assert batch.status == "cancelled" and batch.cancelled_at
    output = lines_of(client, batch.output_file_id)
    errors = lines_of(client, batch.error_file_id)
    assert 5 <= len(output) < n
    assert sorted(line["custom_id"] for line in output + errors) == sorted(f"req-{i}" for i in range(n))
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}


def test_a_batch_past_its_completion_window_expires(batch_stack: Emulator) -> None:
    client = client_for(batch_stack)
    lines = [request_line(0)] + [request_line(i, hang=True) for i in range(1, 4)]
    uploaded = client.files.create(file=("hang.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="20s")
    batch = finish(client, batch.id, timeout=180)
    assert batch.status == "expired" and batch.expired_at
    output = lines_of(client, batch.output_file_id)
    errors = lines_of(client, batch.error_file_id)
    assert [line["custom_id"] for line in output] == ["req-0"]
    assert sorted(line["custom_id"] for line in errors) == ["req-1", "req-2", "req-3"]
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}


def test_a_file_larger_than_one_request_goes_through_uploads(batch_stack: Emulator) -> None:
    client = client_for(batch_stack)
    filler = "x" * 2000
    lines = [{**request_line(i), "body": {**request_line(i)["body"], "metadata_note": filler}} for i in range(3000)]
    data = jsonl(lines)
    assert len(data) > 4 * 1024 * 1024  # above INFERQ_MAX_UPLOAD_BYTES: one POST /v1/files is refused
    with pytest.raises(APIStatusError) as refused:
        client.files.create(file=("big.jsonl", io.BytesIO(data)), purpose="batch")
    assert refused.value.status_code == 413

    upload = client.uploads.create(bytes=len(data), filename="big.jsonl", mime_type="application/jsonl",
                                   purpose="batch")
    assert upload.status == "pending"
    part_size = 3 * 1024 * 1024
    parts = [client.uploads.parts.create(upload_id=upload.id, data=data[i:i + part_size])
             for i in range(0, len(data), part_size)]
    done = client.uploads.complete(upload_id=upload.id, part_ids=[p.id for p in parts])
    assert done.status == "completed" and done.file is not None and done.file.bytes == len(data)
    assert client.files.content(done.file.id).content == data


def test_the_feed_delivers_each_terminal_job_once_across_cursors_and_a_gateway_restart(
    own_stack: Callable[..., Emulator],
) -> None:
    batch_stack = own_stack(**BATCH_ENV)  # its gateway is killed
    http = batch_stack.client
    start = http.get("/v1/events", params={"limit": 1000}).json()
    cursor = start["cursor"]
    while start["has_more"]:
        start = http.get("/v1/events", params={"after": cursor, "limit": 1000}).json()
        cursor = start["cursor"]
    ids = [batch_stack.submit({"body": {"model": "mock", "messages": [{"role": "user", "content": f"feed {i}"}]}})
           ["id"] for i in range(30)]
    seen: list[str] = []
    restarted = False
    deadline = time.monotonic() + 120
    while set(ids) - set(seen) and time.monotonic() < deadline:
        page = http.get("/v1/events", params={"after": cursor, "limit": 7, "wait": 5}).json()
        assert page["object"] == "list"
        seen += [job["id"] for job in page["data"] if job["id"] in ids]
        assert all(job["status"] in ("succeeded", "failed", "cancelled", "expired") for job in page["data"])
        cursor = page["cursor"]
        if len(seen) >= 10 and not restarted:
            restart_gateway(batch_stack)
            http = batch_stack.client
            restarted = True
    assert restarted
    assert sorted(seen) == sorted(ids), "each terminal job exactly once"
    other = http.get("/v1/events", params={"after": cursor, "wait": 0.5}).json()
    assert [job for job in other["data"] if job["id"] in ids] == []


def restart_gateway(stack: Emulator) -> None:
    """Kill the gateway process; the emulator's supervisor starts a new one."""
    import os
    import signal

    gateways = [pid for pid, cmd in stack.processes().items() if "functions.gateway.app:app" in cmd]
    assert gateways
    for pid in gateways:
        os.kill(pid, signal.SIGKILL)

    def answers() -> bool:
        try:
            return stack.client.get("/readyz").status_code == 200 and not any(
                pid in stack.processes() for pid in gateways)
        except Exception:
            return False

    eventually(answers, what="a new gateway", timeout=60, interval=0.3)


def test_a_batch_survives_its_scaler_gateway_and_a_worker_being_killed(own_stack: Callable[..., Emulator]) -> None:
    import os
    import signal

    batch_stack = own_stack(**BATCH_ENV)

    client = client_for(batch_stack)
    n = 2000
    lines = [request_line(i, latency_ms=20) for i in range(n)]
    uploaded = client.files.create(file=("crash.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")

    def running() -> bool:
        counts = client.batches.retrieve(batch.id).request_counts
        return counts is not None and counts.completed > 0

    eventually(running, what="the batch to be under way", timeout=120, interval=0.2)
    victims = [pid for pid, cmd in batch_stack.processes().items() if "emulator.scaler" in cmd]
    victims += batch_stack.workers()[:1]
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    restart_gateway(batch_stack)
    client = client_for(batch_stack)
    batch = finish(client, batch.id, timeout=300)
    assert batch.status == "completed", batch
    output = lines_of(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"req-{i}" for i in range(n))
    assert batch.error_file_id is None
