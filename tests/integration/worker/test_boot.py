"""Boot (gpu_worker/__main__.py): with the openai backend the worker waits for its model server's /health before
it takes a job, connecting to Redis meanwhile, and a stop request ends the wait. The ECS task starts it beside the
model server (infra/gpu.yaml: DependsOn START), so this wait is all that stands between a loading model and a
worker pulling jobs it cannot run."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_worker.__main__ import _model_server_ready
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from tests.support.waiting import eventually_async

from .support import WorkerProcess, submit, terminal


class Health:
    """A model server whose /health answers 503 (loading) ``loading`` times, then ``then``; it answers a chat
    completion to any POST, and records when each request came (``posts``: the time of each POST; ``up_at``:
    when /health first answered up)."""

    def __init__(self, loading: int, then: int = 200) -> None:
        self.loading, self.then, self.seen = loading, then, 0
        self.up_at: float | None = None
        self.posts: list[float] = []
        health = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/health":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                health.seen += 1
                status = 503 if health.seen <= health.loading else health.then
                if status < 500 and health.up_at is None:
                    health.up_at = time.monotonic()
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                health.posts.append(time.monotonic())
                body = json.dumps({"id": "c", "object": "chat.completion", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def loading() -> Iterator[Health]:
    server = Health(loading=3)
    yield server
    server.close()


async def test_the_worker_waits_for_the_model_server_then_goes_on(
    settings: Settings, queue: Queue, loading: Health
) -> None:
    stopped = asyncio.Event()
    await asyncio.wait_for(_model_server_ready(settings.replace(openai_base_url=loading.url), queue, stopped), 10)
    assert loading.seen == 4  # three answers "loading", the fourth "up"


async def test_a_server_without_health_counts_as_up(settings: Settings, queue: Queue) -> None:
    server = Health(loading=0, then=404)
    try:
        await asyncio.wait_for(_model_server_ready(settings.replace(openai_base_url=server.url), queue,
                                                   asyncio.Event()), 10)
        assert server.seen == 1
    finally:
        server.close()


async def test_a_stop_request_ends_the_wait(settings: Settings, queue: Queue) -> None:
    server = Health(loading=10_000)
    try:
        stopped = asyncio.Event()
        waiting = asyncio.create_task(_model_server_ready(settings.replace(openai_base_url=server.url), queue, stopped))
        await eventually_async(lambda: server.seen >= 2, what="the worker polling /health again")
        assert not waiting.done()  # still loading: it waits
        stopped.set()
        await asyncio.wait_for(waiting, 5)
    finally:
        server.close()


async def test_a_worker_started_beside_a_loading_model_server_takes_no_job_until_it_is_up(
    settings: Settings, queue: Queue, tmp_path: Path
) -> None:
    """The ECS task's order (the worker starts with the model server, not after its health check): a job waits in
    the queue, the worker process is up and connected, and it neither heartbeats (the scaler's live worker) nor
    takes the job until /health answers; then it runs it."""
    server = Health(loading=25)  # /health polled every 0.2 s: about 5 s of "loading"
    job = await submit(queue)
    worker = WorkerProcess(settings, tmp_path, "beside", INFERQ_BACKEND="openai", INFERQ_OPENAI_BASE_URL=server.url)
    try:
        await eventually_async(lambda: asyncio.sleep(0, server.seen > 0), what="the worker polling /health", timeout=30)
        assert server.up_at is None and worker.alive()
        assert not await queue.redis.hexists(queue.keys.workers, "beside")  # no heartbeat while the model loads
        queued = await queue.get(job.id, "acme")
        assert queued is not None and queued.status is JobStatus.QUEUED
        assert (await terminal(queue, job.id, timeout=30)).status is JobStatus.SUCCEEDED
        assert server.up_at is not None and server.posts and min(server.posts) >= server.up_at
        assert server.seen > server.loading  # it asked until the server was up, then went on
    finally:
        worker.stop()
        server.close()
