"""End-to-end fixtures: ``inferq up`` run as a real subprocess on free ports, with a temporary data dir and short
timings, driven over HTTP only. Process checks read ``/proc`` (the emulator runs in its own session, so its
process group holds exactly the processes it started)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from emulator.valkey import free_port
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"succeeded", "failed", "cancelled", "expired"}

FAST = {
    "INFERQ_SCALER_INTERVAL_S": "1",
    "INFERQ_SCALE_DOWN_COOLDOWN_S": "3",
    "INFERQ_SCALE_TO_ZERO_AFTER_S": "4",
    "INFERQ_CLAIM_IDLE_MS": "2000",
    "INFERQ_SCALE_MAX": "3",
    "INFERQ_WINDOW": "4",
    "INFERQ_DRAIN_S": "2",
    "INFERQ_RETRY_BASE_MS": "50",
    "INFERQ_RETRY_MAX_MS": "200",
}


def process_group(pgid: int) -> dict[int, str]:
    """Live (non-zombie) processes of a process group: pid -> command line."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found[int(entry)] = cmdline.strip()
    return found


def chat(text: str, **mock: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "mock", "messages": [{"role": "user", "content": text}]}
    if mock:
        body["mock"] = mock
    return {"body": body}


class Emulator:
    """One ``inferq up`` subprocess and an HTTP client for its gateway."""

    def __init__(
        self, data_dir: Path, env: dict[str, str], valkey_args: tuple[str, ...] = ("--valkey-port", "0")
    ) -> None:
        self.data_dir = data_dir
        self.valkey_args = valkey_args
        self.port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERQ_", "AWS_"))}
        self.env.update(env)
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_s = 0.0
        self.http: httpx.Client | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 60.0) -> Emulator:
        argv = [sys.executable, "-m", "inferq.cli.main", "up", "--port", str(self.port),
                "--data-dir", str(self.data_dir), *self.valkey_args]
        log = self.log_path.open("ab")
        started = time.monotonic()
        self.process = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"inferq up exited with {self.process.returncode}:\n{self.logs()[-4000:]}")
            return "inferq: ready on" in self.logs()

        eventually(ready, what="inferq: ready", timeout=timeout)
        self.ready_s = time.monotonic() - started
        dev_key = self.data_dir / "dev-api-key"  # none when the test gives its own INFERQ_API_KEYS: its first key
        key = (dev_key.read_text() if dev_key.exists() else self.env["INFERQ_API_KEYS"].split(",")[0].split(":")[1])
        key = key.strip()
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=30.0)
        return self

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ------------------------------------------------------------------ HTTP

    @property
    def client(self) -> httpx.Client:
        assert self.http is not None
        return self.http

    def submit(self, request: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post("/v1/jobs", json=request)
        assert response.status_code == 202, response.text
        return response.json()

    def job(self, job_id: str, wait: int = 0) -> dict[str, Any]:
        response = self.client.get(f"/v1/jobs/{job_id}", params={"wait": wait} if wait else None)
        assert response.status_code == 200, response.text
        return response.json()

    def finish(self, job_id: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            job = self.job(job_id, wait=max(1, min(20, int(left))))
            if job["status"] in TERMINAL or left <= 0:
                return job

    def scale(self) -> dict[str, Any]:
        response = self.client.get("/v1/scale")
        assert response.status_code == 200, response.text
        return response.json()

    # ------------------------------------------------------------------ processes

    def processes(self) -> dict[int, str]:
        return process_group(self.pid)

    def workers(self) -> list[int]:
        return sorted(pid for pid, cmd in self.processes().items() if "gpu_worker" in cmd)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        if self.http is not None:
            self.http.close()
            self.http = None
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            self.process.wait(10)
            raise AssertionError(f"inferq up did not stop within {timeout}s:\n{self.logs()[-4000:]}") from None

    def cleanup(self) -> None:
        """SIGTERM stops everything (asserted), and whatever happened, nothing is left running on the machine."""
        if self.process is None:
            return
        code = self.stop(timeout=60.0)
        leftovers = self.processes()
        if leftovers:
            os.killpg(self.pid, signal.SIGKILL)
        assert not leftovers, f"inferq up left processes behind: {leftovers}"
        assert code in (0, -signal.SIGKILL), f"inferq up exited with {code}:\n{self.logs()[-3000:]}"


@contextlib.contextmanager
def running_emulator(tmp_path_factory: pytest.TempPathFactory, **env: str) -> Iterator[Emulator]:
    """``inferq up`` with short timings (and ``env``) for the block, then stopped with nothing left running."""
    emulator = Emulator(tmp_path_factory.mktemp("inferq") / "data", {**FAST, **env})
    try:
        yield emulator.start()
    finally:
        emulator.cleanup()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The emulator shared by the tests that need only a running stack with short timings and leave it as they
    found it: no test on it kills its parts (those start their own, :func:`own_stack`) or relies on another having
    run first."""
    with running_emulator(tmp_path_factory) as emulator:
        yield emulator


@pytest.fixture
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Emulator]]:
    """``own_stack(**env)``: a stack of the test's own (it kills parts of it, needs it fresh, or sets it up
    differently), stopped when the test ends, so no stack idles on for the rest of the session."""
    with contextlib.ExitStack() as stacks:
        yield lambda **env: stacks.enter_context(running_emulator(tmp_path_factory, **env))
