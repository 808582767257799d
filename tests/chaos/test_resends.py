"""Faults after which clients resend what the server may already have run (G9): a network blip that delays the
replies on the open connections longer than the clients' timeout (the server ran the command; redis-py resends it
on a new connection), a server frozen longer than the timeout (SIGSTOP, then SIGCONT: it runs every command it
had received, and then the resent copies),
``CLIENT PAUSE`` (``WRITE`` and ``ALL``: held commands run when it lifts) and ``CLIENT KILL`` of every normal
connection in a loop (a reply lost with its connection). Jobs are submitted all along, by a client that submits
again on every failure with the same idempotency key, in the three lanes in turn, and run by worker processes.

Every client reaches the server through a counting proxy (``support.Endpoint``), so each test first shows that
the fault did what it is there for: a client sent again a command whose reply it never got (a script call, for
the faults that hold replies longer than the timeout). After each: every accepted job ended exactly once (one
terminal event, one model call: no worker died), nothing is unfinished and every lane's stream is empty."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.jobs import LANES, Job
from inferq.queue.protocol import Queue
from tests.integration.worker.support import chat, submit, worker_processes
from tests.support.waiting import eventually_async

from .support import Endpoint, assert_each_ended_once, submit_until_accepted

TIMEOUT_S = 0.5
"""INFERQ_REDIS_TIMEOUT_S of every process here: each fault below lasts longer, so redis-py resends."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    with ValkeyProcess(tmp_path / "valkey", appendfsync=None) as valkey:
        yield valkey


def fault_settings(url: str) -> Settings:
    # claim-idle above every fault: each job's entry stays with the worker that holds it (an entry whose read reply
    # was lost is reclaimed after it)
    return Settings(redis_url=url, queue="q" + uuid.uuid4().hex[:8], window=8, claim_idle_ms=6_000,
                    redis_timeout_s=TIMEOUT_S, retry_base_ms=0, metrics_port=0, job_timeout_s=60, drain_s=5)


@contextlib.asynccontextmanager
async def submitting(queue: Queue, accepted: list[Job]) -> AsyncIterator[None]:
    """Submit short jobs one after another for the duration of the block: every other one with an idempotency key,
    again until accepted; the others once, without a key (a failed one has an unknown outcome: it is not counted
    as accepted, but if it was created it must end too, or ``unfinished`` stays above zero)."""
    stop = asyncio.Event()

    async def produce() -> None:
        i = 0
        while not stop.is_set():
            body = chat(f"q{i}", latency_ms=100)
            lane = LANES[i % len(LANES)]
            if i % 2:
                with contextlib.suppress(Exception):
                    accepted.append(await submit(queue, body, priority=lane))
            else:
                accepted.append(await submit_until_accepted(queue, body, timeout=60, priority=lane))
            i += 1
            await asyncio.sleep(0.05)

    producer = asyncio.create_task(produce())
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(producer, 90)


async def run_through(
    server: ValkeyProcess, tmp_path: Path, fault: Callable[[Endpoint], Awaitable[None]], *, resent: str | None
) -> None:
    """Run ``fault`` while jobs flow through ``Endpoint(server)``; assert that the clients resent at least one
    command (``resent``, e.g. ``EVALSHA``; None: any), then that every job ended once."""
    endpoint = Endpoint(server)
    try:
        await _run_through(endpoint, tmp_path, fault)
    finally:
        endpoint.close()
    names = endpoint.resent_names()
    if resent is None:
        assert sum(names.values()) > 0, "the fault made no client resend a command: it tested nothing"
    else:
        assert names[resent] > 0, f"the fault made no client resend {resent} (resent: {dict(names)})"


async def _run_through(endpoint: Endpoint, tmp_path: Path, fault: Callable[[Endpoint], Awaitable[None]]) -> None:
    settings = fault_settings(endpoint.url)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    accepted: list[Job] = []
    with worker_processes(settings, tmp_path) as spawn:
        workers = [spawn("w0"), spawn("w1")]
        for worker in workers:
            await worker.started(queue)
        async with submitting(queue, accepted):
            await eventually_async(lambda: len(accepted) >= 10, what="jobs accepted before the fault", timeout=30)
            await fault(endpoint)
            after = len(accepted)
            await eventually_async(lambda: len(accepted) >= after + 5, what="jobs accepted after the fault",
                                   timeout=60)
        await assert_each_ended_once(queue, accepted, timeout=60)
        for worker in workers:
            assert worker.alive(), worker.output()[-3000:]
            worker.terminate()
            assert await worker.wait() == 0
    await queue.close()


async def test_a_network_blip_longer_than_the_client_timeout_runs_nothing_twice(
    server: ValkeyProcess, tmp_path: Path
) -> None:
    async def blips(endpoint: Endpoint) -> None:
        for _ in range(3):
            endpoint.blip(2 * TIMEOUT_S)
            await asyncio.sleep(2 * TIMEOUT_S + 1.5)

    await run_through(server, tmp_path, blips, resent="EVALSHA")


async def test_a_freeze_longer_than_the_client_timeout_runs_nothing_twice(
    server: ValkeyProcess, tmp_path: Path
) -> None:
    async def freezes(_: Endpoint) -> None:
        for _ in range(3):
            server.freeze()
            await asyncio.sleep(4 * TIMEOUT_S)
            server.thaw()
            await asyncio.sleep(1)

    await run_through(server, tmp_path, freezes, resent="EVALSHA")


@pytest.mark.parametrize("mode", ["WRITE", "ALL"])
async def test_client_pause_runs_nothing_twice(server: ValkeyProcess, tmp_path: Path, mode: str) -> None:
    async def pauses(_: Endpoint) -> None:
        for _ in range(2):
            server.pause(int(5 * TIMEOUT_S * 1000), mode)
            await asyncio.sleep(5 * TIMEOUT_S + 1)

    await run_through(server, tmp_path, pauses, resent="EVALSHA")


async def test_killing_every_connection_in_a_loop_runs_nothing_twice(server: ValkeyProcess, tmp_path: Path) -> None:
    async def kills(_: Endpoint) -> None:
        killed = 0
        for kill in range(15):
            if kill:
                await asyncio.sleep(0.3)  # kills paced through the run, not waiting for anything
            killed += server.kill_clients("normal")
        assert killed > 0

    # a kill lands between commands as often as during one: any command sent again counts here
    await run_through(server, tmp_path, kills, resent=None)
