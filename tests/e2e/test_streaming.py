"""A job's output as it is made, and the OpenAI front door, through ``inferq up`` with the official ``openai`` client
(sync, async, ``stream=True``), inferq's client (``stream``) and ``inferq submit --stream``: the pieces read while a
job runs spell its final text, the first pieces arrive while the job runs, a 504 names the job that goes on and a retry
with its Idempotency-Key gets it, a cancel ends a stream at once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import APIStatusError, AsyncOpenAI, OpenAI

from inferq.client import AsyncClient, Client

from .conftest import ROOT, Emulator, running_emulator

WORDS = " ".join(f"word{i}" for i in range(40))
"""The mock echoes the last user message: forty pieces, spread over the job's latency."""


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """A stack whose fleet never scales to zero (no boot in the timings) and whose front door waits 4 s."""
    with running_emulator(tmp_path_factory, INFERQ_SCALE_MIN="1", INFERQ_SYNC_WAIT_S="4") as emulator:
        yield emulator


@pytest.fixture
def key(up: Emulator) -> str:
    return (up.data_dir / "dev-api-key").read_text().strip()


@pytest.fixture
def openai(up: Emulator, key: str) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{up.url}/v1", api_key=key, max_retries=0) as client:
        yield client


def mock(**controls: Any) -> dict[str, Any]:
    return {"mock": controls}


def test_a_jobs_output_is_read_in_pieces_before_it_ends_and_spells_its_final_text(up: Emulator) -> None:
    # written at once, then 0.5, 1.5 and 3.5 s in (the interval doubles): four pieces while it runs
    job = up.submit({"body": {"model": "mock", "messages": [{"role": "user", "content": WORDS}],
                              "mock": {"latency_ms": 5000}}})
    pieces: list[str] = []
    pages_before_end = 0
    cursor = None
    while True:
        params: dict[str, Any] = {"wait": 10}
        if cursor:
            params["after"] = cursor
        page = up.client.get(f"/v1/jobs/{job['id']}/stream", params=params).json()
        pieces += [d["delta"] for d in page["data"]]
        cursor = page["cursor"]
        if page["done"]:
            break
        pages_before_end += bool(page["data"])
    assert pages_before_end >= 3, "the output came in one piece, not as it was made"
    final = up.job(job["id"])
    assert final["status"] == "succeeded"
    assert "".join(pieces) == final["result"]["body"]["choices"][0]["message"]["content"] == WORDS


def test_the_official_client_is_answered_through_the_queue(openai: OpenAI) -> None:
    raw = openai.chat.completions.with_raw_response.create(
        model="mock", messages=[{"role": "user", "content": "hello front door"}])
    job_id = raw.headers["inferq-job-id"]
    answer = raw.parse()
    assert job_id.startswith("job_") and answer.id == f"chatcmpl-{job_id}"
    assert answer.choices[0].message.content == "hello front door" and answer.usage.completion_tokens == 3
    raw = openai.completions.with_raw_response.create(model="mock", prompt="a completion", max_tokens=1)
    assert raw.headers["inferq-job-id"].startswith("job_")
    assert raw.parse().choices[0].text == "a" and raw.parse().choices[0].finish_reason == "length"


def test_stream_true_chunks_come_as_the_job_runs(up: Emulator, openai: OpenAI) -> None:
    raw = openai.chat.completions.with_raw_response.create(
        model="mock", messages=[{"role": "user", "content": WORDS}], stream=True,
        stream_options={"include_usage": True}, extra_body=mock(latency_ms=3000))
    job_id = raw.headers["inferq-job-id"]
    text: list[str] = []
    usage, statuses = None, []
    for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
            if len(text) <= 2:  # the first piece at once, the next a write (500 ms) later: the job runs 3 s
                statuses.append(up.job(job_id)["status"])  # read after the piece came: events, not timestamps
        usage = chunk.usage or usage
    assert "".join(text) == WORDS
    assert statuses == ["running", "running"], "the output came when the job had ended, not as it ran"
    assert usage is not None and usage.completion_tokens == 40


