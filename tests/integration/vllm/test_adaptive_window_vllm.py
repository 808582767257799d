"""INFERQ_WINDOW=auto against a real vLLM server: the worker reads the server's own Prometheus gauges and sizes its
window by them. The server here schedules at most two sequences (``--max-num-seqs 2``), so any window above two
queues requests inside the engine: the window must grow from one, see the queue, and come back down."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpu_worker.backends.base import EngineLoad
from gpu_worker.backends.openai import OpenAIBackend
from gpu_worker.window import AdaptiveWindow
from gpu_worker.worker import Worker
from inferq.jobs import JobStatus
from inferq.queue import Queue
from inferq.settings import Settings
from tests.integration.worker.support import submit
from tests.support.vllm_server import VllmServer, build_tiny_model, default_model_dir, ensure_vllm_venv

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

ENGINE_SEQS = 2
WINDOW_MAX = 12
RUN_S = 12.0
"""How long the engine should be kept busy: dozens of 0.2 s polls, whatever the machine's speed."""
MAX_JOBS = 1000


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
    windows: list[int] = []

    async def recorded() -> EngineLoad | None:
        load = await backend.load()
        if load is not None:
            loads.append(load)
        return load

    window = AdaptiveWindow(recorded, WINDOW_MAX, poll_s=0.2)
    body = {"model": server.model, "prompt": "The queue holds", "max_tokens": 200, "temperature": 0,
            "ignore_eos": True}
    # The engine's speed varies by an order of magnitude between machines (~0.5 s a request on 2 shared cores,
    # ~0.1 s on a larger one): size the load by a measured request so the run lasts long enough for the window
    # to grow past the engine's two slots and for the lagging gauges to show requests waiting there.
    one = await timed_request(server.base_url, body)
    count = min(MAX_JOBS, max(24, math.ceil(RUN_S * ENGINE_SEQS / one)))
    try:
        jobs = [await submit(queue, body, url="/v1/completions") for _ in range(count)]
        worker = Worker(settings, queue, backend, window=window, webhooks=False)
        task = asyncio.create_task(worker.run_until_idle())
        while not task.done():
            windows.append(worker.window.size)
            await asyncio.sleep(0.05)
        await asyncio.wait_for(task, 600)
        finished = [await queue.get(job.id) for job in jobs]
    finally:
        await backend.aclose()
        await queue.close()

    seen = f"{count} jobs, {one:.3f} s a request; loads {[(x.waiting, x.running) for x in loads]}, windows {windows}"
    assert all(j is not None and j.status is JobStatus.SUCCEEDED for j in finished)
    assert any(load.running > 0 for load in loads), seen  # it read the engine at work
    assert max(windows) > ENGINE_SEQS, seen  # it grew from one while nothing waited ...
    assert any(load.waiting > 0 for load in loads), seen  # ... until the engine queued (two sequences run) ...
    assert window.law.ceiling is not None and not window.law.slow_start, seen  # ... and then it cut the window
    assert max(windows) <= WINDOW_MAX and min(windows) >= 1
    late = windows[len(windows) // 2:]
    assert sum(1 for w in late if w <= ENGINE_SEQS + 2) >= len(late) // 2, seen  # and stayed near the engine's size
