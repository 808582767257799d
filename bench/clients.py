"""The load generator's HTTP clients, loopback only: :class:`RawClient` (one keep-alive connection, HTTP/1.1
by hand: light on the CPU the bench shares with the system under test) or httpx, one client per concurrent
loop (:class:`ClientPool`)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
import types
from typing import Any
from urllib.parse import urlsplit

import httptools
import httpx

try:
    import orjson
except ImportError:  # pragma: no cover - a dependency of inferq; the standard library keeps the bench working
    orjson = None  # type: ignore[assignment]


def _sniffio_shim() -> None:
    """httpcore imports ``sniffio`` on every request to learn the event loop; when it is not installed, that is a
    failed import (a path scan with ``stat`` calls) per request: about a quarter of the client's CPU here. The
    bench's client runs under asyncio only, so answer for it."""
    if "sniffio" in sys.modules or importlib.util.find_spec("sniffio") is not None:
        return
    shim = types.ModuleType("sniffio")
    shim.current_async_library = lambda: "asyncio"  # type: ignore[attr-defined]
    sys.modules["sniffio"] = shim


_sniffio_shim()

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def check_loopback(base_url: str | httpx.URL) -> None:
    host = urlsplit(str(base_url)).hostname or ""
    if host not in LOOPBACK:
        raise ValueError(f"the load generator talks to loopback only, not {host!r}")


def make_client(base_url: str, api_key: str, connections: int, timeout_s: float = 30.0,
                transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """One keep-alive pool sized for ``connections`` concurrent requests (no queueing inside the client)."""
    check_loopback(base_url)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                          keepalive_expiry=60.0)
    return httpx.AsyncClient(
        base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, limits=limits,
        timeout=httpx.Timeout(timeout_s, connect=5.0), transport=transport,
    )


class ProtocolError(Exception):
    """The server's answer was not HTTP/1.1 as expected (or the connection ended mid-answer)."""


TRANSPORT_ERRORS = (httpx.HTTPError, OSError, TimeoutError, asyncio.IncompleteReadError, ProtocolError)


class RawResponse:
    __slots__ = ("content", "status_code")

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    def json(self) -> Any:
        return _json_loads(self.content)


class _Answers(asyncio.Protocol):
    """One connection's answers, parsed by httptools (uvicorn's parser) as they arrive: each complete response
    resolves the waiting request's future with (status, body, keep-alive). Nothing is read line by line in Python."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.body: list[bytes] = []
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"bad answer: {exc}"))

    def eof_received(self) -> bool | None:
        self._fail(ProtocolError("the server closed the connection mid-answer"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("connection closed"))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self.parser.get_status_code(), body, self.parser.should_keep_alive()))

    def _fail(self, exc: BaseException) -> None:
        self.lost = self.lost or exc
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class RawClient:
    """A minimal HTTP/1.1 keep-alive client on one connection, for one loop (one request at a time).

    httpx costs this machine 0.8-1.7 ms of CPU per request (more than the gateway spends answering it), taken from
    the cores the stack under test runs on; this client costs a small fraction of that: a request is one write, its
    answer is parsed by httptools (C) as it arrives, and nothing waits line by line. It speaks only what the bench
    needs: ``post(path, json=...)`` and ``get(path, params=...)``, Content-Length or chunked answers. A connection
    idle longer than ``idle_s`` (below uvicorn's 5 s keep-alive) is replaced before it is used, so a request never
    races the server closing it.
    """

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 30.0, idle_s: float = 3.0) -> None:
        check_loopback(base_url)
        parts = urlsplit(base_url)
        self.base_url = base_url
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.timeout_s = timeout_s
        self.idle_s = idle_s
        self._head = (f"Host: {parts.netloc}\r\nAuthorization: Bearer {api_key}\r\n"
                      "Accept: application/json\r\n").encode()
        self._answers: _Answers | None = None
        self._last_used = 0.0
        self._last_json: Any = None
        self._last_body = b"null"

    async def post(self, path: str, json: Any = None, timeout: float | None = None) -> RawResponse:
        if json is not self._last_json:  # a load sends one body object again and again: encoded once
            self._last_json, self._last_body = json, _json_dumps(json)
        return await self.request("POST", path, self._last_body, timeout)

    async def get(self, path: str, params: dict[str, str] | None = None, timeout: float | None = None) -> RawResponse:
        if params:
            path += "?" + "&".join(f"{k}={v}" for k, v in params.items())
        return await self.request("GET", path, None, timeout)

    async def request(self, method: str, path: str, body: bytes | None, timeout: float | None) -> RawResponse:
        loop = asyncio.get_running_loop()
        answers = self._answers
        if answers is None or answers.lost is not None or time.monotonic() - self._last_used > self.idle_s:
            async with asyncio.timeout(timeout or self.timeout_s):
                answers = await self._reconnect()
        assert answers.transport is not None
        head = f"{method} {path} HTTP/1.1\r\n".encode() + self._head
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        waiter = answers.waiter = loop.create_future()
        # one timer for the answer (uvloop's, in C), where asyncio.timeout adds a Python context manager per request
        deadline = loop.call_later(timeout or self.timeout_s, _expire, waiter)
        try:
            answers.transport.write(head + b"\r\n" + (body or b""))
            status, content, keep = await waiter
        except BaseException:
            await self.aclose()
            raise
        finally:
            deadline.cancel()
        if not keep:
            await self.aclose()
        self._last_used = time.monotonic()
        return RawResponse(status, content)

    async def _reconnect(self) -> _Answers:
        await self.aclose()
        _, answers = await asyncio.get_running_loop().create_connection(_Answers, self.host, self.port)
        self._answers = answers
        return answers

    async def aclose(self) -> None:
        answers, self._answers = self._answers, None
        if answers is not None and answers.transport is not None:
            answers.transport.close()


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no answer in time"))


def _json_dumps(value: Any) -> bytes:
    return orjson.dumps(value) if orjson is not None else json.dumps(value, separators=(",", ":")).encode()


def _json_loads(raw: bytes) -> Any:
    return orjson.loads(raw) if orjson is not None else json.loads(raw)


Client = httpx.AsyncClient | RawClient


class ClientPool:
    """One single-connection keep-alive client per concurrent loop.

    httpcore's pool checks every pooled connection (a ``poll`` syscall and anyio's attribute lookups) on each
    request, so one shared pool of 32 connections costs the client several ms of CPU per request on this machine;
    a client per loop makes that one check. ``pick(i)`` gives loop ``i`` its own client.
    """

    def __init__(self, clients: list[Client]) -> None:
        if not clients:
            raise ValueError("no clients")
        for client in clients:
            check_loopback(client.base_url)
        self.clients = clients

    def pick(self, i: int) -> Client:
        return self.clients[i % len(self.clients)]

    async def __aenter__(self) -> ClientPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients), return_exceptions=True)


def make_pool(base_url: str, api_key: str, loops: int, timeout_s: float = 30.0, kind: str = "raw") -> ClientPool:
    """``loops`` clients of one connection each: ``raw`` (:class:`RawClient`) or ``httpx``."""
    if kind == "httpx":
        return ClientPool([make_client(base_url, api_key, 1, timeout_s) for _ in range(loops)])
    if kind == "raw":
        return ClientPool([RawClient(base_url, api_key, timeout_s) for _ in range(loops)])
    raise ValueError(f"unknown client kind {kind!r}")


def pool_of(clients: Client | ClientPool) -> ClientPool:
    return clients if isinstance(clients, ClientPool) else ClientPool([clients])
