"""A real failover under running workers, as ElastiCache runs one in a maintenance window: one endpoint name, a
replica promoted (``REPLICAOF NO ONE``), the endpoint moved to it, the old primary demoted to its replica so every
connection still open to it answers ``READONLY``; a few seconds later the roles are restored the same way.

Jobs longer than the claim-idle time, submitted before and after the failover, each run exactly once: the lease
keepers ride it out (G4, G8) and keep renewing afterwards."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from emulator.valkey import ValkeyProcess, fail_over, wait_in_sync
from functions.gateway.api import create_app
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue
from tests.integration.gateway.support import CHAT, KEYS, A
from tests.integration.worker.support import chat, status_is, submit, worker_processes

from .support import Endpoint, assert_each_ended_once, submit_until_accepted


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[tuple[Endpoint, ValkeyProcess, ValkeyProcess]]:
    primary = ValkeyProcess(tmp_path / "a", appendfsync=None).start()
    replica = ValkeyProcess(tmp_path / "b", appendfsync=None).start()
    replica.replicate(primary)
    wait_in_sync(replica, primary)
    proxy = Endpoint(primary)
    try:
        yield proxy, primary, replica
    finally:
        proxy.close()
        replica.stop()
        primary.stop()


async def test_long_jobs_submitted_before_and_after_a_failover_each_run_once(
    endpoint: tuple[Endpoint, ValkeyProcess, ValkeyProcess], tmp_path: Path
) -> None:
    proxy, a, b = endpoint
    settings = Settings(redis_url=proxy.url, queue="q" + uuid.uuid4().hex[:8], window=8, claim_idle_ms=2500,
                        redis_timeout_s=1.0, retry_base_ms=0, metrics_port=0, job_timeout_s=60, drain_s=5)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    with worker_processes(settings, tmp_path) as spawn:
        workers = [spawn("w0"), spawn("w1")]
        for worker in workers:
            await worker.started(queue)
        before = [await submit(queue, chat(f"before {i}", latency_ms=5000)) for i in range(6)]
        for job in before:
            await status_is(queue, job.id, "running", timeout=20)

        await asyncio.to_thread(fail_over, a, b, promoted=lambda: proxy.switch(b))
        after = [await submit_until_accepted(queue, chat(f"after {i}", latency_ms=5000)) for i in range(6)]
        await asyncio.sleep(3)  # a's clients get READONLY all along
        await asyncio.to_thread(fail_over, b, a, promoted=lambda: proxy.switch(a))
        later = [await submit_until_accepted(queue, chat(f"later {i}", latency_ms=5000)) for i in range(4)]

        await assert_each_ended_once(queue, before + after + later)
        stats = await queue.stats()
        assert stats.get("reclaimed", 0) == 0 and stats.get("duplicate_results", 0) == 0, stats
        for worker in workers:  # a worker whose lease keeper died would have stopped (exit 1)
            assert worker.alive(), worker.output()[-3000:]

        # the lease keepers still renew: more jobs longer than the claim-idle time, each run once
        last = [await submit(queue, chat(f"last {i}", latency_ms=4000)) for i in range(4)]
        await assert_each_ended_once(queue, last)
        assert (await queue.stats()).get("reclaimed", 0) == 0
        for worker in workers:
            assert worker.alive(), worker.output()[-3000:]
            worker.terminate()
            assert await worker.wait() == 0
    await queue.close()


async def test_the_gateway_follows_the_endpoint_to_the_new_primary_without_a_single_error(
    endpoint: tuple[Endpoint, ValkeyProcess, ValkeyProcess],
) -> None:
    """Its pooled connections still reach the demoted primary: the first READONLY on each makes redis-py close it
    and resend on a new connection, which the endpoint sends to the new primary (safe: nothing was written)."""
    proxy, a, b = endpoint
    settings = Settings(redis_url=proxy.url, queue="q" + uuid.uuid4().hex[:8], redis_timeout_s=1.0)
    app = create_app(settings, keys=KEYS)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
    try:
        first = [await client.post("/v1/jobs", json=CHAT, headers=A) for _ in range(3)]
        assert all(r.status_code == 202 for r in first)
        await asyncio.to_thread(fail_over, a, b, promoted=lambda: proxy.switch(b))
        for _ in range(5):
            response = await client.post("/v1/jobs", json=CHAT, headers=A)
            assert response.status_code == 202, response.text
        job_id = response.json()["id"]
        cancelled = await client.post(f"/v1/jobs/{job_id}/cancel", headers=A)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        assert b.info("replication")["role"] == "master" and a.info("replication")["role"] == "slave"
        # the resend happened: the demoted primary refused commands (its own error counter), and yet every submit
        # was accepted, so each refused command went again, to the new primary
        refused = a.info("errorstats").get("errorstat_READONLY", "count=0")
        assert int(refused.split(",")[0].removeprefix("count=")) > 0, a.info("errorstats")
    finally:
        await client.aclose()
        await app.state.gateway.aclose()
