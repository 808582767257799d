"""Fixtures of the Docker path: a private engine, the images built offline (a local Debian base made by
docker/local-base.sh, then gpu_worker/Dockerfile through Compose), and the stack of emulator/compose.yaml up on the
host's network at free ports. Where no engine can be started the tests fail in CI (CI=true) and skip elsewhere.
Module-scoped: in a whole-suite run the stack and the engine are gone before the next module starts."""

from __future__ import annotations

import secrets
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import httpx
import pytest
import redis
import yaml

from tests.support.ci import missing

from .engine import Engine, EngineUnavailable, which

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILES = [ROOT / "emulator" / "compose.yaml", ROOT / "docker" / "compose.host.yaml"]
WORKERS = 2

# What each step took and how big the images are, printed at the end of the run.
MEASURED: dict[str, str] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MEASURED:
        terminalreporter.section("docker path")
        for name, value in MEASURED.items():
            terminalreporter.write_line(f"{name}: {value}")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def compose_command(engine: Engine) -> list[str]:
    """`docker compose` where the plugin is installed, else Debian's docker-compose."""
    probe = subprocess.run([engine.docker, "compose", "version"], env=engine.env, capture_output=True, check=False)
    if probe.returncode == 0:
        return [engine.docker, "compose"]
    compose = which("docker-compose")
    if not compose:
        raise EngineUnavailable("neither the docker compose plugin nor docker-compose is installed")
    return [compose]


def unavailable(reason: str) -> NoReturn:
    """CI must exercise the Docker path, so there a missing engine fails; elsewhere the tests skip, saying why."""
    missing(f"no Docker engine can be started here: {reason}")


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    started = time.monotonic()
    engine = Engine()
    try:
        engine.start()
    except EngineUnavailable as e:
        engine.stop()
        unavailable(str(e))
    except BaseException:
        engine.stop()  # no daemon outlives an interrupted or failed start
        raise
    MEASURED["engine start (with any apt install)"] = f"{time.monotonic() - started:.0f} s"
    yield engine
    engine.stop()
    MEASURED["engine stop, then its state removed"] = ", ".join(f"{k} {v:.0f} s" for k, v in engine.timings.items())
    assert not engine.state.exists(), f"{engine.state} left behind"


@pytest.fixture(scope="module")
def base_images(engine: Engine) -> dict[str, str]:
    """PYTHON_IMAGE, VALKEY_IMAGE and MOTO_IMAGE built with no registry (the root filesystem is cached)."""
    started = time.monotonic()
    result = subprocess.run(
        [str(ROOT / "docker" / "local-base.sh")], env=engine.env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, f"docker/local-base.sh exited {result.returncode}:\n{result.stderr[-4000:]}"
    MEASURED["local bases (rootfs from cache or debootstrap, valkey, moto)"] = f"{time.monotonic() - started:.0f} s"
    images = {}
    for line in result.stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        images[name] = value
    assert set(images) == {"PYTHON_IMAGE", "VALKEY_IMAGE", "MOTO_IMAGE"}, result.stdout
    return images


@dataclass
class Stack:
    """The compose project: its engine, command line, environment and the addresses of its services."""

    engine: Engine
    project: str
    env: dict[str, str]
    api_key: str
    gateway: str
    redis_url: str
    compose: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=lambda: list(COMPOSE_FILES))

    def __call__(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [*self.compose, "--project-name", self.project]
        for path in self.files:
            command += ["--file", str(path)]
        result = subprocess.run(
            [*command, *args], env=self.env, capture_output=True, text=True, timeout=timeout, cwd=ROOT
        )
        if check and result.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}")
        return result

    def render(self, path: Path) -> None:
        """Compose's own rendering of the files, less the published ports of the services on the host's network.

        docker-compose 1.29 refuses a port binding on the host's network, where Compose v2 and the engine only
        drop it, and an override file cannot remove a list; everything else is the files as Compose reads them."""
        config = yaml.safe_load(self("config").stdout)
        for service in config["services"].values():
            if service.get("network_mode") == "host":
                service.pop("ports", None)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.files = [path]

    def containers(self, service: str, *, all_states: bool = False) -> list[str]:
        args = ["ps", "-q", "--filter", f"label=com.docker.compose.project={self.project}"]
        args += ["--filter", f"label=com.docker.compose.service={service}"]
        return self.engine.run([*args, "--all"] if all_states else args).stdout.split()

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.gateway, headers={"Authorization": f"Bearer {self.api_key}"}, timeout=30)

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.gateway}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"gateway not ready in {timeout}s:\n{self.logs()}"
            time.sleep(1)

    def logs(self, services: Sequence[str] = ()) -> str:
        return self("logs", "--no-color", *services, check=False).stdout[-6000:]


@pytest.fixture(scope="module")
def stack(engine: Engine, base_images: dict[str, str]) -> Iterator[Stack]:
    valkey_port, moto_port, gateway_port, wake_port = free_ports(4)
    project = f"inferqtest{secrets.token_hex(3)}"
    api_key = secrets.token_urlsafe(24)
    env = {
        **engine.env,
        **base_images,
        "BUILD_NETWORK": "host",
        "WORKER_IMAGE": f"{project}-worker:local",
        "APP_IMAGE": f"{project}-app:local",
        "BIND_ADDRESS": "127.0.0.1",
        "VALKEY_HOST": "127.0.0.1",
        "VALKEY_PORT": str(valkey_port),
        "MOTO_HOST": "127.0.0.1",
        "MOTO_PORT": str(moto_port),
        "SCALER_HOST": "127.0.0.1",
        "SCALER_WAKE_PORT": str(wake_port),
        "GATEWAY_PORT": str(gateway_port),
        "INFERQ_METRICS_PORT": "0",
        "INFERQ_API_KEYS": f"test:{api_key}",
        # One job per worker, a dead worker's job reclaimed after 3 s, a stopped one releases after 3 s.
        "INFERQ_WINDOW": "1",
        "INFERQ_CLAIM_IDLE_MS": "3000",
        "INFERQ_DRAIN_S": "3",
    }
    stack = Stack(
        engine, project, env, api_key, f"http://127.0.0.1:{gateway_port}", f"redis://127.0.0.1:{valkey_port}/0"
    )
    stack.compose = compose_command(engine)
    stack.render(engine.state / "compose.rendered.yaml")
    started = time.monotonic()
    stack("build", "--parallel", "worker", "gateway", timeout=900)
    MEASURED["worker and app image builds (compose build)"] = f"{time.monotonic() - started:.0f} s"
    for image in ("WORKER_IMAGE", "APP_IMAGE", "VALKEY_IMAGE", "MOTO_IMAGE", "PYTHON_IMAGE"):
        size = int(engine.inspect("image", env[image])["Size"])  # type: ignore[call-overload]
        MEASURED[f"{image} size"] = f"{size / 1e6:.0f} MB"
    started = time.monotonic()
    try:
        stack("up", "--detach", "--no-build", "--scale", f"worker={WORKERS}", timeout=300)
        stack.wait_ready()
        MEASURED["compose up until the gateway is ready"] = f"{time.monotonic() - started:.0f} s"
        yield stack
    finally:
        started = time.monotonic()
        stack("down", "--volumes", "--remove-orphans", timeout=300, check=False)
        MEASURED["compose down at the end"] = f"{time.monotonic() - started:.0f} s"
