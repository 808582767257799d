"""Helpers for worker tests: enqueue shortcuts, polling, an in-process worker and a worker subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from gpu_worker.backends.base import Backend
from gpu_worker.backends.mock import MockBackend
from gpu_worker.claim_check import ClaimCheck
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.outcomes import Settler
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.jobs import Job, JobRequest
from inferq.queue.protocol import Queue
from inferq.redis.faults import Fault, FaultRun
from tests.support.waiting import eventually_async

REPO = Path(__file__).resolve().parents[3]
TENANT = "acme"


def chat(text: str = "hello", **mock: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": text}]}
    if mock:
        body["mock"] = mock
    return body


async def submit(queue: Queue, body: dict[str, Any] | None = None, **request: Any) -> Job:
    job, _ = await queue.enqueue(TENANT, JobRequest(body=body or chat(), **request))
    return job


async def terminal(queue: Queue, job_id: str, timeout: float = 10.0) -> Job:
    async def check() -> Job | None:
        job = await queue.get(job_id)
        return job if job is not None and job.status.terminal else None

    result: Job = await eventually_async(check, what=f"job {job_id} to end", timeout=timeout)
    return result


async def status_is(queue: Queue, job_id: str, status: str, timeout: float = 10.0) -> Job:
    async def check() -> Job | None:
        job = await queue.get(job_id)
        return job if job is not None and job.status.value == status else None

    result: Job = await eventually_async(check, what=f"job {job_id} to be {status}", timeout=timeout)
    return result


async def mock_calls(queue: Queue, job_id: str) -> int:
    return int(await queue.redis.hget(queue.keys.mock_calls, job_id) or 0)


async def terminal_events(queue: Queue, job_id: str) -> list[dict[str, str]]:
    return [f for _, f in await queue.redis.xrange(queue.keys.events) if f.get("job") == job_id]


def counting_faults(queue: Queue, seen: list[Fault]) -> Callable[[str], FaultRun]:
    """The fault bookkeeping a worker gives its collaborators, each fault appended to ``seen``."""
    return lambda what: FaultRun(what, logging.getLogger("tests.worker"), on_fault=seen.append, clients=[queue.redis])


def settler_for(settings: Settings, queue: Queue, seen: list[Fault] | None = None) -> Settler:
    """A settler as a worker makes it, alone (no S3 bucket: results inline)."""
    metrics = WorkerMetrics(settings.queue, 1)
    return Settler(settings, queue, metrics, ClaimCheck(settings), counting_faults(queue, [] if seen is None else seen))


@contextlib.asynccontextmanager
async def running_worker(
    settings: Settings, queue: Queue, backend: Backend | None = None, **options: Any
) -> AsyncIterator[Worker]:
    """A worker running in this process's event loop for the duration of the block, then stopped (drained)."""
    worker = Worker(settings, queue, backend or MockBackend(queue.redis, queue.keys), **options)
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment that gives a ``python -m gpu_worker`` process these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERQ_", "ECS_"))}
    default = Settings()
    for f in fields(Settings):
        value = getattr(settings, f.name)
        if value == getattr(default, f.name) or value is None:
            continue
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, dict):
            value = ",".join(f"{tenant}:{key}" for key, tenant in value.items())
        env[Settings.variable(f.name)] = str(value)
    env.setdefault("INFERQ_METRICS_PORT", "0")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class WorkerProcess:
    """``python -m gpu_worker`` as a child process, its stderr (JSON log lines) kept in a file."""

    def __init__(self, settings: Settings, log_dir: Path, name: str = "worker", **env: str) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        environment = worker_env(settings, INFERQ_WORKER_ID=name, **env)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()/kill()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_worker"], cwd=REPO, env=environment, stdout=self._log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait(10)
        self._log.close()

    async def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not exit within {timeout} s\n{self.output()[-3000:]}")
            await asyncio.sleep(0.05)
        self._log.close()
        return int(self.proc.returncode)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.output().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(raw))
        return lines

    async def started(self, queue: Queue, timeout: float = 15.0) -> None:
        """Wait for its first heartbeat (imports done, connected, pulling)."""

        async def check() -> bool:
            if not self.alive():
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            return bool(await queue.redis.hexists(queue.keys.workers, self.name))

        await eventually_async(check, what=f"{self.name} to heartbeat", timeout=timeout)

    def stop(self) -> None:
        """Cleanup: SIGKILL if still running."""
        with contextlib.suppress(Exception):
            self.kill()


@contextlib.contextmanager
def worker_processes(settings: Settings, log_dir: Path) -> Any:
    """A factory of worker processes, all killed at the end of the block."""
    started: list[WorkerProcess] = []

    def spawn(name: str, **env: str) -> WorkerProcess:
        process = WorkerProcess(settings, log_dir, name, **env)
        started.append(process)
        return process

    try:
        yield spawn
    finally:
        for process in started:
            process.stop()


class Receiver:
    """A local HTTP server that records what it is sent and answers from a script of status codes (then 200)."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        import http.server
        import threading

        self.statuses = list(statuses or [])
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                receiver.requests.append((self.command, self.path, dict(self.headers.items()), body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_POST = do_PUT = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
