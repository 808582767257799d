"""INFERQ_WINDOW=auto against a real vLLM server: the worker reads the server's own Prometheus gauges and sizes its
window by them. The server here schedules at most two sequences (``--max-num-seqs 2``), so any window above two
queues requests inside the engine: the window must grow from one, see the queue, and come back down."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

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
    # ~1 s per pair of requests here: long enough for the gauges (which lag a few tenths of a second) to show it
    body = {"model": server.model, "prompt": "The queue holds", "max_tokens": 200, "temperature": 0,
            "ignore_eos": True}
    try:
        jobs = [await submit(queue, body, url="/v1/completions") for _ in range(24)]
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

    seen = f"loads {[(x.waiting, x.running) for x in loads]}, windows {windows}"
    assert all(j is not None and j.status is JobStatus.SUCCEEDED for j in finished)
    assert any(load.running > 0 for load in loads), seen  # it read the engine at work
    assert max(windows) > ENGINE_SEQS, seen  # it grew from one while nothing waited ...
    assert any(load.waiting > 0 for load in loads), seen  # ... until the engine queued (two sequences run) ...
    assert window.law.ceiling is not None and not window.law.slow_start, seen  # ... and then it cut the window
    assert max(windows) <= WINDOW_MAX and min(windows) >= 1
    late = windows[len(windows) // 2:]
    assert sum(1 for w in late if w <= ENGINE_SEQS + 2) >= len(late) // 2, seen  # and stayed near the engine's size
