"""`make sam-local` (emulator/samlocal.py) run as a user runs it, with a real dockerd of its own and the real SAM CLI:
the HTTP API's authorizer Lambda refuses a request without a valid key before the gateway Lambda runs, and lets a
valid one through, in either header; the gateway Lambda under `sam local start-api` accepts a job, and reads it back
once a worker has run it; the worker exists because `sam local invoke ScalerFunction` set the emulator's ECS
desired count (no other scaler runs: `--scaler none`); SIGTERM stops everything, leaving no process, container,
engine or bridge behind.

The tests run in file order against one stack, as a person trying it would. The Lambda base image's root filesystem
is cached in ~/.cache/inferq/sam (a minute to build the first time), aws-sam-cli in .tools/sam (`make sam-tools`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from emulator.samlocal import SAM, STATE_FILE

from .conftest import MEASURED, ROOT, free_ports, unavailable
from .engine import EngineUnavailable, install_packages

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HELLO = {"body": {"model": "mock", "messages": [{"role": "user", "content": "Hello from a Lambda container"}]}}


@dataclass
class SamLocal:
    """The running `python -m emulator.samlocal` and what it wrote into its data directory."""

    process: subprocess.Popen[bytes]
    data_dir: Path
    log: Path
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def api(self) -> str:
        return str(self.state["api"])

    def http(self, *, key: bool = True) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.state['api_key']}"} if key else {}
        return httpx.Client(base_url=self.api, headers=headers, timeout=60)

    def ecs(self) -> Any:
        endpoints = self.state["endpoints"]
        return boto3.client("ecs", endpoint_url=endpoints["aws_endpoint"], region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def desired_count(self) -> int:
        endpoints = self.state["endpoints"]
        services = self.ecs().describe_services(cluster=endpoints["ecs_cluster"], services=[endpoints["ecs_service"]])
        return int(services["services"][0]["desiredCount"])

    def docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DOCKER_HOST": self.state["docker_host"]}
        docker = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"  # the CLI of Debian's dockerd
        return subprocess.run([docker, *args], env=env, capture_output=True, text=True, check=True)

    def invocations(self, handler: str) -> int:
        """How many times `sam local` has invoked ``handler`` so far (it logs each invocation before it runs)."""
        return self.log.read_text(errors="replace").count(f"Invoking {handler} ")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=180)
        return int(self.process.returncode)


@pytest.fixture(scope="module")
def sam_local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SamLocal]:
    if os.geteuid() != 0:
        unavailable("dockerd needs root, and this test runs as an unprivileged user")
    try:
        install_packages()
    except EngineUnavailable as exc:
        unavailable(str(exc))
    started = time.monotonic()
    tools = subprocess.run(["make", "sam-tools"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert tools.returncode == 0, tools.stderr[-3000:]
    MEASURED["sam local: make sam-tools"] = f"{time.monotonic() - started:.0f} s"
    data_dir = tmp_path_factory.mktemp("sam-local")
    api_port, gateway_port = free_ports(2)
    log = data_dir / "sam-local.log"
    command = [sys.executable, "-m", "emulator.samlocal", "--private-engine", "--scaler", "none",
               "--data-dir", str(data_dir), "--api-port", str(api_port), "--port", str(gateway_port)]
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    stack = SamLocal(process, data_dir, log)
    try:
        deadline = time.monotonic() + 600
        while "sam-local: ready" not in log.read_text(errors="replace"):
            assert process.poll() is None, f"samlocal exited with {process.returncode}:\n{stack.tail()}"
            assert time.monotonic() < deadline, f"samlocal not ready in 600 s:\n{stack.tail()}"
            time.sleep(1)
        MEASURED["sam local: engine, base image, sam build, emulator, start-api"] = (
            f"{time.monotonic() - started:.0f} s"
        )
        stack.state = json.loads((data_dir / STATE_FILE).read_text())
        yield stack
    finally:
        stack.stop()


GATEWAY = "functions/gateway/app.handler"
AUTHORIZER = "functions/authorizer/app.handler"


def test_a_request_without_a_valid_key_is_refused_by_the_authorizer_before_the_gateway_runs(
    sam_local: SamLocal,
) -> None:
    gateway, authorizer = sam_local.invocations(GATEWAY), sam_local.invocations(AUTHORIZER)
    with sam_local.http(key=False) as client:
        refused = [client.post("/v1/jobs", json=HELLO), client.get("/v1/dlq", headers={"x-api-key": "not-a-key"}),
                   client.get("/v1/dlq", headers={"Authorization": "Bearer not-a-key"})]
    for response in refused:
        # API Gateway's own answer (sam local words it as a REST API would; AWS's HTTP API says "Forbidden"), not
        # the gateway's envelope: the gateway never saw the request
        assert response.status_code == 403, response.text
        assert set(response.json()) == {"message"}, response.text
    assert sam_local.invocations(AUTHORIZER) == authorizer + len(refused), sam_local.tail()
    assert sam_local.invocations(GATEWAY) == gateway, sam_local.tail()


def test_a_valid_key_in_either_header_is_let_through_and_public_routes_need_none(sam_local: SamLocal) -> None:
    gateway, authorizer = sam_local.invocations(GATEWAY), sam_local.invocations(AUTHORIZER)
    key = sam_local.state["api_key"]
    with sam_local.http(key=False) as client:
        assert client.get("/v1/dlq", headers={"x-api-key": key}).status_code == 200
        assert client.get("/v1/dlq", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert sam_local.invocations(AUTHORIZER) == authorizer + 2, sam_local.tail()
        assert sam_local.invocations(GATEWAY) == gateway + 2, sam_local.tail()
        assert client.get("/healthz").json() == {"status": "ok"}  # public: no authorizer
        assert sam_local.invocations(AUTHORIZER) == authorizer + 2, sam_local.tail()
        # the console's page, keyless (sam local routes it to the public `/console`; in AWS it reaches the
        # catch-all, whose authorizer lets it through: tests/unit/authorizer/test_app.py)
        assert client.get("/console/").status_code == 200
    assert sam_local.invocations(GATEWAY) == gateway + 4, sam_local.tail()


def test_the_scaler_lambda_sizes_the_fleet_and_a_worker_runs_the_job_the_gateway_lambda_took(
    sam_local: SamLocal,
) -> None:
    with sam_local.http() as client:
        submitted = client.post("/v1/jobs", json=HELLO)
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]
        assert submitted.headers["location"] == f"/v1/jobs/{job_id}"
        # nothing sizes the fleet but the scaler Lambda: no worker yet, the job waits
        assert sam_local.desired_count() == 0
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"

        state = sam_local.state
        started = time.monotonic()
        invoked = subprocess.run(
            [str(SAM), "local", "invoke", "ScalerFunction", "--template-file", state["template"], "--env-vars",
             state["env_vars"], "--event", state["wake_event"], "--skip-pull-image"],
            env={**os.environ, "DOCKER_HOST": state["docker_host"], "AWS_ACCESS_KEY_ID": "testing",
                 "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1", "SAM_CLI_TELEMETRY": "0"},
            cwd=sam_local.data_dir, capture_output=True, text=True, timeout=300,
        )
        MEASURED["sam local: invoke ScalerFunction"] = f"{time.monotonic() - started:.1f} s"
        assert invoked.returncode == 0, invoked.stderr[-3000:]
        answer = json.loads(invoked.stdout.strip().splitlines()[-1])
        assert answer["trigger"] == "wake" and answer["desired"] == 1 and answer["errors"] == [], answer
        assert sam_local.desired_count() == 1

        finished = client.get(f"/v1/jobs/{job_id}", params={"wait": 20})
    assert finished.status_code == 200, finished.text
    job = finished.json()
    assert job["status"] == "succeeded", job
    assert job["result"]["body"]["choices"][0]["message"]["content"].endswith("Hello from a Lambda container")


def test_sigterm_stops_everything_it_started(sam_local: SamLocal) -> None:
    engine_state = Path(sam_local.state["private_engine"])
    children = dict(sam_local.state["children"])
    # sam removes each request's container when it has answered: none is left while the stack runs on
    deadline = time.monotonic() + 30
    while listed := sam_local.docker("ps", "--all", "--quiet").stdout.split():
        assert time.monotonic() < deadline, f"containers left after their requests: {listed}"
        time.sleep(1)

    started = time.monotonic()
    assert sam_local.stop() == 0, sam_local.tail()
    MEASURED["sam local: SIGTERM until everything stopped"] = f"{time.monotonic() - started:.0f} s"

    for name, pid in children.items():
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), name
    ours = [str(engine_state), str(sam_local.data_dir)]
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(path in text for path in ours):
            left.append(text)
    assert left == [], left
    assert not engine_state.exists(), f"{engine_state} left behind"
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    bridge = sam_local.state["container_host"]
    assert bridge not in subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout, links
    assert not (sam_local.data_dir / STATE_FILE).exists()
