"""The worker's ``openai`` backend against a real vLLM server: results, a 400 that must not be retried, and
continuous batching that a wider window turns into throughput."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gpu_worker.backends.openai import OpenAIBackend
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.jobs import Job, JobStatus
from inferq.queue.protocol import Queue
from tests.integration.worker.support import submit
from tests.support.vllm_server import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

TOKENS = 48  # long enough that decoding, which batching amortizes, outweighs each request's fixed cost


class CountingOpenAI(OpenAIBackend):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    async def complete(self, url: str, body: dict[str, Any], **kwargs: Any) -> tuple[int, Any]:
        self.calls += 1
        return await super().complete(url, body, **kwargs)


async def run_jobs(settings: Settings, server: VllmServer, bodies: list[tuple[str, dict[str, Any]]],
                   window: int) -> tuple[list[Job], float, int]:
    """Enqueue the jobs, run one worker (openai backend) until idle; the jobs, the wall time, the model calls."""
    settings = settings.replace(backend="openai", openai_base_url=server.base_url, window=window, job_timeout_s=60)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    backend = CountingOpenAI(settings.openai_base_url, window=window)
    try:
        jobs = [await submit(queue, body, url=url) for url, body in bodies]
        # bounded: a wedged model server fails the test instead of hanging it
        await asyncio.wait_for(Worker(settings, queue, backend, webhooks=False, burst=True).run(), 300)
        finished = [await queue.get(job.id) for job in jobs]
    finally:
        await backend.aclose()
        await queue.close()
    assert all(job is not None and job.started_at and job.finished_at for job in finished)
    # the batch's own span, first start to last finish: the worker's start and stop are not part of it
    elapsed = max(j.finished_at for j in finished) - min(j.started_at for j in finished)  # type: ignore[union-attr]
    return finished, elapsed, backend.calls  # type: ignore[return-value]


def chat_body(server: VllmServer, text: str, max_tokens: int) -> dict[str, Any]:
    return {"model": server.model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}


async def test_chat_and_completions_succeed(settings: Settings, vllm_server: VllmServer) -> None:
    bodies = [
        ("/v1/chat/completions", chat_body(vllm_server, "Hello there", 8)),
        ("/v1/completions", {"model": vllm_server.model, "prompt": "Once upon a time", "max_tokens": 8,
                             "temperature": 0, "ignore_eos": True, "mock": {"fatal": True}}),
    ]
    (chat, completion), _, calls = await run_jobs(settings, vllm_server, bodies, window=2)
    assert calls == 2
    for job, kind in ((chat, "chat.completion"), (completion, "text_completion")):
        assert job.status is JobStatus.SUCCEEDED, job.error
        assert job.result is not None and job.result["status_code"] == 200
        body = job.result["body"]
        assert body["object"] == kind and body["model"] == "tiny-llama"
        assert body["usage"]["completion_tokens"] == 8
    assert isinstance(chat.result["body"]["choices"][0]["message"]["content"], str)  # type: ignore[index]
    assert isinstance(completion.result["body"]["choices"][0]["text"], str)  # type: ignore[index]


async def test_a_prompt_too_long_fails_the_job_at_once_without_retry(
    settings: Settings, vllm_server: VllmServer
) -> None:
    too_long = "hello world " * vllm_server.max_model_len
    bodies = [("/v1/completions", {"model": vllm_server.model, "prompt": too_long, "max_tokens": 4})]
    (job,), _, calls = await run_jobs(settings.replace(max_attempts=3), vllm_server, bodies, window=1)
    assert job.status is JobStatus.FAILED and not job.dead_lettered
    assert job.attempts == 1 and calls == 1
    assert job.error is not None
    assert set(job.error) == {"type", "message"} and job.error["type"] == "model_error"
    assert "400" in job.error["message"] and "context length" in job.error["message"]  # vLLM's own explanation


def inference_seconds(server: VllmServer) -> float:
    """vLLM's own counter: the seconds its requests have spent in model execution batches, all summed."""
    assert server.base_url is not None
    metrics = httpx.get(server.base_url.rstrip("/").removesuffix("/v1") + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("vllm:request_inference_time_seconds_sum"))


async def test_window_8_keeps_several_requests_in_the_engines_batches_and_window_1_one(
    settings: Settings, vllm_server: VllmServer
) -> None:
    """What a wider window is for: the engine batches the requests it holds. Its own counter of the seconds requests
    spend in its batches, over the batch's span (first start to last finish, the job records' times), is how many it
    ran together on average (Little's law): one at window 1, more at window 8, whatever this machine's speed.
    (How much faster that makes the batch is a figure for ``make bench``, V; printed here.)"""
    bodies = [("/v1/completions", {"model": vllm_server.model, "prompt": f"Job number {i} says",
                                   "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}) for i in range(16)]
    await run_jobs(settings, vllm_server, bodies[:2], window=2)  # warm-up
    together: dict[int, float] = {}
    spans: dict[int, float] = {}
    for window in (1, 8):
        before = inference_seconds(vllm_server)
        jobs, spans[window], calls = await run_jobs(settings, vllm_server, bodies, window=window)
        together[window] = (inference_seconds(vllm_server) - before) / spans[window]
        assert calls == 16
        for job in jobs:
            assert job.status is JobStatus.SUCCEEDED, job.error
            assert job.result["body"]["usage"]["completion_tokens"] == TOKENS  # type: ignore[index]
    print(f"16 jobs x {TOKENS} tokens: window 1 {spans[1]:.2f} s, {together[1]:.2f} in the engine on average; "
          f"window 8 {spans[8]:.2f} s, {together[8]:.2f} ({spans[1] / spans[8]:.2f}x faster)")
    assert together[1] <= 1.05, together  # one request at a time (the counters' rounding aside)
    # more than one on average can only be requests in the same batches (the tiny KV cache here holds about three
    # of these requests at once, so the mean stays well under 8)
    assert together[8] >= 1.2, together
