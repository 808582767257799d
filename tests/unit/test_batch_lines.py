"""The batch input reader and the per-line checks (inferq.batches.lines): lines as the driver sees them, whatever the
file's line endings, BOM, blank lines or line lengths, in bounded memory."""

from __future__ import annotations

import json
from collections.abc import Iterator

from inferq.batches.lines import scan_lines, validate
from inferq.batches.store import custom_id_of, line_custom_id


def chunked(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


def request(custom_id: str, **extra: object) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "m", "messages": [{"role": "user", "content": custom_id}]},
                       **extra}).encode()


def test_lines_are_the_same_whatever_the_chunking_and_offsets_resume_exactly() -> None:
    data = b"\xef\xbb\xbf" + request("a") + b"\r\n\r\n  \n" + request("b") + b"\n\n" + request("c")
    for size in (1, 2, 7, 64, 10_000):
        lines = list(scan_lines(chunked(data, size)))
        assert [custom_id_of(x.data) for x in lines] == ["a", "b", "c"]
        assert [x.number for x in lines] == [1, 4, 6]
        assert lines[-1].end == len(data)
        resumed = list(scan_lines(chunked(data[lines[0].end:], size), lines[0].end))
        assert [x.end for x in resumed] == [x.end for x in lines[1:]]


def test_a_line_longer_than_the_limit_is_counted_not_kept() -> None:
    huge = request("h", pad="x" * 1_000_000)
    data = request("a") + b"\n" + huge + b"\n" + request("b")
    lines = list(scan_lines(chunked(data, 4096), max_line=10_000))
    assert [x.data is None for x in lines] == [False, True, False]
    assert lines[1].size == len(huge) and lines[1].end == len(request("a")) + 1 + len(huge) + 1
    assert [line_custom_id(x) for x in lines] == ["a", "h", "b"], "a long line's custom_id is read from its head"
    buried = json.dumps({"body": {"custom_id": "inner"}, "pad": "x" * 20_000, "custom_id": "late"}).encode()
    [line] = scan_lines([buried], max_line=10_000)
    assert line.data is None and line_custom_id(line) is None, "only a custom_id that comes first is read"


def test_validation_reports_each_kind_of_bad_line_and_stops_past_the_line_limit() -> None:
    lines = [request("a"), request("a"), b"\xff\xfe", request("s").replace(b'"m"', b'"\\ud800"'),
             request("u", url="/v1/completions"), request("g", method="GET"), b"[1]", b"[" * 100_000]
    checked = validate(iter([b"\n".join(lines)]), "/v1/chat/completions", 100)
    assert [(e.code, e.line) for e in checked.errors] == [
        ("duplicate_custom_id", 2), ("invalid_json_line", 3), ("invalid_json_line", 4), ("mismatched_endpoint", 5),
        ("invalid_method", 6), ("invalid_json_line", 7), ("invalid_json_line", 8)]
    many = validate(iter([b"\n".join(request(f"c{i}") for i in range(1000))]), "/v1/chat/completions", 10)
    assert many.too_many and many.count == 11 and many.errors[-1].code == "too_many_requests"
