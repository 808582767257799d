"""JSON on the hot paths (the gateway's job objects, a worker's results, the record's JSON fields): orjson when it is
installed (a dependency of inferq: about ten times faster here than the standard library's C encoder), else the
standard library.

The bytes are the standard library's compact form (``separators=(",", ":")``, ``ensure_ascii=False``, UTF-8), but
for two cases orjson writes differently, both still valid JSON for the same value: a float it spells shorter
(``1e-7`` for ``1e-07``), and NaN or an infinity, which it writes as ``null`` where the standard library writes a
token no JSON parser takes (or refuses, with ``allow_nan=False``). Anything orjson does not take (an integer beyond 64
bits, a key that is not a string, a type it does not know) is the standard library's to encode, with its errors; a
string UTF-8 cannot carry (a lone surrogate, which ``json.loads`` makes of a model server's ``"\\ud83d"``) is written
escaped, as ASCII, where writing it raw would fail.

Reading, orjson turns an integer beyond 64 bits into a float, and refuses what is not JSON (``NaN``, which the
standard library reads): a text with a run of 19 digits or more (the only way to spell such an integer), or one
orjson refuses, is read by the standard library, exactly. Not for what must stay byte-identical across versions (the
request digest: :func:`inferq.queue.jobs.canonical_json`).
"""

from __future__ import annotations

import json
import re
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - a dependency; the standard library keeps it working without
    orjson = None  # type: ignore[assignment]

__all__ = ["STABLE", "dumps", "loads"]

STABLE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
"""The standard library's compact encoder, made once (``json.dumps`` with options builds one per call): for bytes
that must stay the same from one version to the next (:func:`inferq.queue.claimcheck.encode`)."""
_COMPACT_NO_NAN = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_ASCII = json.JSONEncoder(separators=(",", ":"))
_ASCII_NO_NAN = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_LONG_DIGITS = re.compile(r"[0-9]{19}")
_LONG_DIGITS_BYTES = re.compile(rb"[0-9]{19}")


def dumps(value: Any, *, allow_nan: bool = True) -> bytes:
    """Compact JSON in UTF-8. ``allow_nan=False``: a NaN or infinity orjson cannot write as ``null`` is a
    ``ValueError``, as the standard library's (Starlette's responses use it)."""
    if orjson is not None:
        try:
            return orjson.dumps(value)
        except orjson.JSONEncodeError:
            pass
    text = (STABLE if allow_nan else _COMPACT_NO_NAN).encode(value)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate: escaped, as the standard library's default writes it
        return (_ASCII if allow_nan else _ASCII_NO_NAN).encode(value).encode()


def loads(raw: str | bytes) -> Any:
    long_digits = _LONG_DIGITS if isinstance(raw, str) else _LONG_DIGITS_BYTES
    if orjson is not None and not long_digits.search(raw):  # type: ignore[arg-type]
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)
