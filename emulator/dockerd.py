"""A private Docker engine: Debian's dockerd and containerd on their own sockets, data and state under one temporary
directory, so a Docker the user already runs (``/var/run/docker.sock``, ``/var/lib/docker``) is never touched. Used
by the suite (tests/docker) and by ``make sam-local`` (emulator/samlocal.py) where no engine is given.

Two network set-ups, neither of which touches the machine's firewall (``--iptables=false``, no masquerading, no
forwarding): with no bridge (``--bridge=none``) containers get the host's network, all that compose needs; with
:class:`Bridge`, the engine gets a Linux bridge of its own (created here, removed on stop) and containers get
addresses on it. ``sam local`` needs the latter: it ignores ``--docker-network host``, publishes the runtime's port
on 127.0.0.1 (through the userland proxy, left on for it), and its containers reach the host at the bridge's
address."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Debian's names: the engine (dockerd, its CLI, containerd, runc), the root-filesystem builder and Compose v1,
# which bookworm ships where the `docker compose` plugin is not packaged.
PACKAGES = {"dockerd": "docker.io", "debootstrap": "debootstrap", "docker-compose": "docker-compose"}
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])


class EngineUnavailable(RuntimeError):
    """No Docker engine can be started on this machine (and why)."""


def which(name: str) -> str | None:
    return shutil.which(name, path=SBIN_PATH)


def install_packages() -> None:
    """apt-get installs whatever of PACKAGES is missing (once more after `apt-get update` if the lists are stale)."""
    missing = sorted({package for program, package in PACKAGES.items() if not which(program)})
    if not missing:
        return
    if not shutil.which("apt-get"):
        raise EngineUnavailable(f"{', '.join(missing)} missing and no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=600", *missing]
    if subprocess.run(install, env=env, capture_output=True, text=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
        result = subprocess.run(install, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise EngineUnavailable(f"apt-get install {' '.join(missing)} failed: {result.stderr[-1500:]}")


@dataclass(frozen=True)
class Bridge:
    """A Linux bridge for the engine alone: ``name`` with ``address`` (the host's side, the containers' gateway)."""

    name: str
    address: str
    prefix: int = 24

    @classmethod
    def private(cls) -> Bridge:
        """A name and a /24 of 172.30.0.0/16 that no interface of this machine uses yet."""
        used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        for third in range(99, 255):
            address = f"172.30.{third}.1"
            name = f"iqbr{third}"
            if f"172.30.{third}." not in used and f" {name}:" not in links:
                return cls(name, address)
        raise EngineUnavailable("no free 172.30.x.0/24 for the engine's bridge")

    def create(self) -> None:
        ip = which("ip") or "ip"
        for args in (["link", "add", "name", self.name, "type", "bridge"],
                     ["addr", "add", f"{self.address}/{self.prefix}", "dev", self.name],
                     ["link", "set", self.name, "up"]):
            result = subprocess.run([ip, *args], capture_output=True, text=True)
            if result.returncode != 0:
                self.remove()
                raise EngineUnavailable(f"ip {' '.join(args)}: {result.stderr.strip()}")

    def remove(self) -> None:
        subprocess.run([which("ip") or "ip", "link", "del", self.name], capture_output=True, check=False)


@dataclass
class Engine:
    """dockerd + containerd, started by :meth:`start` and removed, state included, by :meth:`stop`."""

    state: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="iq-docker-", dir="/tmp")))
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    bridge: Bridge | None = None
    """None: containers on the host's network (``--bridge=none``); else the engine's own bridge."""

    @property
    def socket(self) -> Path:
        return self.state / "docker.sock"

    @property
    def env(self) -> dict[str, str]:
        """The environment of every docker and compose command: this engine only, no user configuration."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
        env.update(DOCKER_HOST=f"unix://{self.socket}", DOCKER_CONFIG=str(self.state / "config"), DOCKER=self.docker)
        return env

    @property
    def docker(self) -> str:
        # The CLI packaged with this dockerd: another one on PATH may be newer than the engine speaks.
        return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (which("docker") or "docker")

    def start(self, timeout: float = 90) -> None:
        if os.geteuid() != 0:
            raise EngineUnavailable("dockerd needs root, and this test runs as an unprivileged user")
        install_packages()
        containerd, dockerd = which("containerd"), which("dockerd")
        if not containerd or not dockerd:
            raise EngineUnavailable("docker.io installed no dockerd or containerd")
        for name in ("containerd", "data", "exec", "config"):
            (self.state / name).mkdir(parents=True, exist_ok=True)
        # A containerd of our own, not one the machine may run at /run/containerd (dockerd would share it).
        (self.state / "containerd.toml").write_text(
            "version = 2\n"
            f'root = "{self.state}/containerd/root"\n'
            f'state = "{self.state}/containerd/state"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self.state}/containerd.sock"\n'
            f'[ttrpc]\n  address = "{self.state}/containerd.sock.ttrpc"\n'
            f'[debug]\n  address = "{self.state}/containerd-debug.sock"\n'
        )
        (self.state / "daemon.json").write_text("{}\n")
        if self.bridge is not None:
            self.bridge.create()
            network = [f"--bridge={self.bridge.name}", "--userland-proxy=true"]
        else:
            network = ["--bridge=none", "--userland-proxy=false"]
        log = (self.state / "engine.log").open("ab")
        self.processes.append(
            # a session of their own: a Ctrl-C at the terminal reaches whoever started them, which stops them in order
            subprocess.Popen([containerd, "--config", str(self.state / "containerd.toml")], stdout=log, stderr=log,
                             start_new_session=True)
        )
        self._wait_for(self.state / "containerd.sock", timeout)
        self.processes.append(
            subprocess.Popen(
                [
                    dockerd,
                    f"--config-file={self.state / 'daemon.json'}",
                    f"--containerd={self.state / 'containerd.sock'}",
                    f"--data-root={self.state / 'data'}",
                    f"--exec-root={self.state / 'exec'}",
                    f"--pidfile={self.state / 'docker.pid'}",
                    f"--host=unix://{self.socket}",
                    *network,
                    "--iptables=false",
                    "--ip-masq=false",
                    "--ip-forward=false",
                    "--log-level=warn",
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        )
        deadline = time.monotonic() + timeout
        while self.run(["version"], check=False).returncode != 0:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                tail = (self.state / "engine.log").read_text(errors="replace")[-3000:]
                self.stop()
                raise EngineUnavailable(f"dockerd did not start:\n{tail}")
            time.sleep(0.5)

    def _wait_for(self, path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                tail = (self.state / "engine.log").read_text(errors="replace")[-3000:]
                self.stop()
                raise EngineUnavailable(f"containerd did not start:\n{tail}")
            time.sleep(0.2)

    def run(
        self, args: Sequence[str], *, check: bool = True, timeout: float = 600, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.docker, *args], env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}")
        return result

    def inspect(self, kind: str, ref: str) -> dict[str, object]:
        return json.loads(self.run([kind, "inspect", ref]).stdout)[0]

    def stop(self) -> None:
        """SIGTERM dockerd (it stops its containers) then containerd; unmount what they left; remove the state."""
        started = time.monotonic()
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        self.processes.clear()
        if self.bridge is not None:
            self.bridge.remove()
        self.timings["daemons stopped"] = time.monotonic() - started
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(str(self.state))), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        # Never into a mount that survived: only this engine's own files go.
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.state)], capture_output=True, check=False)
        self.timings["state removed"] = time.monotonic() - started
