"""A full Redis (``maxmemory`` with ``noeviction``: every write that would grow memory is refused with ``OOM``)
under the gateway and running workers: submits answer 503 + Retry-After, never 500; the workers keep the jobs
they hold, wait the fault out with backoff, and finish each once when memory is freed (G8)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from emulator.valkey import ValkeyProcess
from functions.gateway.api import create_app
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue
from tests.integration.gateway.support import CHAT, KEYS, A
from tests.integration.worker.support import chat, status_is, submit, worker_processes

from .support import assert_each_ended_once


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    with ValkeyProcess(tmp_path / "valkey", appendfsync=None) as valkey:
        yield valkey


async def test_a_full_redis_is_503_at_the_gateway_and_workers_finish_their_jobs_once_memory_is_freed(
    server: ValkeyProcess, tmp_path: Path
) -> None:
    settings = Settings(redis_url=server.url, queue="q" + uuid.uuid4().hex[:8], window=8, claim_idle_ms=15_000,
                        redis_timeout_s=1.0, retry_base_ms=0, metrics_port=0, job_timeout_s=60, drain_s=5)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    app = create_app(settings, keys=KEYS)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
    with worker_processes(settings, tmp_path) as spawn:
        workers = [spawn("w0"), spawn("w1")]
        for worker in workers:
            await worker.started(queue)
        held = [await submit(queue, chat(f"held {i}", latency_ms=2500)) for i in range(8)]
        for job in held:
            await status_is(queue, job.id, "running", timeout=20)

        server.set_maxmemory("1mb")
        try:
            for _ in range(5):
                response = await client.post("/v1/jobs", json=CHAT, headers=A)
                assert response.status_code == 503, response.text
                assert int(response.headers["retry-after"]) > 0
                assert response.json()["error"]["type"] == "unavailable"
                await asyncio.sleep(0.2)
            await asyncio.sleep(3)  # the held jobs end meanwhile: their outcomes wait for memory
            for worker in workers:
                assert worker.alive(), worker.output()[-3000:]
        finally:
            server.set_maxmemory("0")

        accepted = []
        for _ in range(4):
            response = await client.post("/v1/jobs", json=CHAT, headers=A)
            assert response.status_code == 202, response.text
            accepted.append(response.json()["id"])
        await assert_each_ended_once(queue, held)
        for job_id in accepted:
            job = await queue.get(job_id)
            assert job is not None
            await assert_each_ended_once(queue, [job])
        assert "capacity" in " ".join(w.output() for w in workers)  # they saw it, and waited it out
        for worker in workers:
            assert worker.alive(), worker.output()[-3000:]
            worker.terminate()
            assert await worker.wait() == 0
    await client.aclose()
    await app.state.gateway.aclose()
    await queue.close()
