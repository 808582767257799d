"""The bench's load generator never counts a failed or missing job as done, and any such job fails the run.

A tiny fake gateway (plain ASGI, served through httpx's ASGI transport: no sockets) that can be told to lose,
fail, refuse or stall particular jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from bench import clients, load


class FakeGateway:
    """POST /v1/jobs and GET /v1/jobs/{id}; jobs succeed at once unless told otherwise by submit number."""

    def __init__(self, *, lose: set[int] = frozenset(), fail: set[int] = frozenset(),
                 refuse: set[int] = frozenset(), stall: set[int] = frozenset(), bad_result: set[int] = frozenset(),
                 drop_connection: set[int] = frozenset()) -> None:
        self.lose, self.fail, self.refuse, self.stall = lose, fail, refuse, stall
        self.bad_result, self.drop_connection = bad_result, drop_connection
        self.jobs: dict[str, dict[str, Any]] = {}
        self.submits = itertools.count()
        self.polls = 0

    def _job(self, n: int) -> dict[str, Any]:
        job_id = f"job_{n:026d}"
        status = "succeeded"
        result: Any = {"status_code": 200, "body": {"ok": True}}
        error = None
        if n in self.fail:
            status, result, error = "failed", None, {"type": "model_error", "message": "boom"}
        elif n in self.stall:
            status, result = "running", None
        elif n in self.bad_result:
            result = {"status_code": 500, "body": {}}
        return {"id": job_id, "object": "job", "status": status, "result": result, "error": error,
                "created_at": 1.0, "started_at": 1.001, "finished_at": None if n in self.stall else 1.002}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        assert dict(scope["headers"]).get(b"authorization") == b"Bearer k"
        method, path = scope["method"], scope["path"]
        if method == "POST" and path == "/v1/jobs":
            n = next(self.submits)
            if n in self.drop_connection:  # the answer starts, then the connection ends mid-body
                await send({"type": "http.response.start", "status": 202, "headers": []})
                await send({"type": "http.response.body", "body": b'{"id": "job_', "more_body": True})
                raise RuntimeError("the app dies mid-answer")
            if n in self.refuse:
                return await self._send(send, 429, {"error": {"type": "queue_full", "message": "full"}})
            job = self._job(n)
            if n not in self.lose:
                self.jobs[job["id"]] = job
            return await self._send(send, 202, {**job, "status": "queued", "result": None})
        if method == "GET" and path.startswith("/v1/jobs/"):
            self.polls += 1
            job = self.jobs.get(path.rsplit("/", 1)[1])
            if job is None:
                return await self._send(send, 404, {"error": {"type": "not_found", "message": "no such job"}})
            return await self._send(send, 200, job)
        return await self._send(send, 404, {})

    @staticmethod
    async def _send(send: Any, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": raw})


@contextlib.asynccontextmanager
async def served(app: FakeGateway, kind: str) -> AsyncIterator[clients.ClientPool]:
    """The fake behind httpx's ASGI transport (no sockets), or behind uvicorn on loopback for the raw client."""
    if kind == "httpx":
        async with clients.ClientPool([clients.make_client("http://127.0.0.1:1", "k", 8,
                                                     transport=httpx.ASGITransport(app=app, raise_app_exceptions=False))
                                     ]) as pool:
            yield pool
        return
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        async with clients.make_pool(f"http://127.0.0.1:{port}", "k", 4, kind="raw") as pool:
            yield pool
    finally:
        server.should_exit = True
        await task


