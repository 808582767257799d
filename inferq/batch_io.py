"""What the batch driver reads and writes files through: the store's protocol (``functions/storage.py`` in AWS and
the emulator; this package imports no AWS library) and the two line readers it uses on input files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Protocol

from .batches import input_lines


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...
    def close(self) -> int: ...
    def abort(self) -> None: ...


class FileSource(Protocol):
    def chunks(self, tenant: str, file_id: str, start: int = 0) -> Iterator[bytes]: ...
    def head(self, tenant: str, file_id: str) -> Any: ...
    def writer(self, tenant: str, file_id: str, filename: str, purpose: str) -> Writer: ...
    def claimed(self, key: str) -> bytes: ...


def read_lines(store: FileSource, tenant: str, file_id: str, start: int, count: int) -> list[tuple[int, bytes]]:
    """Up to ``count`` lines of the file from byte ``start``, each with its offset; the stream is closed after."""
    found: list[tuple[int, bytes]] = []
    chunks = store.chunks(tenant, file_id, start)
    try:
        for item in input_lines(chunks, start):
            found.append(item)
            if len(found) >= count:
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return found


def custom_id_of(raw: bytes) -> str | None:
    """The line's custom_id; None for a line that never validated (a batch cancelled while validating)."""
    try:
        request = json.loads(raw)
    except ValueError:
        return None
    custom_id = request.get("custom_id") if isinstance(request, dict) else None
    return custom_id if isinstance(custom_id, str) else None