async def test_the_async_client_streams_completions(up: Emulator, key: str) -> None:
    async with AsyncOpenAI(base_url=f"{up.url}/v1", api_key=key, max_retries=0) as client:
        stream = await client.completions.create(model="mock", prompt=WORDS, stream=True,
                                                 extra_body=mock(latency_ms=1500))
        text = [chunk.choices[0].text async for chunk in stream if chunk.choices]
        assert "".join(text) == WORDS and len([t for t in text if t]) > 1
        answer = await client.chat.completions.create(model="mock", messages=[{"role": "user", "content": "x y"}])
        assert answer.choices[0].message.content == "x y"


def test_a_504_names_the_job_that_goes_on_and_a_retry_with_its_key_gets_it(openai: OpenAI) -> None:
    headers = {"Idempotency-Key": f"e2e-504-{time.time()}"}
    with pytest.raises(APIStatusError) as caught:
        openai.chat.completions.create(model="mock", messages=[{"role": "user", "content": "slow one"}],
                                       extra_body=mock(latency_ms=6000), extra_headers=headers)
    assert caught.value.status_code == 504
    job_id = caught.value.response.headers["inferq-job-id"]
    assert job_id in caught.value.message and caught.value.response.json()["job_id"] == job_id
    raw = openai.chat.completions.with_raw_response.create(
        model="mock", messages=[{"role": "user", "content": "slow one"}], extra_body=mock(latency_ms=6000),
        extra_headers=headers)
    assert raw.headers["inferq-job-id"] == job_id
    assert raw.parse().choices[0].message.content == "slow one"


def test_a_failed_job_is_the_clients_error_with_its_status(openai: OpenAI) -> None:
    with pytest.raises(APIStatusError) as caught:
        openai.chat.completions.create(model="mock", messages=[{"role": "user", "content": "x"}],
                                       extra_body=mock(fatal=True))
    assert caught.value.status_code == 400 and caught.value.response.headers["inferq-job-id"].startswith("job_")


def test_inferqs_client_streams_a_job_and_a_cancel_ends_the_stream(up: Emulator, key: str) -> None:
    with Client(up.url, key) as client:
        job = client.submit({"model": "mock", "messages": [{"role": "user", "content": WORDS}],
                             "mock": {"latency_ms": 1500}})
        stream = client.stream(job.id)
        assert "".join(stream) == WORDS and stream.done and stream.status == "succeeded"
        slow = client.submit({"model": "mock", "messages": [{"role": "user", "content": WORDS}],
                              "mock": {"latency_ms": 60_000}})
        watching = client.stream(slow.id)
        assert next(watching).startswith("word0")
        client.cancel(slow.id)
        rest = list(watching)  # ends on the cancel, long before the job's 60 s
        assert watching.status == "cancelled" and len(rest) < 39


async def test_inferqs_async_client_streams(up: Emulator, key: str) -> None:
    async with AsyncClient(up.url, key) as client:
        job = await client.submit({"model": "mock", "messages": [{"role": "user", "content": "a b c"}],
                                   "mock": {"latency_ms": 300}})
        assert "".join([piece async for piece in client.stream(job.id)]) == "a b c"


def test_inferq_submit_stream_prints_the_answer(up: Emulator, key: str) -> None:
    env = {**os.environ, "INFERQ_URL": up.url, "INFERQ_API_KEY": key}
    done = subprocess.run([sys.executable, "-m", "inferq.cli.main", "submit", "streamed by the cli", "--stream"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "streamed by the cli\n" and "succeeded" in done.stderr


def test_stream_on_an_unknown_job_is_404(up: Emulator) -> None:
    response = up.client.get("/v1/jobs/job_aaaaaaaaaaaaaaaaaaaaaaaaaa/stream")
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found"
    assert asyncio is not None and httpx is not None
