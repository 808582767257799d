"""The HTTP protocol the gateway runs under uvicorn (the emulator, the compose stack): uvicorn's httptools protocol,
with each response written to the socket once.

uvicorn writes a response's status line and headers when the app sends ``http.response.start`` and its body when
the app sends ``http.response.body``: two ``send`` system calls, and two segments the client reads, for every
response, where a job's answer is a few hundred bytes. Here the connection's writes made in one turn of the event
loop are joined and written at the end of that turn, so a response sent by the app without waiting in between (every
response of this API) leaves in one ``send``. Nothing waits longer than the turn that wrote it; a large write
(``DIRECT_BYTES``) is not copied, and ``close``/``abort``/EOF keep their order with what was written before them.

``uvicorn functions.gateway.app:app --http functions.gateway.serving:HttpToolsProtocol``. Only uvicorn imports
this module: the Lambda handler (Mangum) never does, and does not ship uvicorn.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _UvicornHttpToolsProtocol

__all__ = ["DIRECT_BYTES", "HttpToolsProtocol", "JoinedWrites"]

DIRECT_BYTES = 64 * 1024
"""A write this large is not worth joining (the copy costs more than the call it saves): it flushes what is held,
then goes straight to the socket."""


class JoinedWrites:
    """A transport whose small writes within one turn of the event loop reach the socket as one write. Everything
    else goes to the transport it wraps."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) >= DIRECT_BYTES:
            self.flush()
            self._transport.write(data)
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Write what is held now (the end of the turn, or before anything that must follow it)."""
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()  # a closing transport still sends what it was given before close()
        self._transport.close()

    def abort(self) -> None:
        self._held.clear()
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(len(data) for data in self._held)

    def __getattr__(self, name: str) -> Any:  # get_extra_info, is_closing, pause/resume_reading, set_protocol, ...
        return getattr(self._transport, name)


class HttpToolsProtocol(_UvicornHttpToolsProtocol):
    """uvicorn's httptools protocol on a :class:`JoinedWrites` transport."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(JoinedWrites(transport, self.loop))  # type: ignore[arg-type]
