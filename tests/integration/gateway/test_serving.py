"""The gateway's HTTP protocol under uvicorn (functions.gateway.serving): each response leaves in one write, on a real
uvicorn server and socket; the joined transport keeps the order of writes, close and abort; and every launcher of
the gateway (the emulator, compose, the bench) runs it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from uvicorn.importer import import_from_string
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornHttpToolsProtocol

from emulator.up import GATEWAY_HTTP_PROTOCOL
from functions.gateway import serving
from functions.gateway.serving import DIRECT_BYTES, HttpToolsProtocol, JoinedWrites

ROOT = Path(__file__).resolve().parents[3]


class RecordingTransport:
    """A transport that records what reaches it."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))
        if self.inner is not None:
            self.inner.write(data)

    def close(self) -> None:
        self.calls.append(("close", b""))
        self.closing = True
        if self.inner is not None:
            self.inner.close()

    def abort(self) -> None:
        self.calls.append(("abort", b""))
        self.closing = True

    def write_eof(self) -> None:
        self.calls.append(("eof", b""))

    def is_closing(self) -> bool:
        return self.closing if self.inner is None else bool(self.inner.is_closing())

    def get_write_buffer_size(self) -> int:
        return 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_writes_within_one_turn_reach_the_socket_as_one_write_at_its_end() -> None:
    raw = RecordingTransport()
    joined = JoinedWrites(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    joined.write(b"HTTP/1.1 200 OK\r\n\r\n")
    joined.writelines([b"{", memoryview(b"}")])
    assert raw.calls == [] and joined.get_write_buffer_size() == 21
    await asyncio.sleep(0)
    assert raw.calls == [("write", b"HTTP/1.1 200 OK\r\n\r\n{}")]
    joined.write(b"next")
    await asyncio.sleep(0)
    assert raw.calls[1:] == [("write", b"next")]


async def test_close_eof_and_large_writes_follow_what_was_written_before_them() -> None:
    raw = RecordingTransport()
    joined = JoinedWrites(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    big = b"x" * DIRECT_BYTES
    joined.write(b"head")
    joined.write(big)
    joined.write(b"tail")
    joined.write_eof()
    joined.write(b"last")
    joined.close()
    await asyncio.sleep(0)  # the flush scheduled for "last" finds nothing left, and the transport closed
    assert raw.calls == [("write", b"head"), ("write", big), ("write", b"tail"), ("eof", b""), ("write", b"last"),
                         ("close", b"")]


async def test_abort_drops_what_is_held_and_a_closed_transport_is_not_written() -> None:
    raw = RecordingTransport()
    joined = JoinedWrites(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    joined.write(b"lost")
    joined.abort()
    await asyncio.sleep(0)
    assert raw.calls == [("abort", b"")]
    raw.closing = False
    joined.write(b"late")
    raw.closing = True  # closed by the peer before the turn ended
    await asyncio.sleep(0)
    assert raw.calls == [("abort", b"")]


async def _app(scope: Any, receive: Any, send: Any) -> None:
    """Answers like the gateway's routes: start and body sent back to back; ``/close`` asks to close."""
    if scope["type"] != "http":
        return
    await receive()
    body = b'{"object":"job","status":"queued"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if scope["path"] == "/close":
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def _server(protocol: type[asyncio.Protocol]) -> AsyncIterator[tuple[int, list[RecordingTransport]]]:
    """uvicorn serving :func:`_app` with ``protocol``, each connection's socket transport recorded."""
    recorded: list[RecordingTransport] = []

    class Recorded(protocol):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: Any) -> None:
            recorded.append(RecordingTransport(transport))
            super().connection_made(recorded[-1])

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_app, host="127.0.0.1", port=port, http=Recorded, lifespan="off",
                                           log_level="error", access_log=False))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield port, recorded
    finally:
        server.should_exit = True
        await task


async def _exchange(port: int, requests: list[bytes]) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    received = b""
    for request in requests:
        writer.write(request)
        received += await reader.readuntil(b"}")
    writer.close()
    return received


GET = b"GET /v1/jobs/x HTTP/1.1\r\nhost: gw\r\n\r\n"


@pytest.mark.parametrize("protocol", [HttpToolsProtocol, UvicornHttpToolsProtocol])
async def test_under_uvicorn_each_response_is_one_write_to_the_socket(protocol: type[asyncio.Protocol]) -> None:
    async with _server(protocol) as (port, recorded):
        received = await _exchange(port, [GET, GET])
    assert received.count(b"HTTP/1.1 200 OK") == 2 and received.endswith(b'"status":"queued"}')
    writes = [data for call, data in recorded[0].calls if call == "write"]
    if protocol is HttpToolsProtocol:
        assert len(writes) == 2 and all(w.startswith(b"HTTP/1.1 200 OK") and w.endswith(b"}") for w in writes)
    else:  # uvicorn's own: headers and body apart (what the joined transport saves)
        assert len(writes) == 4


async def test_a_response_that_closes_the_connection_is_sent_whole_before_the_close() -> None:
    async with _server(HttpToolsProtocol) as (port, recorded):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET.replace(b"/v1/jobs/x", b"/close"))
        received = await reader.read()  # to EOF
        writer.close()
    assert received.startswith(b"HTTP/1.1 200 OK") and received.endswith(b'"status":"queued"}')
    assert [call for call, _ in recorded[0].calls][:2] == ["write", "close"]


def test_every_launcher_of_the_gateway_runs_this_protocol() -> None:
    assert f"{serving.__name__}:{HttpToolsProtocol.__name__}" == GATEWAY_HTTP_PROTOCOL
    assert import_from_string(GATEWAY_HTTP_PROTOCOL) is HttpToolsProtocol
    compose = yaml.safe_load((ROOT / "emulator" / "compose.yaml").read_text())
    command = compose["services"]["gateway"]["command"]
    assert command[command.index("--http") + 1] == GATEWAY_HTTP_PROTOCOL
    # inferq up's gateway: tests/e2e/test_lifecycle.py reads its command line; the bench's direct stack:
    assert '"--http", GATEWAY_HTTP_PROTOCOL' in (ROOT / "bench" / "stack.py").read_text()
