"""The scale-out grid (``--scale``): its parsing, the load generators' answers merged into one run, the table."""

from __future__ import annotations

import pytest

from bench import scale
from bench.__main__ import parse_args
from bench.stack import Stack


def test_parse_grid_reads_gateways_workers_generators() -> None:
    assert scale.parse_grid("1x1x1, 4X2x4,") == [scale.Point(1, 1, 1), scale.Point(4, 2, 4)]
    assert scale.Point(8, 3, 8).label == "8x3x8"
    for bad in ("", "1x1", "0x1x1", "ax1x1", "1x1x1x1"):
        with pytest.raises(ValueError):
            scale.parse_grid(bad)


def test_the_default_grid_is_cut_to_the_machine() -> None:
    assert scale.default_grid(2) == [scale.Point(1, 1, 1)]
    assert scale.default_grid(16)[-1] == scale.Point(10, 4, 10)
    assert len(scale.default_grid(8)) < len(scale.default_grid(16))


def test_scale_is_off_by_default_and_a_bad_grid_stops_the_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args([]).scale is None
    assert parse_args(["--scale", "2x2x2"]).scale == [scale.Point(2, 2, 2)]
    assert parse_args(["--scale"]).scale == scale.default_grid(__import__("os").cpu_count() or 1)
    with pytest.raises(SystemExit):
        parse_args(["--scale", "2x2"])
    assert "--scale" in capsys.readouterr().err


def test_merge_spans_every_generator_and_pools_latencies() -> None:
    a = {"jobs": 10, "done": 10, "errors": 0, "ok": True, "latencies_ms": [1.0, 2.0, 3.0], "first_submit": 100.0,
         "last_done": 101.0, "cpu_s": 0.5}
    b = {"jobs": 10, "done": 10, "errors": 0, "ok": True, "latencies_ms": [4.0, 5.0], "first_submit": 100.5,
         "last_done": 102.0, "cpu_s": 0.25}
    run = scale.merge([a, b])
    assert run["jobs"] == 20 and run["done"] == 20 and run["ok"]
    assert run["jobs_per_s"] == pytest.approx(20 / 2.0)  # first submit of any -> last job in hand of any
    assert run["queue_to_done_ms"]["max"] == 5.0 and run["client_cpu_s"] == 0.75
    failed = scale.merge([a, {"jobs": 10, "ok": False, "errors": 1, "error_messages": ["gen1.json: no answer"]}])
    assert not failed["ok"] and failed["done"] == 10 and failed["errors"] == 1
    assert failed["error_messages"] == ["gen1.json: no answer"]
    assert not scale.merge([])["ok"]


def test_the_table_is_the_issue_s() -> None:
    text = scale.table([{"gateways": 4, "workers": 2, "generators": 4, "jobs_per_s": 3434.2, "p95_ms": 41.4,
                         "valkey_cpu_ms_per_job": 0.22, "valkey_core_share": 0.755, "valkey_usec_per_job": 207.4},
                        {"gateways": 1, "workers": 1, "generators": 1, "jobs_per_s": None}])
    lines = text.splitlines()
    assert lines[0].startswith("| gateways | workers | load generators | jobs/s | p95 ms | Valkey CPU per job |")
    assert lines[2] == "| 4 | 2 | 4 | 3,434 | 41 | 0.22 ms | 76% | 207 µs |"
    assert lines[3] == "| 1 | 1 | 1 | - | - | - | - | - |"


def test_several_gateways_need_the_direct_stack() -> None:
    with pytest.raises(ValueError, match="direct"):
        Stack(workers=1, window=1, mode="emulator", gateways=2)
