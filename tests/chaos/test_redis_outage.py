"""Redis going away under a running worker (G8): restarted, crashed (AOF always) or frozen. The worker
reconnects with backoff and loses nothing it had not finished: every job, of every lane, ends succeeded, once."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.jobs import LANES, JobStatus
from inferq.queue.protocol import Queue
from tests.integration.worker.support import chat, submit, terminal, terminal_events, worker_processes
from tests.support.waiting import eventually_async


@pytest.mark.parametrize("outage", ["restart", "crash", "freeze"])
async def test_the_worker_rides_out_a_redis_outage_and_loses_nothing(outage: str, tmp_path: Path) -> None:
    server = ValkeyProcess(tmp_path / "valkey", appendfsync="always" if outage == "crash" else "everysec")
    server.start()
    settings = Settings(redis_url=server.url, queue="q" + uuid.uuid4().hex[:8], window=4, claim_idle_ms=10_000,
                        redis_timeout_s=1.0, retry_base_ms=0, metrics_port=0)
    queue = Queue.connect(settings)
    try:
        await queue.ensure_groups()
        with worker_processes(settings, tmp_path) as spawn:
            worker = spawn("survivor")
            jobs = [await submit(queue, chat(f"q{i}", latency_ms=150), priority=LANES[i % len(LANES)])
                    for i in range(40)]

            async def some_done() -> bool:
                return (await queue.stats()).get("succeeded", 0) >= 8

            await eventually_async(some_done, what="the first jobs", timeout=15)
            if outage == "freeze":
                server.freeze()
                await asyncio.sleep(3)
                server.thaw()
            else:
                server.kill() if outage == "crash" else server.stop()
                await asyncio.sleep(2)
                server.start()
            for job in jobs:
                done = await terminal(queue, job.id, timeout=30)
                assert done.status is JobStatus.SUCCEEDED
                assert len(await terminal_events(queue, job.id)) == 1
            stats = await queue.stats()
            assert stats["succeeded"] == 40 and stats["unfinished"] == 0
            # a frozen server runs the writes it had received once it thaws, after the worker gave up waiting and
            # tried again: those second tries find the job already written and count as duplicates (never more
            # than the window); a restarted or crashed server never received the writes it missed
            duplicates = stats.get("duplicate_results", 0)
            assert duplicates <= settings.window if outage == "freeze" else duplicates == 0
            assert worker.alive()
            # it noticed the outage: a restart or crash breaks its connections; a freeze shows as a timeout in
            # whichever of its tasks was talking to Redis then (the reader, the writer or the webhook pass)
            noticed = ("retrying with backoff",) if outage != "freeze" else ("retrying with backoff", "Timeout")
            assert any(sign in worker.output() for sign in noticed), worker.output()[-2000:]
            worker.terminate()
            assert await worker.wait() == 0
    finally:
        await queue.close()
        server.stop()
