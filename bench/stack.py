"""The stack under test, started and stopped by the bench on free loopback ports with a temporary data dir.

``Stack(mode="emulator")`` (the default) runs ``inferq up`` exactly as a user would, with a fixed fleet
(``INFERQ_SCALE_MIN = INFERQ_SCALE_MAX = workers``: the emulator's scaler asks for that many and its ECS agent
starts them) and its own API key (``INFERQ_API_KEYS=bench:<key>``). ``mode="direct"`` starts the same processes
without the emulator (embedded Valkey, ``uvicorn functions.gateway.app:app``, ``workers`` x ``python -m
gpu_worker``): a fallback for when ``inferq up`` is broken, and a way to tell the emulator's own cost apart.

Every process is started in its own session and stopped by its pid (SIGTERM, then SIGKILL of its group).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from emulator.valkey import ValkeyProcess, free_port

READY_TIMEOUT_S = 90.0
ROOT = Path(__file__).resolve().parent.parent


class StackError(RuntimeError):
    pass


def _term_with_parent() -> None:
    """In the child: SIGTERM when the bench dies, however it dies (Linux PR_SET_PDEATHSIG), so a killed bench
    leaves no stack behind (``inferq up`` then stops its own children)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def _stop(process: subprocess.Popen[bytes] | None, timeout: float = 30.0) -> None:
    """SIGTERM the process we started, wait, then SIGKILL its own process group (it leads it: new session)."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


class Stack:
    def __init__(self, *, workers: int, window: int, mode: str = "emulator", env: dict[str, str] | None = None,
                 log_dir: Path | None = None, name: str = "stack", gateways: int = 1) -> None:
        if mode not in ("emulator", "direct"):
            raise ValueError(f"unknown stack mode {mode!r}")
        if gateways != 1 and mode != "direct":
            raise ValueError("several gateway processes (uvicorn --workers) need the direct stack")
        self.gateways = gateways
        self.workers = workers
        self.window = window
        self.mode = mode
        self.name = name
        self.extra_env = dict(env or {})
        self.api_key = "bench_" + secrets.token_urlsafe(18)
        self.port = free_port()
        self.valkey_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.redis_url = f"redis://127.0.0.1:{self.valkey_port}/0"
        self.data_dir = Path(tempfile.mkdtemp(prefix="inferq-bench-"))
        self.log_dir = log_dir or self.data_dir
        self.log_path = self.log_dir / f"{name}.log"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.argv: dict[int, str] = {}  # pid -> command line
        self.valkey: ValkeyProcess | None = None
        self.started_in_s: float | None = None

    # ------------------------------------------------------------------ environment

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERQ_", "UVICORN_"))}
        env.update({
            "INFERQ_API_KEYS": f"bench:{self.api_key}",
            "INFERQ_SCALE_MIN": str(self.workers),
            "INFERQ_SCALE_MAX": str(self.workers),
            "INFERQ_WINDOW": str(self.window),
            # the load generators are one tenant with up to hundreds of closed loops, each in a long poll: the
            # per-tenant cap on waits (a bound between tenants, docs/operations.md) would turn them into pollers
            "INFERQ_TENANT_MAX_WAITS": "0",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        })
        env.update(self.extra_env)
        return env

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "workers": self.workers, "window": self.window, "gateways": self.gateways,
                "env": {k: v for k, v in self.env().items()
                        if k.startswith(("INFERQ_", "UVICORN_")) and k != "INFERQ_API_KEYS"},
                "started_in_s": self.started_in_s}

    # ------------------------------------------------------------------ start / stop

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _popen(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        try:
            process = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True,
                                       preexec_fn=_term_with_parent)
        finally:
            log.close()
        self.processes.append(process)
        self.argv[process.pid] = " ".join(argv)
        return process

    def start(self) -> None:
        t0 = time.monotonic()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.mode == "emulator":
            self._start_emulator()
        else:
            self._start_direct()
        self._wait_fleet()
        self.started_in_s = time.monotonic() - t0

    def _start_emulator(self) -> None:
        argv = [sys.executable, "-m", "inferq.cli.main", "up", "--host", "127.0.0.1", "--port", str(self.port),
                "--data-dir", str(self.data_dir), "--valkey-port", str(self.valkey_port)]
        process = self._popen(argv, self.env())
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise StackError(f"inferq up exited with {process.returncode}; log: {self.log_path}\n{self.tail()}")
            if "inferq: ready on http" in self.log_path.read_text(errors="replace"):
                return
            time.sleep(0.1)
        raise StackError(f"inferq up was not ready within {READY_TIMEOUT_S:g}s; log: {self.log_path}\n{self.tail()}")

    def _start_direct(self) -> None:
        self.valkey = ValkeyProcess(self.data_dir / "valkey", port=self.valkey_port, appendfsync="everysec",
                                    log_file=self.log_dir / f"{self.name}-valkey.log").start()
        env = {**self.env(), "INFERQ_REDIS_URL": self.redis_url, "INFERQ_METRICS_PORT": "0"}
        self._popen([sys.executable, "-m", "uvicorn", "functions.gateway.app:app", "--host", "127.0.0.1",
                     "--port", str(self.port), "--no-server-header", "--no-access-log",
                     *(["--workers", str(self.gateways)] if self.gateways > 1 else [])], env)
        for i in range(self.workers):
            self._popen([sys.executable, "-m", "gpu_worker"], {**env, "INFERQ_WORKER_ID": f"bench-{i}"})
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise StackError(f"the gateway was not ready within {READY_TIMEOUT_S:g}s\n{self.tail()}")

    def _wait_fleet(self) -> None:
        """Until ``/v1/scale`` shows exactly ``workers`` live workers (heartbeats)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        seen: Any = None
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(httpx.HTTPError, ValueError):
                seen = httpx.get(self.url + "/v1/scale", headers=self.headers, timeout=5).json()
                if seen.get("workers") == self.workers:
                    return
            time.sleep(0.2)
        raise StackError(f"{self.workers} worker(s) not live within {READY_TIMEOUT_S:g}s (last /v1/scale: {seen})"
                         f"\n{self.tail()}")

    def _check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise StackError(f"{self.argv.get(process.pid, process.pid)} exited with {process.returncode}"
                                 f"\n{self.tail()}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def scale(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/v1/scale", headers=self.headers, timeout=5).json())

    def pids(self) -> dict[str, list[int]]:
        """Process ids by role (for profiling): the gateway's and the workers'."""
        roles: dict[str, list[int]] = {"gateway": [], "worker": [], "valkey": [], "supervisor": []}
        if self.mode == "direct":
            for process in self.processes:
                roles["gateway" if "uvicorn" in self.argv[process.pid] else "worker"].append(process.pid)
            if self.valkey is not None and self.valkey.process is not None:
                roles["valkey"].append(self.valkey.process.pid)
            return roles
        supervisor = self.processes[0].pid
        roles["supervisor"].append(supervisor)
        for pid, argv in _children(supervisor):
            if "uvicorn" in argv:
                roles["gateway"].append(pid)
            elif "gpu_worker" in argv:
                roles["worker"].append(pid)
            elif "valkey-server" in argv:
                roles["valkey"].append(pid)
        return roles

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds (user + system) used so far by each role's processes: the gateway, the workers, Valkey and
        the rest of the emulator (supervisor with moto and the ECS agent, scaler)."""
        return self._by_role(_cpu_s)

    def io_calls_by_role(self) -> dict[str, float]:
        """Read and write system calls made so far by each role's processes (:func:`io_calls`)."""
        return self._by_role(io_calls)

    def _by_role(self, measure: Callable[[int], float]) -> dict[str, float]:
        totals: dict[str, float] = {}
        if self.mode == "direct":  # with their children: uvicorn --workers N forks N gateway processes
            members = [(p.pid, self.argv[p.pid]) for p in self.processes]
            members += [(pid, self.argv[p.pid]) for p in self.processes for pid, _ in _children(p.pid)]
            if self.valkey is not None and self.valkey.process is not None:
                members.append((self.valkey.process.pid, "valkey-server"))
        else:
            supervisor = self.processes[0].pid
            members = [(supervisor, "supervisor"), *_children(supervisor)]
        for pid, argv in members:
            role = ("gateway" if "uvicorn" in argv else "workers" if "gpu_worker" in argv
                    else "valkey" if "valkey-server" in argv else "emulator (supervisor, moto, scaler)")
            totals[role] = totals.get(role, 0.0) + measure(pid)
        return totals

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        for process in reversed(self.processes):
            _stop(process)
        if self.valkey is not None:
            self.valkey.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def io_calls(pid: int) -> float:
    """The read and write system calls a process has made (``/proc/PID/io``: ``syscr`` + ``syscw``): the
    read(2)/write(2) family, which libuv (uvloop: the gateway, the workers, the floor's worker) and Valkey use for
    their sockets; ``send``/``recv`` are not counted. A count, not a time: the same code under the same load makes
    about the same number whatever else the machine runs. 0 when unreadable."""
    try:
        fields = dict(line.split(": ", 1) for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        return float(int(fields["syscr"]) + int(fields["syscw"]))
    except (OSError, KeyError, ValueError):
        return 0.0


def _children(pid: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out.append((int(child), argv))
                out.extend(_children(int(child)))
    return out


def spawn_worker(redis_url: str, queue: str, window: int, log_path: Path,
                 extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """One ``python -m gpu_worker`` on ``queue`` (cold start, worker drain and V's figures), at the default log level
    as a user runs it unless ``extra_env`` sets another; stop it with ``_stop``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env.update({"INFERQ_REDIS_URL": redis_url, "INFERQ_QUEUE": queue, "INFERQ_WINDOW": str(window),
                "INFERQ_METRICS_PORT": "0", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    env.update(extra_env or {})
    log = open(log_path, "ab")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen([sys.executable, "-m", "gpu_worker"], env=env, cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_term_with_parent)
    finally:
        log.close()


stop_process = _stop
