"""emulator/compose.yaml and gpu_worker/Dockerfile, built and run: the worker image is small and unprivileged, the
stack serves jobs over HTTP, the gateway container streams a job's Server-Sent Events as it runs (not at its end), a
worker container killed mid-job loses nothing (its job is reclaimed), `compose stop` drains the workers (SIGTERM:
release, exit 0), every accepted job ends exactly once, and `down -v` leaves nothing.

The tests run in file order against one stack (tests/docker/conftest.py); each builds on the state the one before
left, as a person trying the compose path would."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from inferq.queue.keys import Keys
from tests.infra.cfn import TEMPLATE, Resolver, load
from tests.support.waiting import NeverHappened, eventually

from .conftest import MEASURED, ROOT, WORKERS, Stack, free_ports
from .engine import Engine

# Building a Debian base, three images and starting the stack takes minutes on a fresh two-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

KEYS = Keys("default")
ACCEPTED: list[str] = []  # every job the gateway answered 202, across the tests


def submit(stack: Stack, text: str, **mock: Any) -> str:
    body: dict[str, Any] = {"model": "mock", "messages": [{"role": "user", "content": text}]}
    if mock:
        body["mock"] = mock
    with stack.http() as client:
        response = client.post("/v1/jobs", json={"body": body})
    assert response.status_code == 202, response.text
    ACCEPTED.append(response.json()["id"])
    return str(response.json()["id"])


def job(stack: Stack, job_id: str, wait: int = 0) -> dict[str, Any]:
    with stack.http() as client:
        response = client.get(f"/v1/jobs/{job_id}", params={"wait": wait} if wait else None)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def wait_terminal(stack: Stack, job_ids: list[str], timeout: float = 120) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    jobs: dict[str, dict[str, Any]] = {}
    for job_id in job_ids:
        while (jobs.setdefault(job_id, job(stack, job_id, wait=10)))["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, f"{job_id} not done in {timeout}s: {jobs[job_id]}\n{stack.logs()}"
            jobs[job_id] = job(stack, job_id, wait=10)
    return jobs


def wait_running(stack: Stack, job_ids: list[str], timeout: float = 60) -> None:
    try:
        eventually(lambda: all(job(stack, j)["status"] == "running" for j in job_ids), what="the jobs all running",
                   timeout=timeout, interval=0.3)
    except NeverHappened as failure:
        raise NeverHappened(f"{failure}\n{stack.logs(['worker'])}") from None


def test_worker_image_is_small_unprivileged_and_has_no_build_tools(engine: Engine, stack: Stack) -> None:
    image = stack.env["WORKER_IMAGE"]
    config: Any = engine.inspect("image", image)["Config"]
    assert config["User"] == "10001:10001"
    assert config["Cmd"] == ["python", "-m", "gpu_worker"]
    probe = (
        "id -u; for tool in gcc cc c++ make ld as; do command -v $tool; done; "
        "ls -d /root/.cache /home/inferq/.cache 2>/dev/null; python -m pip --version 2>/dev/null; "
        "python -c 'import gpu_worker, redis, httpx, uvloop; print(\"imports ok\")'"
    )
    result = engine.run(["run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c", probe])
    assert result.stdout.split() == ["10001", "imports", "ok"], result.stdout
    size = int(engine.inspect("image", image)["Size"])  # type: ignore[call-overload]
    # boto3's botocore alone is about 100 MB; a compiler toolchain or a pip cache would push it far past this.
    assert size < 400e6, f"worker image is {size / 1e6:.0f} MB"


def test_the_stack_serves_jobs_over_http(stack: Stack) -> None:
    assert len(stack.containers("worker")) == WORKERS
    ids = [submit(stack, f"hello {i}") for i in range(6)]
    jobs = wait_terminal(stack, ids)
    for i, job_id in enumerate(ids):
        assert jobs[job_id]["status"] == "succeeded", jobs[job_id]
        assert f"hello {i}" in str(jobs[job_id]["result"]["body"])
    with stack.http() as client:
        scale = client.get("/v1/scale")
    assert scale.status_code == 200, scale.text  # the scaler container has written its decision


@dataclass
class Streamed:
    """A streamed chat completion as a client read it: its job, its text pieces, the job's status when the first
    arrived, and when the first and last came (seconds from the request; printed, never asserted)."""

    job_id: str
    pieces: list[str]
    status_at_first_piece: str | None
    first: float
    last: float


def stream_chat(stack: Stack, client: httpx.Client, words: str) -> Streamed:
    """POST /v1/chat/completions with ``stream: true`` through ``client``, read as its events arrive."""
    body = {
        "model": "mock",
        "messages": [{"role": "user", "content": words}],
        "stream": True,
        "mock": {"latency_ms": 3000},  # 30 pieces over 3 s; the worker writes what it has every 500 ms
    }
    pieces: list[str] = []
    status_at_first_piece: str | None = None
    done = False
    started = time.monotonic()
    first = last = 0.0
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, response.read().decode()
        assert response.headers["content-type"].startswith("text/event-stream")
        job_id = response.headers["inferq-job-id"]
        ACCEPTED.append(job_id)
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue  # the blank line between events, a keep-alive comment
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            assert "error" not in chunk, chunk
            content = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            if not content:
                continue
            last = time.monotonic() - started
            pieces.append(content)
            if status_at_first_piece is None:
                first = last
                status_at_first_piece = job(stack, job_id)["status"]  # read after the text came: an event, no clock
    assert done, f"the stream ended without [DONE]: {pieces}"
    return Streamed(job_id, pieces, status_at_first_piece, first, last)


def assert_streamed_as_it_ran(stack: Stack, streamed: Streamed, words: str) -> None:
    assert streamed.status_at_first_piece == "running", "the first text came when the job had ended, not as it ran"
    final = wait_terminal(stack, [streamed.job_id])[streamed.job_id]
    assert final["status"] == "succeeded", final
    assert "".join(streamed.pieces) == final["result"]["body"]["choices"][0]["message"]["content"] == words
    assert len(streamed.pieces) > 1, streamed.pieces


def test_the_gateway_container_streams_events_as_the_job_runs(stack: Stack) -> None:
    """The way to stream on AWS is this container behind an ALB (docs/api.md): its events must leave as the output
    is made. Buffered, the first content would come only once the job had ended, and the job would not be running."""
    words = " ".join(f"word{i}" for i in range(30))
    with stack.http() as client:
        streamed = stream_chat(stack, client, words)
    assert_streamed_as_it_ran(stack, streamed, words)
    MEASURED["SSE through the gateway container"] = (
        f"first chunk {streamed.first:.2f} s, last {streamed.last:.2f} s, {len(streamed.pieces)} chunks (a 3 s job)"
    )


def test_the_streaming_gateway_image_streams_as_the_task_definition_starts_it(
    engine: Engine, base_images: dict[str, str], stack: Stack
) -> None:
    """template.yaml's StreamingGateway, short of AWS: the gateway image built from its lock
    (functions/gateway/container.lock, hashes checked) and started as the task definition starts it (its command,
    an init process, no capability), on this stack's Valkey and moto, streams a job as it runs and takes a file
    past the 1 MiB that Starlette spools to /tmp."""
    tag = f"{stack.project}-gateway:local"
    started = time.monotonic()
    engine.run(["build", "--network", "host", "--file", str(ROOT / "gpu_worker" / "Dockerfile"),
                "--build-arg", f"PYTHON_IMAGE={base_images['PYTHON_IMAGE']}", "--build-arg", "INFERQ_EXTRAS=gateway",
                "--build-arg", "EXTRA_SOURCES=functions", "--tag", tag, str(ROOT)], timeout=900)
    size = int(engine.inspect("image", tag)["Size"])  # type: ignore[call-overload]
    MEASURED["streaming gateway image (built from its lock; size)"] = (
        f"{time.monotonic() - started:.0f} s; {size / 1e6:.0f} MB")
    (port,) = free_ports(1)
    template = load(TEMPLATE)
    task = Resolver(template, overrides={"StreamingGateway": "enabled"}).value(
        template["Resources"]["StreamingGatewayTaskDefinition"]["Properties"])
    (definition,) = task["ContainerDefinitions"]
    command = [str(a) for a in definition["Command"]]
    assert definition["LinuxParameters"] == {"InitProcessEnabled": True, "Capabilities": {"Drop": ["ALL"]}}
    command[command.index("--host") + 1], command[command.index("--port") + 1] = "127.0.0.1", str(port)
    env = {"INFERQ_REDIS_URL": stack.redis_url, "INFERQ_API_KEYS": f"test:{stack.api_key}",
           "INFERQ_FILES_BUCKET": "inferq-files", "INFERQ_WEBHOOK_SECRETS_KEY": "alias/inferq-webhook-secrets",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{stack.env['MOTO_PORT']}", "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
    run = ["run", "--detach", "--network", "host", "--init", "--cap-drop", "ALL"]
    for name, value in env.items():
        run += ["--env", f"{name}={value}"]
    container = engine.run([*run, tag, *command]).stdout.strip()
    try:
        base = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            eventually(ready, what="the streaming gateway container ready", timeout=120, interval=0.5)
        except NeverHappened as failure:
            raise NeverHappened(f"{failure}\n{engine.run(['logs', container], check=False).stderr[-4000:]}") from None
        words = " ".join(f"piece{i}" for i in range(30))
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=30) as client:
            streamed = stream_chat(stack, client, words)
        assert_streamed_as_it_ran(stack, streamed, words)
        line = json.dumps({"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {
            "model": "mock", "messages": [{"role": "user", "content": "x" * 1000}]}}).encode() + b"\n"
        big = line * (1536 * 1024 // len(line))  # 1.5 MiB: past Starlette's in-memory spool
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=60) as client:
            created = client.post("/v1/files", files={"file": ("big.jsonl", big)}, data={"purpose": "batch"})
            assert created.status_code == 200, created.text
            assert client.get(f"/v1/files/{created.json()['id']}/content").content == big
        MEASURED["SSE through the streaming gateway image"] = (
            f"first chunk {streamed.first:.2f} s, last {streamed.last:.2f} s, {len(streamed.pieces)} chunks")
    finally:
        engine.run(["rm", "--force", container], check=False)
        engine.run(["image", "rm", "--force", tag], check=False)


def test_a_worker_killed_mid_job_loses_nothing(engine: Engine, stack: Stack) -> None:
    r = stack.redis()
    reclaimed_before = int(r.hget(KEYS.stats, "reclaimed") or 0)
    # Two workers with a window of one: each takes one of these jobs.
    ids = [submit(stack, f"long {i}", latency_ms=6000) for i in range(WORKERS)]
    wait_running(stack, ids)
    victim = stack.containers("worker")[0]
    engine.run(["kill", victim])  # SIGKILL: no drain, no release; only the lease's idle time can recover the job

    jobs = wait_terminal(stack, ids)
    assert [jobs[j]["status"] for j in ids] == ["succeeded"] * WORKERS, jobs
    assert int(r.hget(KEYS.stats, "reclaimed") or 0) > reclaimed_before
    calls = [int(r.hget(KEYS.mock_calls, j) or 0) for j in ids]
    assert sorted(calls) == [1, 2], calls  # the killed worker's job ran again, elsewhere; the other ran once


def test_compose_stop_drains_workers_and_nothing_is_lost(engine: Engine, stack: Stack) -> None:
    stack("up", "--detach", "--no-build", "--scale", f"worker={WORKERS}", "worker")
    assert len(stack.containers("worker")) == WORKERS
    r = stack.redis()
    released_before = int(r.hget(KEYS.stats, "released") or 0)
    ids = [submit(stack, f"drained {i}", latency_ms=20_000) for i in range(WORKERS)]
    queued = [submit(stack, f"waiting {i}") for i in range(3)]
    wait_running(stack, ids)

    stack("stop", "worker", timeout=120)  # SIGTERM; INFERQ_DRAIN_S=3 is shorter than the jobs
    workers = stack.containers("worker", all_states=True)
    assert workers
    for container in workers:
        state: Any = engine.inspect("container", container)["State"]
        assert (state["Running"], state["ExitCode"]) == (False, 0), state  # drained and exited, not killed
    assert int(r.hget(KEYS.stats, "released") or 0) >= released_before + WORKERS
    for job_id in ids + queued:
        assert job(stack, job_id)["status"] == "queued", job_id  # back in the queue, not lost, not failed

    stack("start", "worker")
    jobs = wait_terminal(stack, ids + queued, timeout=180)
    assert {jobs[j]["status"] for j in ids + queued} == {"succeeded"}


def test_files_work_in_the_compose_stack(stack: Stack) -> None:
    line = (b'{"custom_id": "c0", "method": "POST", "url": "/v1/chat/completions", '
            b'"body": {"model": "mock", "messages": [{"role": "user", "content": "c0"}]}}\n')
    with stack.http() as client:
        created = client.post("/v1/files", files={"file": ("in.jsonl", line)}, data={"purpose": "batch"})
        assert created.status_code == 200, f"{created.text}\n{stack.logs(['gateway', 'moto-init'])}"
        content = client.get(f"/v1/files/{created.json()['id']}/content")
    assert content.status_code == 200 and content.content == line  # stored in moto's S3, read back


def test_every_accepted_job_ended_exactly_once(stack: Stack) -> None:
    stats = {k: int(v) for k, v in stack.redis().hgetall(KEYS.stats).items()}
    assert stats["enqueued"] == len(ACCEPTED) == len(set(ACCEPTED)), stats
    assert stats["succeeded"] == len(ACCEPTED), stats
    assert stats["unfinished"] == 0, stats
    for counter in ("failed", "cancelled", "expired", "dead_lettered", "duplicate_results"):
        assert stats.get(counter, 0) == 0, (counter, stats)


def test_down_with_volumes_leaves_nothing_behind(engine: Engine, stack: Stack) -> None:
    stack("down", "--volumes", "--remove-orphans", timeout=300)
    label = f"label=com.docker.compose.project={stack.project}"
    assert engine.run(["ps", "--all", "--quiet", "--filter", label]).stdout.split() == []
    assert engine.run(["volume", "ls", "--quiet", "--filter", label]).stdout.split() == []
    assert engine.run(["network", "ls", "--quiet", "--filter", label]).stdout.split() == []
