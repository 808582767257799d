"""INFERQ_WINDOW=auto against a real vLLM server: the worker reads the server's own Prometheus gauges and sizes its
window by them. The server here schedules at most two sequences (``--max-num-seqs 2``), so any window above two
queues requests inside the server: the window must grow from one, see the queue, and come back down."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpu_worker.backends.base import EngineLoad
from gpu_worker.backends.openai import OpenAIBackend
from gpu_worker.window import AdaptiveWindow
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from tests.integration.worker.support import submit
from tests.support.vllm_server import VllmServer, build_tiny_model, default_model_dir, ensure_vllm_venv

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

ENGINE_SEQS = 2
WINDOW_MAX = 12
RUN_MAX_S = 240.0
"""How long the engine is kept busy at most, waiting for the window to grow, see the queue and be cut."""
SETTLE_POLLS = 30
"""Polls after the first cut before the feeding stops: what the window does once it has found the engine's size."""


async def timed_request(base_url: str, body: dict[str, Any]) -> float:
    """Seconds one completion takes on the idle engine (the best of three, after a first that warms it)."""
    times = []
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        for _ in range(4):
            began = time.perf_counter()
            (await http.post("/v1/completions", json=body)).raise_for_status()
            times.append(time.perf_counter() - began)
    return max(min(times[1:]), 1e-3)


@pytest.fixture(scope="module")
def narrow_vllm_server() -> Iterator[VllmServer]:
    """vLLM's OpenAI server (the tiny Llama on CPU) that runs at most ``ENGINE_SEQS`` sequences at once."""
    python = ensure_vllm_venv()
    model = build_tiny_model(python, default_model_dir())
    server = VllmServer(model, max_model_len=256, python=python, extra_args=["--max-num-seqs", str(ENGINE_SEQS)])
    server.start()
    yield server
    server.stop()


async def test_the_worker_reads_vllms_gauges_and_adapts_its_window(settings: Settings,
                                                                    narrow_vllm_server: VllmServer) -> None:
    server = narrow_vllm_server
    assert server.base_url is not None
    settings = settings.replace(backend="openai", openai_base_url=server.base_url, window="auto",
                                window_max=WINDOW_MAX, job_timeout_s=120)
    backend = OpenAIBackend(server.base_url, window=WINDOW_MAX)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    # the real gauges, by their real names: an idle engine
    idle = await backend.load()
    assert isinstance(idle, EngineLoad) and idle.waiting == 0 and idle.running == 0
    assert idle.kv_cache_usage is not None and 0 <= idle.kv_cache_usage <= 1

    loads: list[EngineLoad] = []
    seen_loads: list[EngineLoad] = []
    windows: list[int] = []

    async def recorded() -> EngineLoad | None:
        load = await backend.load()
        if load is not None:
            loads.append(load)
        return load

    window = AdaptiveWindow(recorded, WINDOW_MAX, poll_s=0.2)
    body = {"model": server.model, "prompt": "The queue holds", "max_tokens": 200, "temperature": 0,
            "ignore_eos": True}
    one = await timed_request(server.base_url, body)
    # The engine's speed, and how late a busy server answers /metrics, vary by an order of magnitude between
    # machines and moments: rather than guess a job count, keep the queue fed until the window has been cut and
    # then held for a while (or the deadline passes), then let the worker finish what was queued.
    jobs = []
    worker = Worker(settings, queue, backend, window=window, webhooks=False, burst=True)
    jobs += [await submit(queue, body, url="/v1/completions") for _ in range(WINDOW_MAX)]
    task = asyncio.create_task(worker.run())  # never idle while fed
    try:
        deadline = time.monotonic() + RUN_MAX_S
        cut_at: int | None = None
        while time.monotonic() < deadline and not task.done():
            if (await queue.observe()).lag < WINDOW_MAX:
                jobs += [await submit(queue, body, url="/v1/completions") for _ in range(WINDOW_MAX)]
            windows.append(worker.window.size)
            if window.last_load is not None and (not seen_loads or window.last_load is not seen_loads[-1]):
                seen_loads.append(window.last_load)  # what the law read: the engine's means between two reads
            if cut_at is None and window.law.ceiling is not None:
                cut_at = len(loads)
            if cut_at is not None and len(loads) >= cut_at + SETTLE_POLLS:
                break
            await asyncio.sleep(0.05)
        await asyncio.wait_for(task, 600)  # what is still queued, then idle
        finished = [await queue.get(job.id) for job in jobs]
        last = await backend.load()  # the worker's own count of the requests it sent and got answered
    finally:
        if not task.done():
            task.cancel()
        await backend.aclose()
        await queue.close()

    means = [(round(x.waiting, 2), round(x.running, 2)) for x in seen_loads]
    seen = f"{len(jobs)} jobs, {one:.3f} s a request; loads read {means}, windows {windows}"
    assert all(j is not None and j.status is JobStatus.SUCCEEDED for j in finished)
    # the real counters, by their real names: the law read the engine's means, not only its gauges
    assert all(x.finished is not None and x.latency_s is not None and x.inference_s is not None for x in loads[1:])
    assert any(load.running > 0 for load in seen_loads), seen  # it read the engine at work
    # the backend timed each of its requests, send to answer: the law's measure of the path to the engine
    assert last is not None and last.answered == len(jobs) and last.answered_s is not None, seen
    assert last.latency_s is not None and last.answered_s > last.latency_s - (loads[0].latency_s or 0), seen
    assert max(windows) > ENGINE_SEQS, seen  # it grew from one while nothing waited ...
    assert any(load.waiting > 1 for load in seen_loads), seen  # ... until the engine queued (two sequences run) ...
    assert window.law.ceiling is not None and not window.law.slow_start, seen  # ... and then it cut the window
    assert max(windows) <= WINDOW_MAX and min(windows) >= 1
    # Not asserted: that it then stays below the 12 it could reach. On this 2-core host vLLM's HTTP front end, not
    # its engine, holds much of the queue before it stamps the requests' arrival (measured: ten requests behind two
    # slots, 4.4 s each in the client, 0.5 s in the server), where neither its counters nor its gauges count them;
    # in some runs the engine ran one sequence of two on average while twelve requests were out, and the law, which
    # reads room in an engine with free slots and nothing waiting, grew back to its maximum, as gpu_worker/window.py
    # says it does where the path to the engine is the bottleneck. Three of the full-suite runs of 2026-12-06 failed
    # there, fair share on in two and off in one (fair share is not the cause). The law's cuts and holds on given
    # readings are asserted in tests/unit/test_window.py.
    print(seen)  # what the law read and did (pytest -s)
