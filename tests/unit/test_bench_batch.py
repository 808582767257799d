"""Scenario B's pure parts: the input file it uploads, the check that the output answers every line once, the
spread it reports and the peak RSS it reads from /proc."""

from __future__ import annotations

import json
import os

from bench import batch


def answer(custom_id: str, status: int = 200) -> bytes:
    return json.dumps({"id": "r", "custom_id": custom_id, "response": {"status_code": status, "body": {}},
                       "error": None}).encode()


def test_the_input_file_is_one_valid_batch_line_per_request() -> None:
    lines = batch.batch_lines(3, latency_ms=7).splitlines()
    parsed = [json.loads(line) for line in lines]
    assert [p["custom_id"] for p in parsed] == ["line-0", "line-1", "line-2"]
    assert {p["method"] for p in parsed} == {"POST"} and {p["url"] for p in parsed} == {"/v1/chat/completions"}
    assert parsed[2]["body"]["mock"] == {"latency_ms": 7} and parsed[2]["body"]["model"] == "mock"
    assert batch.batch_lines(3).endswith(b"\n")


def test_an_output_answering_every_line_once_passes() -> None:
    output = b"\n".join(answer(f"line-{i}") for i in (2, 0, 1)) + b"\n"
    assert batch.answered_once(output, 3) is None


def test_a_missing_a_twice_answered_or_a_failed_line_is_named() -> None:
    assert batch.answered_once(answer("line-0") + b"\n" + answer("line-1"), 3) == "1 line(s) not answered"
    twice = batch.answered_once(b"\n".join([answer("line-0"), answer("line-0"), answer("line-1")]), 2)
    assert twice is not None and "more than once" in twice and "line-0" in twice
    failed = batch.answered_once(answer("line-0", status=500), 1)
    assert failed is not None and failed.startswith("line-0 answered 500")


def test_the_summary_is_median_and_range_over_the_runs() -> None:
    runs = [{"wall_s": 10.0, "lines_per_s": 1000.0, "upload_s": 0.5},
            {"wall_s": 12.0, "lines_per_s": 833.3, "upload_s": 0.4},
            {"wall_s": 8.0, "lines_per_s": 1250.0, "upload_s": 0.6}]
    summary = batch.summarize(runs)
    assert summary["wall_s"] == {"median": 10.0, "min": 8.0, "max": 12.0, "n": 3}
    assert summary["lines_per_s"]["median"] == 1000.0
    assert batch.summarize([])["wall_s"]["median"] is None


def test_peak_rss_reads_vmhwm_and_skips_gone_processes() -> None:
    mine = batch.peak_rss_mb([os.getpid()])
    assert mine is not None and mine > 1  # this Python holds more than a megabyte
    with_gone = batch.peak_rss_mb([os.getpid(), 2**22 + 12345])  # the peak only grows meanwhile
    assert with_gone is not None and with_gone >= mine
    assert batch.peak_rss_mb([2**22 + 12345]) is None


def test_the_large_files_figure_measures_each_file_in_a_process_of_its_own() -> None:
    results = batch.large_files(scale=0.002)
    assert set(results) == set(batch.LARGE_FILES)
    assert results["million_tiny"]["outcome"] == "refused: too_many_requests" or \
        results["million_tiny"]["outcome"].endswith("expanded")  # 2,000 lines at this scale: under the limit
    assert results["duplicates"]["outcome"].startswith("refused:")
    assert results["one_line"]["outcome"] == "1 request(s) expanded"
    for r in results.values():
        assert r["peak_rss_mb"] >= r["rss_at_start_mb"] > 0 and r["validate_s"] >= 0
    row = batch.large_files_row(results, 50)
    assert "peak RSS" in row["figures"] and "256" in row["figures"]
