"""What the batch driver reads and writes files through: the store's protocol (``functions/storage.py`` in AWS and
the emulator; this package imports no AWS library) and the line reader it uses on input files."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, Protocol

from inferq.batches.lines import Line, scan_lines


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...
    def close(self) -> int: ...
    def abort(self) -> None: ...


class LineSource(Protocol):
    def chunks(self, tenant: str, file_id: str, start: int = 0) -> Iterator[bytes]: ...


class FileSource(LineSource, Protocol):
    def head(self, tenant: str, file_id: str) -> Any: ...
    def writer(self, tenant: str, file_id: str, filename: str, purpose: str) -> Writer: ...
    def claimed(self, key: str) -> bytes: ...
    def put_claim(self, key: str, data: bytes) -> None: ...
    def delete_claim(self, key: str) -> None: ...
    def delete(self, tenant: str, file_id: str) -> bool: ...
    def discard_uploads(self, tenant: str, file_id: str) -> int: ...


def read_lines(store: LineSource, tenant: str, file_id: str, start: int, count: int, *, max_line: int | None = None,
               max_bytes: int | None = None) -> list[Line]:
    """Up to ``count`` lines of the file from byte ``start``, and no more once they hold ``max_bytes`` (the line that
    crosses it is the last); a line over ``max_line`` bytes comes without its data. The stream is closed after."""
    found: list[Line] = []
    held = 0
    chunks = store.chunks(tenant, file_id, start)
    try:
        for line in scan_lines(chunks, start, max_line):
            found.append(line)
            held += len(line.data or b"")
            if len(found) >= count or (max_bytes is not None and held >= max_bytes):
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return found


_LEADING_CUSTOM_ID = re.compile(rb'^(?:\xef\xbb\xbf)?\s*\{\s*"custom_id"\s*:\s*("(?:[^"\\]|\\.){1,4096}?")')
"""A custom_id as the line's first key: it can be read from the head of a line too long to keep."""


def line_custom_id(line: Line) -> str | None:
    """The line's custom_id; for a line too long to have been kept, the one its head starts with, if any."""
    if line.data is not None:
        return custom_id_of(line.data)
    found = _LEADING_CUSTOM_ID.match(line.head)
    if found is None:
        return None
    try:
        value = json.loads(found.group(1))
        value.encode()
    except (ValueError, UnicodeEncodeError):
        return None
    return value if isinstance(value, str) and 1 <= len(value) <= 512 else None


def custom_id_of(raw: bytes | None) -> str | None:
    """The line's custom_id when it has one (a string); None for a line that is no JSON object, or too long to
    have been read."""
    if raw is None:
        return None
    try:
        request = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    custom_id = request.get("custom_id") if isinstance(request, dict) else None
    if not isinstance(custom_id, str):
        return None
    try:
        custom_id.encode()
    except UnicodeEncodeError:  # a lone surrogate: the line is reported with no custom_id rather than a broken one
        return None
    return custom_id
