"""inferq.client and the CLI built on it, against ``inferq up``: every method, the typed errors, and submit's retries
proven through a loopback server in front of the real gateway that answers 503/429 (with Retry-After) before it
lets a request through, or passes one through and loses the answer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from emulator.valkey import free_port
from inferq.client import (
    AsyncClient,
    Client,
    GatewayUnreachable,
    InvalidRequest,
    JobStatus,
    JobTerminal,
    NotDeadLettered,
    NotFound,
    QueueFull,
    RetryPolicy,
    Unauthorized,
    Unavailable,
)
from tests.support.waiting import eventually

from .conftest import ROOT, Emulator


def chat(text: str, **mock: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "mock", "messages": [{"role": "user", "content": text}]}
    if mock:
        body["mock"] = mock
    return body


@pytest.fixture
def client(stack: Emulator) -> Iterator[Client]:
    with Client(stack.url, (stack.data_dir / "dev-api-key").read_text().strip()) as c:
        yield c


# ---------------------------------------------------------------------- every method


def test_submit_wait_get_and_an_idempotent_replay(client: Client) -> None:
    job = client.submit(chat("hello client"), metadata={"run": "e2e"}, idempotency_key="client-e2e-1")
    assert job.status in (JobStatus.QUEUED, JobStatus.RUNNING) and job.id.startswith("job_")
    done = client.wait(job.id, timeout=60)
    assert done.status is JobStatus.SUCCEEDED and done.terminal
    assert done.text == "hello client" and done.metadata == {"run": "e2e"}
    assert done.started_at is not None and done.finished_at is not None and done.finished_at >= done.started_at
    assert client.get(job.id) == done
    again = client.submit(chat("hello client"), metadata={"run": "e2e"}, idempotency_key="client-e2e-1")
    assert again.id == job.id and again.status is JobStatus.SUCCEEDED


def test_wait_returns_the_job_unfinished_at_its_deadline(client: Client) -> None:
    job = client.submit(chat("slow", latency_ms=8000))
    seen = client.wait(job.id, timeout=1.5)
    assert not seen.terminal  # answered at its deadline, the 8 s job still running
    client.cancel(job.id)


def test_cancel_ends_a_job_and_a_second_cancel_is_job_terminal(client: Client) -> None:
    job = client.submit(chat("never answers", hang=True))
    client.cancel(job.id)
    assert client.wait(job.id, timeout=60).status is JobStatus.CANCELLED
    with pytest.raises(JobTerminal) as refused:
        client.cancel(job.id)
    assert refused.value.status == 409 and refused.value.job is not None
    assert refused.value.job.status is JobStatus.CANCELLED


def test_a_dead_lettered_job_is_listed_and_redriven(client: Client) -> None:
    job = client.submit(chat("doomed", fail_attempts=99))
    failed = client.wait(job.id, timeout=60)
    assert failed.status is JobStatus.FAILED and failed.dead_lettered and failed.error
    assert job.id in [j.id for j in client.dlq(limit=100)]
    again = client.redrive(job.id)
    # queued again with its attempts reset; the answer is the job as read back after the redrive, and a free worker
    # may already have run (and failed) its first attempt by then: fewer attempts than it died with, not exactly 1
    assert again.id == job.id and again.status in (JobStatus.QUEUED, JobStatus.RUNNING)
    assert 1 <= again.attempts < failed.attempts
    assert not again.dead_lettered
    rerun = client.wait(job.id, timeout=60)  # it runs again (and, failing every attempt, ends again)
    assert rerun.terminal and rerun.started_at is not None and rerun.started_at >= again.created_at

    done = client.submit(chat("fine"))
    client.wait(done.id, timeout=60)
    with pytest.raises(NotDeadLettered):
        client.redrive(done.id)


def test_errors_are_typed(client: Client, stack: Emulator) -> None:
    with pytest.raises(NotFound) as missing:
        client.get("job_" + "a" * 26)
    assert missing.value.status == 404 and missing.value.envelope["error"]["type"] == "not_found"
    with pytest.raises(InvalidRequest) as invalid:
        client.submit(chat("x"), url="/v1/embeddings")
    assert invalid.value.status == 422
    with Client(stack.url, "not-a-key") as stranger, pytest.raises(Unauthorized):
        stranger.scale()


def test_scale_and_history(client: Client) -> None:
    scale = client.scale()
    assert {"lag", "pending", "unfinished", "dlq", "workers", "desired"} <= set(scale)
    samples = eventually(lambda: client.history(), what="a history sample from the scaler", timeout=30, interval=0.5)
    assert {"at", "succeeded", "failed", "lag", "delayed", "workers"} <= set(samples[-1])
    assert len(client.history(limit=1)) == 1


def test_the_results_feed_yields_every_terminal_job_once_across_a_resume(client: Client, stack: Emulator) -> None:
    head = client.events(wait=0)
    list(head)  # catch up with what earlier tests left in the feed
    saved_at_start = head.cursor
    assert saved_at_start is not None
    jobs = [client.submit(chat(f"feed {i}")) for i in range(5)]
    jobs.append(client.submit(chat("feed doomed", fail_attempts=99)))
    hung = client.submit(chat("feed hang", hang=True))
    client.cancel(hung.id)
    jobs.append(hung)
    ended = {job.id: client.wait(job.id, timeout=90) for job in jobs}
    assert all(job.terminal for job in ended.values())

    first = client.events(after=saved_at_start, limit=2, max_jobs=3, wait=0)
    seen = [job.id for job in first]
    assert len(seen) == 3
    saved = first.cursor  # what a script would persist between runs

    async def resume() -> list[str]:
        key = (stack.data_dir / "dev-api-key").read_text().strip()
        async with AsyncClient(stack.url, key) as aclient:
            return [job.id async for job in aclient.events(after=saved, limit=2, wait=0)]

    seen += asyncio.run(resume())
    assert len(seen) == len(set(seen)), "a job was yielded twice across the resume"
    assert set(ended) <= set(seen), "a terminal job was missed across the resume"
    statuses = {job.id: job.status for job in client.events(after=saved_at_start, wait=0) if job.id in ended}
    assert statuses == {job_id: job.status for job_id, job in ended.items()}
    assert statuses[hung.id] is JobStatus.CANCELLED and statuses[jobs[5].id] is JobStatus.FAILED

    # long-polling: a stream started before the job ends hands it over when it does
    now = client.events(after=saved, wait=0)
    list(now)
    tail = client.events(after=now.cursor, wait=5, timeout=90)
    late = client.submit(chat("feed late", latency_ms=1500))
    assert late.id in (job.id for job in tail)
    caught_up = client.events(after=saved, wait=0)
    list(caught_up)
    assert list(client.events(after=caught_up.cursor, wait=2, timeout=3)) == []  # a deadline ends a quiet stream
    assert client.events(after=saved, max_jobs=0).cursor == saved  # a zero count asks for nothing


def test_the_async_client_submits_concurrently_and_waits(stack: Emulator) -> None:
    key = (stack.data_dir / "dev-api-key").read_text().strip()

    async def run() -> list[Any]:
        async with AsyncClient(stack.url, key) as aclient:
            jobs = await asyncio.gather(*(aclient.submit(chat(f"async {i}")) for i in range(20)))
            done = await asyncio.gather(*(aclient.wait(j.id, timeout=90) for j in jobs))
            hung = await aclient.submit(chat("async hang", hang=True))
            await aclient.cancel(hung.id)
            done.append(await aclient.wait(hung.id, timeout=60))
            assert await aclient.get(jobs[0].id) == done[0]
            assert isinstance(await aclient.dlq(), list)
            return done

    done = asyncio.run(run())
    assert [j.text for j in done[:20]] == [f"async {i}" for i in range(20)]
    assert done[20].status is JobStatus.CANCELLED


# ---------------------------------------------------------------------- retries, through a loopback server


@dataclass
class Seen:
    method: str
    path: str
    idempotency_key: str | None
    answered: int


@dataclass
class FlakyGateway:
    """A loopback HTTP server in front of the real gateway. ``script`` says, request by request, what to do:
    an int answers that status (with ``Retry-After``) without passing the request on; ``"pass"`` passes it on;
    ``"lose"`` passes it on and answers 503 anyway (the gateway did the work, the answer was lost)."""

    upstream: str
    script: list[int | str]
    retry_after: str = "1"
    seen: list[Seen] = field(default_factory=list)
    upstream_answers: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("content-length") or 0)
        body = handler.rfile.read(length) if length else b""
        step = self.script.pop(0) if self.script else "pass"
        status, payload, headers = 0, b"", {"Content-Type": "application/json"}
        if step in ("pass", "lose"):
            forwarded = {k: v for k, v in handler.headers.items() if k.lower() not in ("host", "content-length")}
            answer = httpx.request(handler.command, self.upstream + handler.path, headers=forwarded, content=body,
                                   timeout=30)
            self.upstream_answers.append({"status": answer.status_code, "body": answer.json()})
            status, payload = answer.status_code, answer.content
            passed = ("location", "idempotent-replayed")
            headers.update({k: v for k, v in answer.headers.items() if k.lower() in passed})
        if step == "lose" or isinstance(step, int):
            status = 503 if step == "lose" else int(step)
            kind = "queue_full" if status == 429 else "unavailable"
            payload = json.dumps({"error": {"type": kind, "message": "injected"}}).encode()
            headers["Retry-After"] = self.retry_after
        self.seen.append(Seen(handler.command, handler.path, handler.headers.get("idempotency-key"), status))
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)


@pytest.fixture
def flaky(stack: Emulator) -> Iterator[Callable[..., FlakyGateway]]:
    servers: list[ThreadingHTTPServer] = []

    def start(script: list[int | str], retry_after: str = "1") -> FlakyGateway:
        gateway = FlakyGateway(stack.url, list(script), retry_after)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                gateway.handle(self)

            do_POST = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        gateway.url = f"http://127.0.0.1:{server.server_address[1]}"
        return gateway

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def dev_key(stack: Emulator) -> str:
    return (stack.data_dir / "dev-api-key").read_text().strip()


def test_503_then_202_is_retried_after_retry_after_with_the_same_key(
    stack: Emulator, flaky: Callable[..., FlakyGateway]
) -> None:
    gateway = flaky([503, 503, "pass"])
    started = time.monotonic()
    with Client(gateway.url, dev_key(stack)) as client:
        job = client.submit(chat("retried"))
    waited = time.monotonic() - started
    posts = [s for s in gateway.seen if s.method == "POST"]
    assert [s.answered for s in posts] == [503, 503, 202]
    keys = {s.idempotency_key for s in posts}
    assert len(keys) == 1 and None not in keys  # generated once, sent on every attempt
    assert waited >= 1.9  # two Retry-After: 1 waits
    assert job.id == gateway.upstream_answers[0]["body"]["id"]


def test_a_lost_answer_retried_returns_the_same_job_not_a_second_one(
    stack: Emulator, flaky: Callable[..., FlakyGateway]
) -> None:
    gateway = flaky(["lose", "pass"])
    with Client(gateway.url, dev_key(stack)) as client:
        job = client.submit(chat("answer lost once"), idempotency_key="lost-answer-1")
    first, second = gateway.upstream_answers
    assert (first["status"], second["status"]) == (202, 200)  # created once, then replayed
    assert first["body"]["id"] == second["body"]["id"] == job.id
    assert [s.idempotency_key for s in gateway.seen] == ["lost-answer-1", "lost-answer-1"]


def test_429_is_retried_and_the_attempts_are_bounded(stack: Emulator, flaky: Callable[..., FlakyGateway]) -> None:
    gateway = flaky([429] * 10)
    retry = RetryPolicy(attempts=3, budget_s=30)
    with Client(gateway.url, dev_key(stack), retry=retry) as client, pytest.raises(QueueFull) as full:
        client.submit(chat("never accepted"))
    assert full.value.status == 429 and full.value.retry_after_s == 1.0
    assert len(gateway.seen) == 3 and len({s.idempotency_key for s in gateway.seen}) == 1
    assert gateway.upstream_answers == []


def test_a_retry_after_beyond_the_budget_gives_up_at_once(
    stack: Emulator, flaky: Callable[..., FlakyGateway]
) -> None:
    gateway = flaky([503] * 3, retry_after="25")
    started = time.monotonic()
    retry = RetryPolicy(attempts=5, budget_s=5)
    with Client(gateway.url, dev_key(stack), retry=retry) as client, pytest.raises(Unavailable):
        client.submit(chat("budget"))
    assert len(gateway.seen) == 1 and time.monotonic() - started < 20


def test_the_async_client_retries_with_the_same_key(stack: Emulator, flaky: Callable[..., FlakyGateway]) -> None:
    gateway = flaky([503, "pass"])

    async def run() -> str:
        async with AsyncClient(gateway.url, dev_key(stack)) as aclient:
            return (await aclient.submit(chat("async retried"))).id

    job_id = asyncio.run(run())
    assert [s.answered for s in gateway.seen] == [503, 202]
    assert gateway.seen[0].idempotency_key == gateway.seen[1].idempotency_key
    assert job_id == gateway.upstream_answers[0]["body"]["id"]


def test_no_gateway_at_all_is_retried_then_gateway_unreachable() -> None:
    retry = RetryPolicy(attempts=2, budget_s=10)
    with Client(f"http://127.0.0.1:{free_port()}", "k", retry=retry) as client, pytest.raises(
        GatewayUnreachable
    ) as unreachable:
        client.submit(chat("nobody home"))
    assert unreachable.value.status == 0


# ---------------------------------------------------------------------- the CLI


def cli(stack: Emulator, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    return subprocess.run([sys.executable, "-m", "inferq.cli.main", *args, "--url", stack.url, "--data-dir",
                           str(stack.data_dir)], cwd=ROOT, env={**env, "COLUMNS": "120"}, input=stdin,
                          capture_output=True, text=True, timeout=180)


def test_cli_bulk_submit_from_jsonl_with_a_progress_bar(stack: Emulator, tmp_path: Path) -> None:
    lines = [{"body": chat(f"bulk {i}"), "metadata": {"i": str(i)}} for i in range(30)]
    lines.append({"custom_id": "batch-line", "method": "POST", "url": "/v1/chat/completions", "body": chat("batch")})
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    run = cli(stack, "submit", "--file", str(path), "--wait", "--timeout", "120")
    assert run.returncode == 0, run.stderr
    results = [json.loads(line) for line in run.stdout.splitlines()]
    assert [r["line"] for r in results] == list(range(1, 32))
    assert {r["status"] for r in results} == {"succeeded"}
    assert results[5]["job"]["result"]["body"]["choices"][0]["message"]["content"] == "bulk 5"
    assert results[30]["custom_id"] == "batch-line"
    assert "31 of 31 jobs accepted" in run.stderr and "submitting" in run.stderr

    again = cli(stack, "submit", "--file", str(path))  # the same file again: the same jobs, nothing new
    assert again.returncode == 0, again.stderr
    assert [json.loads(line)["id"] for line in again.stdout.splitlines()] == [r["id"] for r in results]

    path.write_text('{"body": {"model": "mock"}}\nnot json\n')
    bad = cli(stack, "submit", "--file", str(path))
    assert bad.returncode == 1 and ":2: not JSON" in bad.stderr and bad.stdout == ""


def test_cli_wait_status_cancel_dlq_redrive(stack: Emulator, client: Client) -> None:
    hung = client.submit(chat("cli hang", hang=True))
    cancelled = cli(stack, "cancel", hung.id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(hung.id)
    waited = cli(stack, "wait", hung.id, "--timeout", "60")
    assert waited.returncode == 1 and f"{hung.id} cancelled" in waited.stdout
    again = cli(stack, "cancel", hung.id)
    assert again.returncode == 1 and "already cancelled" in again.stderr

    doomed = client.submit(chat("cli doomed", fail_attempts=99))
    assert client.wait(doomed.id, timeout=60).dead_lettered
    listed = cli(stack, "dlq", "--json", "--limit", "100")
    assert listed.returncode == 0, listed.stderr
    assert doomed.id in [json.loads(line)["id"] for line in listed.stdout.splitlines()]
    redriven = cli(stack, "redrive", doomed.id)
    assert redriven.returncode == 0, redriven.stderr
    assert redriven.stdout.split()[:2] in ([doomed.id, "queued"], [doomed.id, "running"])
    shown = cli(stack, "status", doomed.id, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == doomed.id

    missing = cli(stack, "status", "job_" + "b" * 26)
    assert missing.returncode == 1 and "404" in missing.stderr and "not_found" in missing.stderr


def test_the_readme_example_runs_against_the_stack(stack: Emulator, tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(example.strip().splitlines()) <= 6
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    ran = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**env, "INFERQ_URL": stack.url, "INFERQ_API_KEY": dev_key(stack)})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "Hello"


def test_a_client_next_to_inferq_up_finds_its_url_and_key(stack: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFERQ_URL", raising=False)
    monkeypatch.delenv("INFERQ_API_KEY", raising=False)
    with Client(data_dir=stack.data_dir) as client:
        assert client.base_url == stack.url
        assert "lag" in client.scale()
