"""inferq.fastjson: orjson's speed with the standard library's compact output, and the standard library for
whatever orjson does not take."""

from __future__ import annotations

import json
import math

import pytest

from inferq import fastjson

COMPACT = {"separators": (",", ":"), "ensure_ascii": False}
VALUES = [{"a": 1, "b": [1.5, None, True, "é\u2028\U0001f600"], "c": {"d": {}}}, [], "", 0, -1.25, 1764400000.123]


@pytest.fixture(params=["orjson", "standard library"])
def codec(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "standard library":
        monkeypatch.setattr(fastjson, "orjson", None)
    else:
        assert fastjson.orjson is not None, "orjson is a dependency of inferq"
    return str(request.param)


def test_the_output_is_the_standard_librarys_compact_form(codec: str) -> None:
    for value in VALUES:
        assert fastjson.dumps(value) == json.dumps(value, **COMPACT).encode()  # type: ignore[arg-type]
        assert fastjson.loads(fastjson.dumps(value)) == value
        assert fastjson.loads(fastjson.dumps(value).decode()) == value


def test_what_orjson_does_not_take_is_the_standard_librarys(codec: str) -> None:
    for value in ({"n": 2**70}, {1: "int key"}, [2**64]):
        assert fastjson.dumps(value) == json.dumps(value, **COMPACT).encode()  # type: ignore[arg-type]
    for big in (2**64, 2**64 - 1, -(2**63) - 1, 10**30 + 7, -(10**19) - 3):  # orjson alone reads floats of some
        for raw in (f'{{"n":[{big}]}}', f'{{"n":[{big}]}}'.encode()):
            read = fastjson.loads(raw)["n"][0]
            assert type(read) is int and read == big, (raw, read)
    assert fastjson.loads('{"id":"1234567890123456789012","x":1}') == {"id": "1234567890123456789012", "x": 1}
    assert math.isnan(fastjson.loads('{"x": NaN}')["x"])  # stored by an older worker: still read
    with pytest.raises(TypeError):
        fastjson.dumps({"x": object()})
    with pytest.raises(ValueError):
        fastjson.loads("{not json")


def test_nan_is_null_with_orjson_and_the_standard_librarys_without() -> None:
    assert fastjson.dumps([math.nan]) == b"[null]"
    assert fastjson.dumps([math.nan], allow_nan=False) == b"[null]"


def test_without_orjson_nan_is_as_the_standard_library_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastjson, "orjson", None)
    assert fastjson.dumps([math.nan]) == b"[NaN]"
    with pytest.raises(ValueError):
        fastjson.dumps([math.nan], allow_nan=False)


def test_a_lone_surrogate_is_written_escaped_and_read_back(codec: str) -> None:
    """``json.loads`` makes one of a model server's ``"\\ud83d"``; UTF-8 cannot carry it raw."""
    value = {"t": json.loads('"\\ud83d"'), "u": "é"}
    for allow_nan in (True, False):
        written = fastjson.dumps(value, allow_nan=allow_nan)
        assert written == json.dumps(value, separators=(",", ":")).encode()
        assert fastjson.loads(written) == value
