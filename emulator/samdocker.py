"""The Docker engine ``make sam-local`` (:mod:`emulator.samlocal`) and ``sam`` talk to, and the addresses that
connect its containers to this machine; with :func:`say`, how sam local reports what it does."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from .dockerd import Bridge, Engine, EngineUnavailable


def say(message: str) -> None:
    print(f"sam-local: {message}", flush=True)


def die_with_parent() -> None:
    """SIGTERM when this process dies, however it dies (Linux PR_SET_PDEATHSIG): sam then removes its containers."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class Docker:
    """The engine ``sam`` and ``docker`` talk to, and the addresses that connect its containers to this machine."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.private: Engine | None = None
        self.docker_host = "" if args.private_engine else (args.docker_host or "")
        if not self.docker_host and not args.private_engine and self._answers("unix:///var/run/docker.sock"):
            self.docker_host = "unix:///var/run/docker.sock"
        self.container_host: str = args.container_host or ""
        self.service_host: str = args.service_host or ""

    @staticmethod
    def _answers(docker_host: str) -> bool:
        docker = shutil.which("docker")
        if not docker or not Path(docker_host.removeprefix("unix://")).exists():
            return False
        probe = subprocess.run([docker, "version"], env={**os.environ, "DOCKER_HOST": docker_host},
                               capture_output=True, check=False)
        return probe.returncode == 0

    def start(self) -> None:
        if self.docker_host:
            desktop = sys.platform != "linux"
            self.container_host = self.container_host or ("host.docker.internal" if desktop else self._gateway())
            self.service_host = self.service_host or ("127.0.0.1" if desktop else self.container_host)
            say(f"engine {self.docker_host}; containers reach this machine at {self.container_host}")
            return
        self.private = Engine(bridge=Bridge.private())
        say("starting a private dockerd with its own bridge")
        self.private.start()
        assert self.private.bridge is not None
        self.container_host = self.container_host or self.private.bridge.address
        self.service_host = self.service_host or self.private.bridge.address
        say(f"engine {self.env['DOCKER_HOST']} (bridge {self.private.bridge.name} {self.private.bridge.address}); "
            f"state in {self.private.state}")

    def _gateway(self) -> str:
        """The default bridge network's gateway: the host's address on docker0, where containers find it."""
        result = subprocess.run([self.docker, "network", "inspect", "bridge", "--format",
                                 "{{range .IPAM.Config}}{{.Gateway}}{{end}}"], env=self.env, capture_output=True,
                                text=True, check=False)
        gateway = result.stdout.strip()
        if result.returncode != 0 or not gateway:
            raise EngineUnavailable("the engine has no default bridge network: give --container-host and "
                                    "--service-host")
        return gateway

    @property
    def docker(self) -> str:
        return self.private.docker if self.private else (shutil.which("docker") or "docker")

    @property
    def env(self) -> dict[str, str]:
        if self.private:
            return self.private.env
        env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_CONTEXT",)}
        env["DOCKER_HOST"] = self.docker_host
        return env

    def stop(self) -> None:
        if self.private:
            self.private.stop()
            took = ", ".join(f"{k} {v:.1f}s" for k, v in self.private.timings.items())
            say(f"private dockerd stopped, its bridge and state removed ({took})")
