"""A very small asyncio HTTP/1.1 server for the emulator's own endpoints (the ECS agent's task protection API).

Enough HTTP for JSON request/response on loopback: keep-alive, ``Content-Length`` bodies, no chunked uploads.
Written out rather than pulled in so the supervisor starts fast and owns no second event loop or signal handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body or b"null")


Handler = Callable[[Request], Awaitable[tuple[int, Any]]]

log = logging.getLogger("inferq.emulator.httpd")


class HttpServer:
    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 0) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> HttpServer:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                try:
                    status, payload = await self.handler(request)
                except Exception as exc:  # an endpoint bug answers 500 instead of killing the supervisor
                    log.exception("%s %s: the endpoint failed; answered 500", request.method, request.path)
                    status, payload = 500, {"error": {"Code": "ServerException", "Message": str(exc)}}
                body = json.dumps(payload).encode()
                close = request.headers.get("connection", "").lower() == "close"
                head = (
                    f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                    f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
                )
                writer.write(head.encode() + body)
                await writer.drain()
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    line = await reader.readline()
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    return Request(method.upper(), target.split("?", 1)[0], headers, body)


async def get_status(host: str, port: int, path: str, wait_s: float = 1.0) -> int:
    """Status code of a GET (the supervisor's readiness probe), or 0 when nothing answers."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), wait_s)
    except (TimeoutError, OSError):
        return 0
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), wait_s)
        parts = line.split()
        return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
    except (TimeoutError, OSError, ValueError):
        return 0
    finally:
        writer.close()
