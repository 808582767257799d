"""The bench's Valkey accounting (``INFO commandstats`` deltas per job, scripts counted once, the EVALSHA split by
script), the floor's accounting, and the ratio/log-cost figures built from them."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
import redis

from bench import floor, load, report, valkeystats
from bench.clients import make_pool
from bench.summary import floor_ratios, fmt_log_cost, fmt_ratios, log_cost, run_summary
from bench.valkeystats import Stat
from emulator.valkey import ValkeyProcess

TEXT = """# Commandstats
cmdstat_evalsha:calls=30,usec=1370,usec_per_call=45.67,rejected_calls=0,failed_calls=0
cmdstat_hset:calls=40,usec=200,usec_per_call=5.00,rejected_calls=0,failed_calls=0
cmdstat_hgetall:calls=22,usec=80,usec_per_call=3.64,rejected_calls=0,failed_calls=0
cmdstat_config|resetstat:calls=1,usec=45,usec_per_call=45.00,rejected_calls=0,failed_calls=0
"""


def test_parse_reads_raw_text_and_redis_py_dicts_alike() -> None:
    parsed = valkeystats.parse(TEXT)
    assert parsed == {"evalsha": Stat(30, 1370), "hset": Stat(40, 200), "hgetall": Stat(22, 80),
                      "config|resetstat": Stat(1, 45)}
    as_dict = {"cmdstat_EVALSHA": {"calls": 30, "usec": 1370, "usec_per_call": 45.67}, "other_field": 3}
    assert valkeystats.parse(as_dict) == {"evalsha": Stat(30, 1370)}


def test_delta_keeps_new_calls_only_and_drops_the_bench_s_own_commands() -> None:
    before = {"xadd": Stat(10, 100), "hgetall": Stat(5, 20), "info": Stat(3, 90), "ping": Stat(1, 1)}
    after = {"xadd": Stat(30, 340), "hgetall": Stat(5, 20), "info": Stat(4, 120), "blpop": Stat(7, 14),
             "ping": Stat(1, 1)}
    assert valkeystats.delta(before, after) == {"xadd": Stat(20, 240), "blpop": Stat(7, 14)}


def test_delta_counts_from_zero_after_a_reset() -> None:
    assert valkeystats.delta({"xadd": Stat(100, 900)}, {"xadd": Stat(4, 8)}) == {"xadd": Stat(4, 8)}


def test_per_job_counts_a_script_once_with_its_inner_commands() -> None:
    stats = {"evalsha": Stat(30, 1370), "hset": Stat(40, 200), "xreadgroup": Stat(10, 110), "blpop": Stat(10, 30)}
    out = valkeystats.per_job(stats, 10, inner={"hset", "xadd"}, top=2,
                              script_split={"finish": 0.25, "start": 0.75})
    assert out["total_usec_per_job"] == pytest.approx((1370 + 110 + 30) / 10)
    assert out["total_calls_per_job"] == pytest.approx(5.0)
    assert out["left_out_as_script_inner"] == ["hset"]
    assert [row["command"] for row in out["top"]] == ["evalsha", "xreadgroup"]  # what the total counts
    evalsha = out["commands"][0]
    assert evalsha == {"command": "evalsha", "calls_per_job": 3.0, "usec_per_job": 137.0,
                       "usec_per_call": pytest.approx(45.67), "in_total": True, "counted_usec_per_job": 137.0,
                       "counted_calls_per_job": 3.0}
    assert next(r for r in out["commands"] if r["command"] == "hset")["in_total"] is False
    assert out["scripts_usec_per_job"] == {"start": pytest.approx(102.75), "finish": pytest.approx(34.25)}
    assert list(out["scripts_usec_per_job"]) == ["start", "finish"]


def test_per_job_counts_the_direct_share_of_a_command_scripts_also_call() -> None:
    stats = {"evalsha": Stat(10, 400), "hgetall": Stat(30, 120), "hset": Stat(20, 40), "blpop": Stat(10, 20)}
    direct = valkeystats.direct_shares([
        {"command": "EVALSHA abc 1 k", "client_type": "tcp"},
        {"command": "HGETALL k", "client_type": "lua"},
        {"command": "HGETALL k", "client_type": "tcp"},
        {"command": "hgetall k", "client_type": "unix"},
        {"command": "HSET k a 1", "client_type": "lua"},
        {"command": "", "client_type": "tcp"},
    ])
    assert direct == {"hgetall": pytest.approx(2 / 3), "hset": 0.0}
    out = valkeystats.per_job(stats, 10, inner={"hgetall", "hset"}, direct=direct)
    assert out["total_usec_per_job"] == pytest.approx((400 + 120 * 2 / 3 + 20) / 10)
    assert out["total_calls_per_job"] == pytest.approx((10 + 20 + 10) / 10)
    assert out["left_out_as_script_inner"] == ["hset"]
    assert out["partly_counted"] == {"hgetall": pytest.approx(0.667)}
    assert [row["command"] for row in out["top"]] == ["evalsha", "hgetall", "blpop"]
    assert out["top"][1]["counted_calls_per_job"] == pytest.approx(2.0)


def test_per_job_without_scripts_counts_every_command() -> None:
    stats = {"xadd": Stat(10, 30), "hset": Stat(10, 20)}
    out = valkeystats.per_job(stats, 10, inner={"hset", "xadd"})
    assert out["total_usec_per_job"] == 5.0
    assert out["left_out_as_script_inner"] == []
    assert "scripts_usec_per_job" not in out
    assert valkeystats.per_job(stats, 0)["total_usec_per_job"] is None


def test_inner_commands_are_read_from_the_lua_sources(tmp_path: Path) -> None:
    (tmp_path / "includes").mkdir()
    (tmp_path / "a.lua").write_text("local rcall = redis.call\nrcall('HSET', k, 'a', 1)\nredis.pcall(\"XADD\", s)\n"
                                    "-- @include \"b\"\n")
    (tmp_path / "includes" / "b.lua").write_text("server.call('Expire', k, 3)\nlocal x = 'GET'\n")
    assert valkeystats.script_inner_commands(tmp_path) == {"hset", "xadd", "expire"}
    assert valkeystats.script_inner_commands(tmp_path / "missing") == frozenset()
    real = valkeystats.script_inner_commands()  # inferq's own scripts, whatever their current commands
    assert real and all(name.isalpha() and name.islower() for name in real)


def test_script_shares_and_calls_name_each_script() -> None:
    names = {"aa" * 20: "start", "bb" * 20: "finish"}
    entries: list[dict[str, Any]] = [
        {"command": b"EVALSHA " + b"aa" * 20 + b" 2 k1 k2", "duration": 30},
        {"command": "evalsha " + "AA" * 20 + " 1 k", "duration": 30},
        {"command": b"EVALSHA " + b"bb" * 20 + b" 1 k", "duration": 20},
        {"command": b"EVALSHA cc" + b"0" * 38 + b" 1 k", "duration": 10},
        {"command": b"FCALL finish_job 1 k", "duration": 10},
        {"command": b"HSET k a 1", "duration": 500},  # inner or direct: not a script's
        {"command": b"EVALSHA", "duration": 7},  # malformed: ignored
    ]
    shares = valkeystats.script_shares(entries, names)
    assert shares == {"start": pytest.approx(0.6), "finish": pytest.approx(0.2), "cc000000": pytest.approx(0.1),
                      "finish_job": pytest.approx(0.1)}
    assert valkeystats.script_calls(entries, names) == {"start": 2, "finish": 1, "cc000000": 1, "finish_job": 1}
    assert valkeystats.script_shares([{"command": b"GET k", "duration": 3}], names) == {}


def test_names_by_sha_covers_inferq_s_scripts_and_the_mock_backend_s_counter() -> None:
    from inferq.redis import scripting

    names = valkeystats.names_by_sha()
    assert set(names.values()) == {*scripting.NAMES, valkeystats.MOCK_COUNTER}
    assert all(len(sha) == 40 and sha == sha.lower() for sha in names)


def test_fmt_line_and_the_table_s_valkey_line() -> None:
    section = valkeystats.per_job({"evalsha": Stat(30, 1370), "hset": Stat(40, 200), "blpop": Stat(10, 30)}, 10,
                                  inner={"hset"}, script_split={"start": 1.0})
    assert [row["command"] for row in section["top"]] == ["evalsha", "blpop"]  # what the total counts
    line = valkeystats.fmt_line(section)
    assert line == "Valkey 140 µs/job: evalsha 137 (3), blpop 3 (1); scripts start 137"
    assert valkeystats.fmt_line(None) == ""
    scenario = {"valkey": section, "aggregate": {"valkey_usec_per_job": {"median": 140.0, "min": 120.0,
                                                                         "max": 150.0, "n": 3}}}
    assert report.valkey_line(scenario).startswith("Valkey 140 (120-150) µs/job: evalsha 137 (3)")


def test_sampler_measures_a_real_valkey_and_names_scripts_in_its_slow_log(valkey: ValkeyProcess) -> None:
    client = redis.Redis.from_url(valkey.url)
    sampler = valkeystats.Sampler(valkey.url)
    try:
        sha = client.script_load("redis.call('HSET', KEYS[1], 'a', 1) return 1")
        before = sampler.snapshot()
        saved = sampler.slowlog_on()
        for _ in range(3):
            client.evalsha(sha, 1, "bench-test-key")
        client.hgetall("bench-test-key")
        entries = sampler.slowlog_off(saved)
        got = valkeystats.delta(before, sampler.snapshot())
        assert got["evalsha"].calls == 3 and got["hset"].calls == 3 and got["hgetall"].calls == 1
        assert not set(got) & valkeystats.BENCH_COMMANDS
        assert valkeystats.script_calls(entries, {sha: "probe"}) == {"probe": 3}
        restored = client.config_get("slowlog-log-slower-than")
        assert restored == {"slowlog-log-slower-than": saved["slowlog-log-slower-than"]}
    finally:
        client.delete("bench-test-key")
        client.close()
        sampler.close()


# ---------------------------------------------------------------------- the floor


async def test_the_floor_counts_every_job_done(valkey: ValkeyProcess) -> None:
    client = redis.Redis.from_url(valkey.url)
    client.delete(floor.STREAM)
    worker = asyncio.create_task(floor.worker(valkey.url, window=4, latency_ms=1))
    try:
        result = await floor.closed_loop(valkey.url, 40, 4, deadline_s=60)
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    assert result.ok and result.done == 40 and not result.errors
    assert len(result.latencies_ms()) == 40
    assert client.xinfo_groups(floor.STREAM)[0]["pending"] == 0  # every job acknowledged
    client.delete(floor.STREAM)
    client.close()


async def test_the_floor_without_a_worker_fails_every_job(valkey: ValkeyProcess) -> None:
    client = redis.Redis.from_url(valkey.url)
    client.delete(floor.STREAM)
    result = await floor.closed_loop(valkey.url, 3, 3, deadline_s=30, wait_s=0.2)
    assert not result.ok and result.done == 0 and result.error_count == 3
    assert all("no result" in message for message in result.errors)
    client.delete(floor.STREAM)
    client.close()


async def test_the_http_floor_serves_every_job_through_its_gateway(tmp_path: Path) -> None:
    with floor.HttpFloor(window=4, latency_ms=1, log_dir=tmp_path) as fl:
        before, io_before = fl.cpu_by_role(), fl.io_calls_by_role()
        async with make_pool(fl.url_http, "floor", 4) as client:
            result = await load.closed_loop(client, 40, 4, load.job_body(1), deadline_s=60)
        after, io_after = fl.cpu_by_role(), fl.io_calls_by_role()
    assert result.ok and result.done == 40 and not result.errors
    assert after["gateway"] > before["gateway"]  # the requests went through the bare gateway's own process
    # every role read and wrote its sockets for each job: 40 requests in and 40 answers out at least, and so on
    assert {role: io_after[role] - io_before[role] >= 80 for role in ("gateway", "workers", "valkey")} == {
        "gateway": True, "workers": True, "valkey": True}
    assert fl.gateway is not None and fl.gateway.poll() is not None  # and it stopped with the floor


# ---------------------------------------------------------------------- ratios and log cost


def _runs(rates: list[float], p95s: list[float], system: list[float] | None = None) -> dict[str, Any]:
    runs = [{"jobs_per_s": r, "queue_to_done_ms": {"p95": p}, "cpu_ms_per_job_system": s,
             "cpu_ms_per_job_by_role": {"gateway": s / 2, "workers": s / 4, "valkey": s / 4}}
            for r, p, s in zip(rates, p95s, system or [1.0] * len(rates), strict=True)]
    return {"runs": runs, "aggregate": report.aggregate(runs)}


def test_floor_ratios_against_the_issue_s_goals() -> None:
    scenarios = {"F": _runs([1000, 1200, 1100], [20, 30, 25], [0.4, 0.4, 0.4]),
                 "S3": _runs([880, 1000, 900], [40, 50, 45], [0.9, 1.0, 0.95]),
                 "S2": _runs([100, 100, 100], [20, 24, 30])}
    r = floor_ratios(scenarios)
    assert r["S3_jobs_per_s_ratio"]["median"] == pytest.approx(900 / 1100)
    assert r["S3_jobs_per_s_ratio"]["min"] == pytest.approx(900 / 1100)  # runs paired in order
    assert r["S3_jobs_per_s_ratio"]["max"] == pytest.approx(880 / 1000)
    assert r["S3_p95_ratio"]["median"] == pytest.approx(45 / 25)
    assert r["S2_p95_ratio"]["median"] == pytest.approx(24 / 25)
    assert r["target"]["met"] is True
    text = fmt_ratios(r)
    assert "S3 0.82 (0.82-0.88)x the floor's jobs/s, p95 1.80 (1.67-2.00)x" in text
    assert "S2 p95 0.96 (0.80-1.20)x the floor's p95" in text
    assert "floor 1,100 (1,000-1,200) jobs/s, p95 25.0 (20.0-30.0) ms" in text

    http = floor_ratios({**scenarios, "FH": _runs([1000, 1000, 1000], [15, 20, 30], [0.5, 0.6, 0.5])})
    assert http["FH_jobs_per_s_ratio"]["median"] == pytest.approx(1000 / 1100)
    assert http["S3_to_http_floor_jobs_per_s_ratio"]["median"] == pytest.approx(900 / 1000)
    assert http["S3_to_http_floor_p95_ratio"]["median"] == pytest.approx(45 / 20)
    assert http["http_floor_gateway_cpu_ms_per_job"] == pytest.approx(0.25)
    assert http["target"] == r["target"]  # a reference, not a goal
    assert ("HTTP floor (bare ASGI under uvicorn, S3's client) 1,000 jobs/s = 0.91 (0.83-1.00)x the "
            "floor's, p95 20.0 (15.0-30.0) ms, CPU 0.50 (0.50-0.60) ms/job (gateway 0.25); S3 0.90 (0.88-1.00)x its "
            "jobs/s, p95 2.25 (1.50-2.67)x") in fmt_ratios(http)

    slow = {**scenarios, "S3": _runs([300, 300, 300], [40, 50, 45])}
    assert floor_ratios(slow)["target"]["met"] is False
    assert floor_ratios({"F": scenarios["F"], "S2": _runs([1], [26])})["target"]["met"] is False


def test_log_cost_is_the_loss_of_jobs_per_second_over_alternated_pairs() -> None:
    default = _runs([900, 800, 1000], [30, 30, 30], [1.2, 1.2, 1.2])
    warning = _runs([1000, 1000, 1000], [30, 30, 30], [1.0, 1.0, 1.0])
    cost = log_cost(default, warning)
    assert cost["jobs_per_s_loss"]["median"] == pytest.approx(0.1)
    assert cost["jobs_per_s_loss"]["min"] == pytest.approx(0.0)
    assert cost["jobs_per_s_loss"]["max"] == pytest.approx(0.2)
    assert cost["extra_cpu_ms_per_job"]["gateway"] == pytest.approx(0.1)
    assert cost["system_cpu_extra_share"] == pytest.approx(0.2)
    assert cost["target"]["met"] is True
    text = fmt_log_cost(cost)
    assert "costs 10.0 (0.0-20.0)% of jobs/s" in text and "gateway +0.100" in text and "+20.0%" in text
    assert log_cost(_runs([500], [1]), _runs([1000], [1]))["target"]["met"] is False


def test_run_summary_adds_cpu_of_the_system_and_valkey_per_job() -> None:
    result = load._new_result("S3", 10)
    result.cpu_by_role = {"gateway": 0.01, "workers": 0.004, "valkey": 0.002, "load generator (this process)": 0.5,
                          "emulator (supervisor, moto, scaler)": 0.3}
    result.commandstats = {"evalsha": Stat(30, 1370), "hset": Stat(40, 200)}
    summary = run_summary(result, frozenset({"hset"}))
    assert summary["cpu_ms_per_job_system"] == pytest.approx(1.6)  # not the load generator nor the emulator
    assert summary["cpu_ms_per_job_by_role"]["gateway"] == pytest.approx(1.0)
    # no job done: per job of at least one, never a division by zero
    assert summary["valkey_usec_per_job"] == pytest.approx(1370)
    assert summary["commandstats"] == {"evalsha": [30, 1370], "hset": [40, 200]}


def test_io_calls_count_a_process_s_reads_and_writes() -> None:
    import os

    from bench.stack import io_calls

    read_end, write_end = os.pipe()
    before = io_calls(os.getpid())
    for _ in range(50):
        os.write(write_end, b"x")
        os.read(read_end, 1)
    assert io_calls(os.getpid()) - before >= 100
    os.close(read_end)
    os.close(write_end)
    assert io_calls(2**22 + 1) == 0.0  # no such process: nothing, never an error


def test_run_summary_and_the_table_give_read_and_write_calls_per_job_by_role() -> None:
    result = load._new_result("S3", 10)
    result.cpu_by_role = {"gateway": 0.01, "workers": 0.004, "valkey": 0.002, "load generator (this process)": 0.5}
    result.io_calls_by_role = {"gateway": 31.0, "workers": 13.0, "valkey": 33.0,
                               "emulator (supervisor, moto, scaler)": 500.0}
    summary = run_summary(result)
    assert summary["io_calls_per_job_by_role"] == {"gateway": 3.1, "workers": 1.3, "valkey": 3.3}
    runs = [summary, {**summary, "io_calls_per_job_by_role": {"gateway": 5.0, "workers": 1.0, "valkey": 3.5}}]
    scenario = {"title": "latency under load", "config": {}, "runs": runs, "aggregate": report.aggregate(runs)}
    [row] = report.rows({"scenarios": {"S3": scenario}})
    assert "read/write system calls per job: gateway 4.0, valkey 3.4, workers 1.1" in row["figures"]
    assert "read/write" not in report.rows({"scenarios": {"S3": {**scenario, "runs": [
        {k: v for k, v in summary.items() if k != "io_calls_per_job_by_role"}]}}})[0]["figures"]


def test_the_mock_backend_s_counter_is_named_and_left_out_of_inferq_s_own_figure() -> None:
    stats = {"evalsha": valkeystats.Stat(calls=400, usec=10_000), "xreadgroup": valkeystats.Stat(calls=10, usec=500)}
    section = valkeystats.per_job(stats, 100, script_split={"finish": 0.8, valkeystats.MOCK_COUNTER: 0.2})
    assert section["total_usec_per_job"] == 105.0
    assert section["mock_counter_usec_per_job"] == 20.0 and section["inferq_usec_per_job"] == 85.0
    line = valkeystats.fmt_line(section)
    assert line.startswith("Valkey 105 µs/job (inferq 85 + the mock backend's call counter 20)")
