"""INFERQ_WINDOW=auto with a real worker and Valkey: the mock backend's simulated engine (``engine_slots``) queues
what exceeds its slots and says so, and the worker's window follows it; the pull loop takes only what the
current window has room for."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from emulator.valkey import free_port
from gpu_worker.backends.mock import MockBackend
from gpu_worker.window import AdaptiveWindow
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from tests.support.waiting import eventually_async

from .support import REPO, chat, submit, terminal, worker_env, worker_processes

SLOTS = 4
WINDOW_MAX = 24


@dataclass
class Trace:
    windows: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)


async def run_traced(worker: Worker, backend: MockBackend) -> Trace:
    """Run the worker until the queue is empty, sampling its window, its in-flight count and the engine's queue."""
    trace = Trace()
    task = asyncio.create_task(worker.run())
    while not task.done():
        load = await backend.load()
        trace.windows.append(worker.window.size)
        trace.waiting.append(int(load.waiting))
        trace.in_flight.append(worker.in_flight)
        await asyncio.sleep(0.02)
    await task
    return trace


async def all_succeeded(queue: Queue, ids: list[str]) -> bool:
    jobs = [await queue.get(i) for i in ids]
    return all(j is not None and j.status is JobStatus.SUCCEEDED for j in jobs)


async def test_the_auto_window_follows_the_engine_and_keeps_its_queue_short(settings: Settings,
                                                                             queue: Queue) -> None:
    settings = settings.replace(window="auto", window_max=WINDOW_MAX)
    ids = [(await submit(queue, chat(f"q{i}", latency_ms=100))).id for i in range(120)]
    backend = MockBackend(queue.redis, queue.keys, engine_slots=SLOTS)
    window = AdaptiveWindow(backend.load, WINDOW_MAX, poll_s=0.05)
    worker = Worker(settings, queue, backend, window=window, burst=True)
    trace = await run_traced(worker, backend)

    assert await all_succeeded(queue, ids)
    assert max(trace.windows) > 1  # it grew from one slot
    assert window.law.ceiling is not None and not window.law.slow_start  # it saw the engine queue, and shrank
    assert max(trace.in_flight) <= WINDOW_MAX and min(trace.windows) >= 1
    # settled near the engine's slots: the second half of the run mostly within one cut of them
    settled = trace.windows[len(trace.windows) // 2:]
    assert sum(1 for w in settled if w <= SLOTS + 2) >= len(settled) * 0.6, settled
    # the gauge shows the current window
    assert worker.metrics.registry.get_sample_value("inferq_worker_window", {"queue": settings.queue}) == \
        worker.window.size
    # and what the law last read of the engine, at each scrape
    assert window.last_load is not None
    scraped = {name: worker.metrics.registry.get_sample_value(f"inferq_worker_engine_{name}",
                                                              {"queue": settings.queue})
               for name in ("waiting", "running", "path")}
    assert scraped == {"waiting": window.last_load.waiting, "running": window.last_load.running, "path": 0.0}

    # the same jobs through a static window as large as the maximum: the engine holds the excess in its queue
    ids = [(await submit(queue, chat(f"s{i}", latency_ms=100))).id for i in range(120)]
    static_backend = MockBackend(queue.redis, queue.keys, engine_slots=SLOTS)
    static_worker = Worker(settings.replace(window=WINDOW_MAX), queue, static_backend, burst=True)
    static = await run_traced(static_worker, static_backend)
    assert await all_succeeded(queue, ids)
    auto_waiting = sum(trace.waiting) / len(trace.waiting)
    static_waiting = sum(static.waiting) / len(static.waiting)
    assert auto_waiting < static_waiting / 2, (auto_waiting, static_waiting)


class ManualWindow:
    """A window the test sets by hand, reporting changes to the worker as the adaptive one does."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._pending: list[int] = []

    @property
    def size(self) -> int:
        return self._size

    def set(self, size: int) -> None:
        self._pending.append(size)

    async def run(self, stop: asyncio.Event, in_flight: Callable[[], int],
                  changed: Callable[[int, int], None]) -> None:
        while not stop.is_set():
            while self._pending:
                old, self._size = self._size, self._pending.pop(0)
                changed(old, self._size)
            await asyncio.sleep(0.01)


async def test_the_pull_loop_takes_only_what_the_current_window_has_room_for(settings: Settings,
                                                                             queue: Queue) -> None:
    ids = [(await submit(queue, chat(f"q{i}", latency_ms=150))).id for i in range(40)]
    backend = MockBackend(queue.redis, queue.keys)
    window = ManualWindow(2)
    worker = Worker(settings, queue, backend, window=window, burst=True)
    task = asyncio.create_task(worker.run())
    await eventually_async(lambda: worker.in_flight == 2, what="two jobs in flight in a window of 2")
    window.set(6)
    await eventually_async(lambda: worker.in_flight == 6, what="six in flight: the pull loop woke and filled the "
                           "new slots")
    window.set(1)  # after a shrink the jobs already running finish; then at most one at a time
    await eventually_async(lambda: worker.in_flight <= 1, what="the jobs running at the shrink to finish")
    most = 0
    for _ in range(20):  # proves a negative: no second job is taken for 0.4 s (several 150 ms jobs)
        await asyncio.sleep(0.02)
        most = max(most, worker.in_flight)
    assert most <= 1
    window.set(8)
    await task
    assert await all_succeeded(queue, ids)


async def test_a_worker_process_runs_with_window_auto_and_publishes_its_window(settings: Settings,
                                                                               tmp_path: Path) -> None:
    port = free_port()
    settings = settings.replace(window="auto", window_max=6)
    queue = Queue.connect(settings)
    try:
        with worker_processes(settings, tmp_path) as spawn:
            worker = spawn("auto", INFERQ_METRICS_PORT=str(port))
            await worker.started(queue)
            jobs = [await submit(queue, chat(f"q{i}", latency_ms=50)) for i in range(30)]
            for job in jobs:
                assert (await terminal(queue, job.id, timeout=60)).status is JobStatus.SUCCEEDED
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            window = next(float(line.split()[-1]) for line in text.splitlines()
                          if line.startswith("inferq_worker_window{"))
            assert 1 <= window <= 6
            worker.terminate()
            assert await worker.wait(timeout=30) == 0
    finally:
        await queue.close()


def test_a_bad_window_stops_the_worker_naming_the_variable(settings: Settings) -> None:
    env = worker_env(settings, INFERQ_WINDOW="adaptive")
    done = subprocess.run([sys.executable, "-m", "gpu_worker"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2 and "INFERQ_WINDOW" in done.stderr and "auto" in done.stderr
