"""Boot (gpu_worker/__main__.py): with the openai backend the worker waits for its model server's /health before
it takes a job, connecting to Redis meanwhile, and a stop request ends the wait."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_worker.__main__ import _model_server_ready
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue


class Health:
    """A model server whose /health answers 503 (loading) ``loading`` times, then ``then``."""

    def __init__(self, loading: int, then: int = 200) -> None:
        self.loading, self.then, self.seen = loading, then, 0
        health = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                health.seen += 1
                status = 503 if health.seen <= health.loading else health.then
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

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
        await asyncio.sleep(0.5)
        assert not waiting.done()
        stopped.set()
        await asyncio.wait_for(waiting, 5)
    finally:
        server.close()
