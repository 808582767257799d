"""The lines of a batch's input file (docs/api.md, "Batches"): the streaming reader the driver reads them with, in
bounded memory whatever their length, and the checks each line passes before its batch runs (OpenAI's line
errors)."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from inferq.queue.engine_body import BodyError, check_body

MAX_ERRORS = 100
"""Line errors kept in ``errors.data`` of a failed batch (the first ones; the message says how many more)."""


@dataclass(frozen=True)
class LineError:
    code: str
    message: str
    line: int  # 1-based, as in the file

    def to_api(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": None, "line": self.line}


Multimodal = Callable[[Any], bool]
"""Whether the model a line's ``body.model`` names takes images (the registry's ``multimodal``)."""


def text_only(model: Any) -> bool:
    return False


def parse_line(raw: bytes, endpoint: str, line: int, multimodal: Multimodal = text_only
               ) -> tuple[dict[str, Any] | None, LineError | None]:
    """One input line -> the request object, or the reason it is refused (custom_id uniqueness is the caller's).
    The body is the one the engine receives (:func:`inferq.queue.engine_body.check_body` rewrites guided_ fields)."""
    try:
        request = json.loads(raw)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested past the parser's depth
        return None, LineError("invalid_json_line", "this line is not valid JSON in UTF-8", line)
    if not isinstance(request, dict):
        return None, LineError("invalid_json_line", "this line is not a JSON object", line)
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 512:
        return None, LineError("invalid_custom_id", "custom_id must be a string of 1-512 characters", line)
    if request.get("method") != "POST":
        return None, LineError("invalid_method", "method must be POST", line)
    if request.get("url") != endpoint:
        return None, LineError("mismatched_endpoint", f"url must be the batch's endpoint {endpoint}", line)
    if not isinstance(request.get("body"), dict):
        return None, LineError("invalid_body", "body must be a JSON object", line)
    if _SURROGATE_ESCAPE.search(raw) is not None and not _encodable(request):
        return None, LineError("invalid_json_line", "this line holds a \\uD800-\\uDFFF escape that is no "
                                                    "character (a lone surrogate)", line)
    try:
        # what the engine cannot take, as the gateway's submit refuses it
        check_body(request["body"], endpoint, multimodal=multimodal(request["body"].get("model")))
    except BodyError as exc:
        return None, LineError("invalid_body", str(exc), line)
    return request, None


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
"""The only way JSON text can spell a lone surrogate (its bytes are not UTF-8, which the parser refuses)."""


def _encodable(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Line:
    """One non-blank line of an input file, as :func:`scan_lines` reads it."""

    end: int
    """The byte offset just past the line (its newline included)."""
    data: bytes | None
    """The line; None when it is longer than the reader's ``max_line`` (never held whole: a per-line error)."""
    size: int
    number: int
    """1-based, counted from where the read started (blank lines included)."""
    head: bytes = b""
    """The first :data:`HEAD_BYTES` of a line too long to keep (where its custom_id usually is)."""


HEAD_BYTES = 1024


def scan_lines(chunks: Iterable[bytes], start: int = 0, max_line: int | None = None) -> Iterator[Line]:
    """Each non-blank line of a byte stream read from ``start``. Memory: one chunk and one line, a line longer than
    ``max_line`` bytes being counted and skipped rather than kept (so a 200 MB line costs no more than a short
    one); time linear in the stream's size."""
    offset = start  # where the current line starts
    number = 0
    buf = bytearray()
    size = 0
    over = False
    head = b""
    for chunk in chunks:
        view = memoryview(chunk)
        pos, n = 0, len(chunk)
        while pos < n:
            nl = chunk.find(b"\n", pos)
            stop = n if nl < 0 else nl
            size += stop - pos
            if not over:
                if max_line is not None and size > max_line:
                    head = bytes(buf[:HEAD_BYTES]) + bytes(view[pos:pos + max(0, HEAD_BYTES - len(buf))])
                    over, buf = True, bytearray()
                else:
                    buf += view[pos:stop]
            if nl < 0:
                break
            number += 1
            offset += size + 1
            if over or buf.strip():
                yield Line(offset, None if over else bytes(buf), size, number, head if over else b"")
            buf, size, over = bytearray(), 0, False
            pos = nl + 1
    if over or buf.strip():
        yield Line(offset + size, None if over else bytes(buf), size, number + 1, head if over else b"")


class Validator:
    """The checks of a whole input file, a line at a time, in file order (:func:`validate`, and again while a
    failed batch's error file is written). Memory: a 12-byte digest per custom_id (about 90 bytes each in the set:
    5 MB for 50,000 lines), never the ids themselves."""

    def __init__(self, endpoint: str, max_lines: int, multimodal: Multimodal = text_only) -> None:
        self.endpoint = endpoint
        self.max_lines = max_lines
        self.multimodal = multimodal
        self.seen: set[bytes] = set()
        self.count = 0
        self.bad = 0
        self.errors: list[LineError] = []
        self.too_many = False

    def check(self, line: Line) -> LineError | None:
        """The line's error (None: it is a request to run; a line over the body limit fails alone when it runs)."""
        self.count += 1
        error: LineError | None = None
        if self.count > self.max_lines:
            self.too_many = True
            error = LineError("too_many_requests", f"a batch holds at most {self.max_lines} requests "
                                                   "(INFERQ_BATCH_MAX_LINES); the file has more", line.number)
        elif line.data is not None:
            request, error = parse_line(line.data, self.endpoint, line.number, self.multimodal)
            if request is not None:
                digest = hashlib.blake2b(request["custom_id"].encode(), digest_size=12).digest()
                if digest in self.seen:
                    error = LineError("duplicate_custom_id", "custom_id must be unique within the batch", line.number)
                else:
                    self.seen.add(digest)
        if error is not None:
            self.bad += 1
            if len(self.errors) < MAX_ERRORS:
                self.errors.append(error)
        return error


def validate(chunks: Iterable[bytes], endpoint: str, max_lines: int, max_line: int | None = None,
             deadline: float | None = None, multimodal: Multimodal = text_only) -> Validator:
    """Check a whole input file, streaming; stops at the first line past ``max_lines`` (a file of a million lines
    is refused after reading ``max_lines`` + 1 of them). ``deadline`` (``time.monotonic()``): TimeoutError past it."""
    validator = Validator(endpoint, max_lines, multimodal)
    for line in scan_lines(chunks, 0, max_line):
        validator.check(line)
        if validator.too_many:
            break
        if deadline is not None and line.number % 1024 == 0 and time.monotonic() > deadline:
            raise TimeoutError("validation ran past its step's deadline")
    return validator