KINDS = ["httpx", "raw"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", ["closed_loop", "burst"])
async def test_clean_run_counts_every_job(shape: str, kind: str) -> None:
    app = FakeGateway()
    seen: list[int] = []
    async with served(app, kind) as c:
        run = getattr(load, shape)
        result = await run(c, 50, 4, load.job_body(), progress=seen.append)
    assert result.ok
    assert result.done == 50 and result.error_count == 0
    assert sum(seen) == 50
    summary = result.summary()
    assert summary["done"] == 50 and summary["lost"] == 0 and summary["failed"] == 0 and summary["refused"] == 0
    assert summary["queue_to_done_ms"]["n"] == 50
    assert summary["jobs_per_s"] > 0


@pytest.mark.parametrize("shape", ["closed_loop", "burst"])
@pytest.mark.parametrize(
    ("fault", "category"),
    [("lose", "lost"), ("fail", "failed"), ("bad_result", "failed"), ("refuse", "refused"),
     ("drop_connection", "refused")],
)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_bad_job_is_never_done_and_fails_the_run(shape: str, fault: str, category: str, kind: str) -> None:
    app = FakeGateway(**{fault: {3, 7}})
    async with served(app, kind) as c:
        result = await getattr(load, shape)(c, 20, 4, load.job_body())
    assert not result.ok
    assert result.done == 18
    summary = result.summary()
    assert summary[category] == 2
    assert summary["done"] + summary["lost"] + summary["failed"] + summary["refused"] == 20
    assert result.error_count == 2 and len(result.errors) == 2
    assert summary["queue_to_done_ms"]["n"] == 18  # latencies only of jobs done


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", ["closed_loop", "burst"])
async def test_a_job_never_terminal_is_lost_at_the_deadline(shape: str, kind: str) -> None:
    app = FakeGateway(stall={2})
    async with served(app, kind) as c:
        result = await getattr(load, shape)(c, 10, 2, load.job_body(), wait_s=0.05, deadline_s=0.6)
    assert not result.ok
    assert result.done == 9
    assert any("deadline" in e or "lost" in e for e in result.errors)
    assert result.summary()["lost"] == 1
    assert result.elapsed_s < 5


@pytest.mark.parametrize("kind", KINDS)
async def test_the_deadline_bounds_the_run_and_unsubmitted_jobs_count_as_missing(kind: str) -> None:
    app = FakeGateway(stall=set(range(1000)))
    async with served(app, kind) as c:
        result = await load.closed_loop(c, 1000, 2, load.job_body(), wait_s=0.05, deadline_s=0.4)
    assert result.elapsed_s < 3
    assert result.done == 0 and not result.ok
    assert result.error_count == 1000  # every job has its error: stalled (lost) or never submitted
    assert len(result.records) == 1000


def test_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback"):
        clients.make_client("http://example.com", "k", 1)
    with pytest.raises(ValueError, match="loopback"):
        clients.RawClient("http://10.0.0.1:8080", "k")
    clients.check_loopback("http://localhost:8080")
    clients.check_loopback("http://[::1]:8080")


def test_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert load.percentile(values, 50) == pytest.approx(50.5)
    assert load.percentile(values, 99) == pytest.approx(99.01)
    assert load.distribution([])["p95"] is None


async def test_raw_client_reads_content_length_chunked_and_close() -> None:
    """Canned answers on a real socket: Content-Length, chunked, then Connection: close (the client reconnects)."""
    answers = [
        b"HTTP/1.1 202 Accepted\r\ncontent-length: 11\r\ncontent-type: application/json\r\n\r\n{\"id\": \"a\"}",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n",
        b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]",
    ]
    requests: list[bytes] = []
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            requests.append(head + await reader.readexactly(length))
            answer = answers.pop(0)
            writer.write(answer)
            await writer.drain()
            if b"connection: close" in answer:
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = clients.RawClient(f"http://127.0.0.1:{port}", "secret")
    try:
        first = await client.post("/v1/jobs", json={"body": {}})
        assert (first.status_code, first.json()) == (202, {"id": "a"})
        second = await client.get("/v1/jobs/a", params={"wait": "1"})
        assert (second.status_code, second.json()) == (200, {"a": 1})
        third = await client.get("/v1/jobs/b")
        assert third.status_code == 503
        fourth = await client.get("/v1/jobs/c")
        assert fourth.json() == []
    finally:
        await client.aclose()
        server.close()
    assert connections == 2
    assert requests[0].startswith(b"POST /v1/jobs HTTP/1.1\r\n")
    assert b"Authorization: Bearer secret" in requests[0] and requests[0].endswith(b'{"body":{}}')
    assert requests[1].startswith(b"GET /v1/jobs/a?wait=1 HTTP/1.1\r\n")
