"""``python -m bench`` (``make bench``): start the stack, run the scenarios, print the table, write bench/out/.

Scenarios (``--only`` takes a comma-separated subset):

- F   the floor: a bare Redis Streams queue with S3's shape (bench.floor); S3 and S2 are reported as ratios to it
- S1  throughput: no-op jobs (mock 0 ms) by concurrent clients, fleet fixed at 1 and 2 workers
- S2  latency, the reference: 80 jobs, mock 5 ms, 4 closed loops, 1 worker, window 4
- S3  latency under load: 2,000 jobs, mock 5 ms, 32 closed loops, 1 worker, window 32
- G   the gateway alone: submits/s into one uvicorn process, no workers
- W   throughput vs window: S3's shape at windows 1, 4, 8, 32 (1 run each)
- L   the default log level (INFO, as make up runs) against WARNING: S3's shape, two stacks, runs alternated
- C   cold start: gateway module import (bench.gateway when present) and worker process start -> first job taken
- D   worker drain, the core path without HTTP: pre-loaded jobs, 1 and 2 worker processes (bench.worker too,
      when present)
- K   core ceiling (bench.core)
- E   elasticity simulation (bench.simulate, when present)
- B   one OpenAI batch of 10,000 lines (--quick: 1,000), mock 0 ms, 2 workers, window 32, through the Files and
      Batches API of `inferq up` (bench.batch): wall time create -> completed, lines/s, the gateway's peak RSS
- V   efficiency against the real vLLM on CPU (bench.efficiency): output tokens/s straight to the server at its
      best concurrency vs through inferq with static windows and INFERQ_WINDOW=auto

Every HTTP scenario (and F) reports CPU per job by role and gateway + workers + Valkey as one figure, and
Valkey's command time per job by command (bench.valkeystats). ``--scale`` adds the scale-out grid (bench.scale).

Every job is accounted for (bench.load); any error, lost job or crashed scenario is printed and the exit status
is 1. A missed target is reported, not an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import batch, floor, load, report, scale, valkeystats
from .stack import ROOT, Stack, spawn_worker, stop_process

ALL = ("F", "S1", "S2", "S3", "G", "W", "L", "C", "D", "K", "E", "B", "V")
BATCH_LINES = 10_000
BATCH_LINES_QUICK = 1_000
BATCH_WORKERS = 2
BATCH_WINDOW = 32
CAVEAT = ("client, gateway, Valkey, scaler, emulator supervisor and workers all share this machine's cores; "
          "the load generator's own CPU is taken from the system under test, and other processes on a shared "
          "machine add noise (load average recorded per scenario)")


@dataclass(frozen=True)
class Sizes:
    repeats: int
    s1_jobs: int
    s1_clients: int
    s2_jobs: int
    s3_jobs: int
    g_jobs: int
    w_jobs: int
    drain_jobs: int
    warmup: int
    deadline_s: float

    @classmethod
    def make(cls, quick: bool, repeats: int | None) -> Sizes:
        if quick:
            return cls(repeats or 1, 1000, 32, 80, 400, 1000, 300, 2000, 50, 120.0)
        return cls(repeats or 3, 10_000, 32, 80, 2000, 5000, 1000, 10_000, 200, 300.0)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.only = set(args.only)
        self.sizes = Sizes.make(args.quick, args.repeats)
        self.out: Path = args.out
        self.logs = self.out / "logs"
        self.report: dict[str, Any] = {
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "argv": sys.argv[1:], "quick": args.quick, "client": args.client, "repeats": self.sizes.repeats,
            "stack_mode": args.stack, "stack_env": dict(args.env),
            "caveats": [CAVEAT], "machine": report.machine(), "scenarios": {}, "extra_rows": [],
            "throughput_vs_fleet": {}, "throughput_vs_window": {}, "failures": [],
        }
        self.latencies: dict[str, list[float]] = {}
        self.progress: Any = None
        self.console: Any = None

    # ------------------------------------------------------------------ plumbing

    def advance(self, task: Any, k: int) -> None:
        self.progress.advance(task, k)

    def fail(self, message: str) -> None:
        self.report["failures"].append(message)
        if self.console is not None:
            self.console.print(f"[red]error:[/] {message}", highlight=False)

    def stack(self, name: str, workers: int, window: int, env: dict[str, str] | None = None,
              log_level: str | bool | None = True, mode: str | None = None) -> Stack:
        """A stack as ``make up`` runs it (the default log level) unless ``--log-level`` says otherwise;
        ``log_level=None`` ignores ``--log-level`` (the log cost scenario sets its own)."""
        level = self.args.log_level if log_level is True else log_level
        env = {**({"INFERQ_LOG_LEVEL": level} if level else {}), **(env or {}), **dict(self.args.env)}
        return Stack(workers=workers, window=window, mode=mode or self.args.stack, env=env, log_dir=self.logs,
                     name=name)

    async def _run_load(self, st: Stack, kind: str, title: str, n: int, clients: int, latency_ms: int,
                        name: str) -> load.LoadResult:
        task = self.progress.add_task(title, total=n)
        body = load.job_body(latency_ms)
        sampler = valkeystats.Sampler(st.redis_url)
        try:
            stats0 = sampler.snapshot()
            roles0 = st.cpu_by_role()
            cpu0 = time.process_time()
            async with load.make_pool(st.url, st.api_key, clients, timeout_s=40.0, kind=self.args.client) as client:
                if kind == "closed_loop":
                    result = await load.closed_loop(client, n, clients, body, name=name,
                                                    deadline_s=self.sizes.deadline_s,
                                                    progress=lambda k: self.progress.advance(task, k))
                else:
                    result = await load.burst(client, n, clients, body, name=name, deadline_s=self.sizes.deadline_s,
                                              progress=lambda k: self.progress.advance(task, k))
            result.client_cpu_s = time.process_time() - cpu0
            result.cpu_by_role = _cpu_delta(roles0, st.cpu_by_role(), result.client_cpu_s)
            result.commandstats = valkeystats.delta(stats0, sampler.snapshot())
        finally:
            sampler.close()
        self.progress.update(task, visible=False)
        return result

    async def _submit_only(self, st: Stack, title: str, n: int, clients: int) -> dict[str, Any]:
        """Submits alone (no workers): every one must be answered 202 with a queued job."""
        task = self.progress.add_task(title, total=n)
        sampler = valkeystats.Sampler(st.redis_url)
        stats0 = sampler.snapshot()
        roles0, cpu0 = st.cpu_by_role(), time.process_time()
        result = load._new_result("submit_only", n)
        deadline = result.perf0 + self.sizes.deadline_s
        counter = iter(range(n))
        body = load.job_body(0)
        async with load.make_pool(st.url, st.api_key, clients, kind=self.args.client) as pool:

            async def submitter(client: Any) -> None:
                for i in counter:
                    if time.perf_counter() > deadline:
                        return
                    await load._submit(client, result, result.records[i], body)
                    self.progress.advance(task, 1)

            await load._bounded(result, [asyncio.create_task(submitter(pool.pick(i))) for i in range(clients)],
                                deadline)
        self.progress.update(task, visible=False)
        result.elapsed_s = time.perf_counter() - result.perf0
        for record in result.records:
            if record.t_accepted is None and record.error is None:
                result.fail(record, f"job #{record.index}: not submitted before the deadline")
        summary = result.summary()
        summary["ok"] = summary["accepted"] == n and result.error_count == 0
        cpu = _cpu_delta(roles0, st.cpu_by_role(), time.process_time() - cpu0)
        summary["cpu_s_by_role"] = cpu
        summary["cpu_ms_per_job_by_role"] = {k: round(v * 1000 / n, 3) for k, v in cpu.items()}
        summary["cpu_ms_per_job_system"] = round(sum(v for k, v in cpu.items() if k in SYSTEM_ROLES) * 1000 / n, 3)
        try:
            stats = valkeystats.delta(stats0, sampler.snapshot())
        finally:
            sampler.close()
        valkey = valkeystats.per_job(stats, max(summary["accepted"], 1), valkeystats.script_inner_commands(), top=6)
        summary["valkey_usec_per_job"] = valkey["total_usec_per_job"]  # per submit: no job runs
        summary["valkey"] = {k: valkey[k] for k in ("total_usec_per_job", "total_calls_per_job", "top")}
        summary["commandstats"] = {k: [v.calls, v.usec] for k, v in stats.items()}
        summary["loadavg"] = list(os.getloadavg())
        return summary

    def scenario(self, key: str, title: str, config: dict[str, Any], runs: list[dict[str, Any]],
                 target: dict[str, Any] | None = None, st: Stack | floor.Floor | None = None) -> dict[str, Any]:
        entry = {"title": title, "config": config, "runs": runs, "aggregate": report.aggregate(runs),
                 "target": target or {}, "stack": st.describe() if st else None, "loadavg": list(os.getloadavg())}
        self.report["scenarios"][key] = entry
        for run in runs:
            if run.get("errors") or not run.get("ok", False):
                self.fail(f"{key}: {run.get('errors', 0)} error(s), {run.get('lost', 0)} lost, "
                          f"{run.get('failed', 0)} failed, {run.get('refused', 0)} refused; first: "
                          f"{(run.get('error_messages') or ['-'])[:5]}")
        return entry

    async def repeated(self, st: Stack, key: str, title: str, kind: str, n: int, clients: int, latency_ms: int,
                       window: int, workers: int, target: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                       keep_latencies: bool = True) -> dict[str, Any]:
        warm = await self._run_load(st, "closed_loop", f"{key} warm-up", self.sizes.warmup, clients, latency_ms,
                                    "warmup")
        if not warm.ok:
            self.fail(f"{key} warm-up: {warm.error_count} error(s): {warm.errors[:5]}")
        results: list[load.LoadResult] = []
        for i in range(self.sizes.repeats):
            profilers = self.start_profilers(st, key) if self.args.profile and i == 0 else []
            try:
                results.append(await self._run_load(st, kind, f"{key} {title} run {i + 1}/{self.sizes.repeats}", n,
                                                    clients, latency_ms, key))
            finally:
                self.stop_profilers(profilers)
        split = await self.script_sample(st, key, clients, latency_ms)
        config = {"kind": kind, "jobs": n, "clients": clients, "workers": workers, "window": window,
                  "latency_ms": latency_ms, "warmup_jobs": self.sizes.warmup}
        return self.record_runs(key, title, config, results, st, split, target, keep_latencies)

    def record_runs(self, key: str, title: str, config: dict[str, Any], results: list[load.LoadResult],
                    st: Stack | floor.Floor, split: dict[str, Any] | None = None,
                    target: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                    keep_latencies: bool = True) -> dict[str, Any]:
        """Summaries of the runs (CPU per role, Valkey per command), aggregated into the report's scenario."""
        inner = valkeystats.script_inner_commands()
        shares = (split or {}).get("usec_share")
        direct = (split or {}).get("direct_share")
        runs: list[dict[str, Any]] = []
        pooled: list[float] = []
        for result in results:
            summary = run_summary(result, inner, shares, direct)
            runs.append(summary)
            pooled.extend(result.latencies_ms())
        if keep_latencies:
            self.latencies[key] = pooled
        entry = self.scenario(key, title, config, runs, st=st)
        entry["valkey"] = valkeystats.per_job(_sum_stats(r.commandstats for r in results),
                                              sum(r.done for r in results), inner, top=10, script_split=shares,
                                              direct=direct)
        entry["valkey"]["basis"] = "INFO commandstats deltas over all measured runs / jobs done"
        if split:
            entry["valkey"]["script_sample"] = split
        if keep_latencies:
            entry["latencies_ms_all_runs"] = [round(v, 3) for v in pooled]
        if target is not None:
            entry["target"] = target(entry["aggregate"])
        return entry

    async def script_sample(self, st: Stack, key: str, clients: int, latency_ms: int) -> dict[str, Any] | None:
        """A short unmeasured batch after the runs, watched two ways: the slow log recording every command gives
        each script's share of the EVALSHA time (INFO commandstats has no per-script figures), and MONITOR tells
        the commands that clients send themselves from those that scripts call (both are counted under one
        name by INFO commandstats)."""
        import redis.asyncio as aioredis

        sampler = valkeystats.Sampler(st.redis_url)
        monitored: list[dict[str, Any]] = []
        watcher = aioredis.Redis.from_url(st.redis_url)

        async def watch() -> None:
            async with watcher.monitor() as monitor:
                async for line in monitor.listen():
                    monitored.append(line)

        try:
            saved = sampler.slowlog_on()
            watching = asyncio.create_task(watch())
            await asyncio.sleep(0.2)  # MONITOR is on before the first job
            try:
                sample = await self._run_load(st, "closed_loop", f"{key} script sample", self.sizes.warmup, clients,
                                              latency_ms, "script-sample")
            finally:
                watching.cancel()
                with contextlib.suppress(BaseException):
                    await watching
                entries = sampler.slowlog_off(saved)
        except Exception as exc:
            self.report.setdefault("notes", []).append(f"{key}: no script sample ({type(exc).__name__}: {exc})")
            return None
        finally:
            sampler.close()
            with contextlib.suppress(Exception):
                await watcher.aclose()
        names = valkeystats.names_by_sha()
        jobs = max(sample.done, 1)
        return {"jobs": sample.done,
                "usec_share": {k: round(v, 4) for k, v in valkeystats.script_shares(entries, names).items()},
                "calls_per_job": {k: round(v / jobs, 3) for k, v in valkeystats.script_calls(entries, names).items()},
                "direct_share": {k: round(v, 4) for k, v in valkeystats.direct_shares(monitored).items()},
                "basis": "SLOWLOG (slowlog-log-slower-than 0) and MONITOR over an unmeasured batch after the runs"}

    def start_profilers(self, st: Stack, key: str) -> list[tuple[subprocess.Popen[bytes], Path]]:
        """py-spy on the gateway and each worker for one run (``--profile``): collapsed stacks in out/profiles/."""
        tool = self.args.py_spy or shutil.which("py-spy")
        if not tool:
            self.report.setdefault("notes", []).append("--profile: py-spy not found (pip install py-spy)")
            return []
        folder = self.out / "profiles"
        folder.mkdir(parents=True, exist_ok=True)
        started = []
        for role, pids in st.pids().items():
            if role not in ("gateway", "worker"):
                continue
            for k, pid in enumerate(pids):
                path = folder / f"{key.replace('/', '-')}-{role}{k}.txt"
                process = subprocess.Popen([tool, "record", "-p", str(pid), "-o", str(path), "-f", "raw", "-r", "200",
                                            "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                started.append((process, path))
        time.sleep(0.5)  # py-spy attaches
        return started

    def stop_profilers(self, profilers: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
        for process, path in profilers:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
            if path.exists():
                path.with_suffix(".top.txt").write_text(profile_summary(path))

    # ------------------------------------------------------------------ scenarios

    async def http_scenarios(self) -> None:
        sz = self.sizes
        if "F" in self.only:
            await self.floor_scenario()
        if {"S1", "S3"} & self.only:
            with self.stack("w1x32", workers=1, window=32) as st:
                if "S3" in self.only:
                    await self.repeated(st, "S3", "latency under load", "closed_loop", sz.s3_jobs, 32, 5, 32, 1,
                                        target=_s3_target)
                if "S1" in self.only:
                    await self.repeated(st, "S1/1w", "throughput, fleet 1", "burst", sz.s1_jobs, sz.s1_clients, 0,
                                        32, 1, keep_latencies=False)
        if "S1" in self.only:
            with self.stack("w2x32", workers=2, window=32) as st:
                await self.repeated(st, "S1/2w", "throughput, fleet 2", "burst", sz.s1_jobs, sz.s1_clients, 0, 32,
                                    2, keep_latencies=False)
            fleet: dict[str, Any] = {}
            for workers, key in ((1, "S1/1w"), (2, "S1/2w")):
                if key in self.report["scenarios"]:
                    fleet[str(workers)] = self.report["scenarios"][key]["aggregate"]["jobs_per_s_to_last_finish"]
            self.report["throughput_vs_fleet"]["S1 via HTTP (first submit -> last finished)"] = fleet
        if "S2" in self.only:
            with self.stack("w1x4", workers=1, window=4) as st:
                await self.repeated(st, "S2", "latency (reference)", "closed_loop", sz.s2_jobs, 4, 5, 4, 1,
                                    target=_s2_target)
        if "G" in self.only:
            with self.stack("gateway-alone", workers=0, window=32, env={"INFERQ_MAX_QUEUE_DEPTH": "0"}) as st:
                warm = await self._submit_only(st, "G warm-up", sz.warmup, 32)
                if not warm["ok"]:
                    self.fail(f"G warm-up: {warm['error_messages'][:5]}")
                runs = []
                for i in range(sz.repeats):
                    profilers = self.start_profilers(st, "G") if self.args.profile and i == 0 else []
                    try:
                        runs.append(await self._submit_only(st, f"G gateway alone run {i + 1}/{sz.repeats}",
                                                            sz.g_jobs, 32))
                    finally:
                        self.stop_profilers(profilers)
                config = {"kind": "submit_only", "jobs": sz.g_jobs, "clients": 32, "workers": 0, "window": "-",
                          "latency_ms": 0}
                entry = self.scenario("G", "gateway alone: POST /v1/jobs", config, runs, st=st)
                entry["valkey"] = {**runs[-1]["valkey"], "basis": "INFO commandstats delta of the last run / submits"}
                entry["target"] = _gateway_target(entry["aggregate"]["submit_per_s"]["median"])
        if "W" in self.only:
            points: dict[str, Any] = {}
            for window in (1, 4, 8, 32):
                with self.stack(f"w1x{window}-sweep", workers=1, window=window) as st:
                    saved = self.sizes
                    self.sizes = Sizes(**{**saved.__dict__, "repeats": 1})
                    try:
                        entry = await self.repeated(st, f"W/{window}", f"window {window}", "closed_loop", sz.w_jobs,
                                                    window, 5, window, 1, keep_latencies=False)
                    finally:
                        self.sizes = saved
                    points[str(window)] = entry["aggregate"]["jobs_per_s"]
            self.report["throughput_vs_window"]["closed loops = window, mock 5 ms, via HTTP"] = points
        if "L" in self.only:
            await self.log_cost()
        if self.args.scale:
            await self.scale_out()
        self.floor_ratios()

    async def log_cost(self) -> None:
        """L: S3's shape with the default log level (INFO, as ``make up`` runs) against WARNING, two stacks up at
        once and their runs alternated, so that the machine's drift falls on both alike."""
        sz = self.sizes
        levels: dict[str, dict[str, str]] = {"default (INFO)": {}, "WARNING": {"INFERQ_LOG_LEVEL": "WARNING"}}
        if self.args.log_debug:  # every access line: what the default logged before it was reduced
            levels["DEBUG"] = {"INFERQ_LOG_LEVEL": "DEBUG"}
        results: dict[str, list[load.LoadResult]] = {name: [] for name in levels}
        with contextlib.ExitStack() as stacks:
            started = {name: stacks.enter_context(self.stack(f"log-{name.split()[0].lower()}", workers=1, window=32,
                                                             env=env, log_level=None))
                       for name, env in levels.items()}
            for name, st in started.items():
                warm = await self._run_load(st, "closed_loop", f"L {name} warm-up", sz.warmup, 32, 5, "warmup")
                if not warm.ok:
                    self.fail(f"L {name} warm-up: {warm.error_count} error(s): {warm.errors[:5]}")
            for i in range(sz.repeats):
                order = list(started.items())
                order = order[i % len(order):] + order[:i % len(order)]  # each level first in turn
                for name, st in order:
                    results[name].append(await self._run_load(st, "closed_loop", f"L {name} run {i + 1}/{sz.repeats}",
                                                              sz.s3_jobs, 32, 5, "L"))
            config = {"kind": "closed_loop", "jobs": sz.s3_jobs, "clients": 32, "workers": 1, "window": 32,
                      "latency_ms": 5, "warmup_jobs": sz.warmup}
            for name, st in started.items():
                self.record_runs(f"L/{name}", f"S3's shape, log level {name}", config, results[name], st,
                                 keep_latencies=False)
        cost = log_cost(self.report["scenarios"]["L/default (INFO)"], self.report["scenarios"]["L/WARNING"])
        self.report["log_cost"] = cost
        self.report["extra_rows"].append({
            "what": "L log cost at the default level",
            "setup": "S3's shape, INFO (default) vs WARNING, runs alternated", "figures": fmt_log_cost(cost),
            "target": cost["target"]["text"], "verdict": report.verdict(cost["target"])})
        if "L/DEBUG" in self.report["scenarios"]:
            debug = log_cost(self.report["scenarios"]["L/DEBUG"], self.report["scenarios"]["L/WARNING"])
            self.report["log_cost_debug"] = debug
            self.report["extra_rows"].append({
                "what": "L log cost at DEBUG", "setup": "S3's shape, DEBUG (every access line) vs WARNING, same runs",
                "figures": fmt_log_cost(debug).replace("at INFO", "at DEBUG")})

    async def floor_scenario(self) -> None:
        """F: the bare Redis Streams queue with S3's shape (bench.floor), run beside S3 in this invocation."""
        sz = self.sizes
        with floor.Floor(window=32, latency_ms=5, log_dir=self.logs) as fl:
            results: list[load.LoadResult] = []
            for i in range(sz.repeats + 1):  # the first is the warm-up, as for the HTTP scenarios
                n = sz.warmup if i == 0 else sz.s3_jobs
                title = "F warm-up" if i == 0 else f"F floor run {i}/{sz.repeats}"
                task = self.progress.add_task(title, total=n)
                sampler = valkeystats.Sampler(fl.url)
                try:
                    stats0, roles0, cpu0 = sampler.snapshot(), fl.cpu_by_role(), time.process_time()
                    result = await floor.closed_loop(fl.url, n, 32, deadline_s=sz.deadline_s,
                                                     progress=functools.partial(self.advance, task))
                    result.client_cpu_s = time.process_time() - cpu0
                    result.cpu_by_role = _cpu_delta(roles0, fl.cpu_by_role(), result.client_cpu_s)
                    result.commandstats = valkeystats.delta(stats0, sampler.snapshot())
                finally:
                    sampler.close()
                self.progress.update(task, visible=False)
                if i == 0:
                    if not result.ok:
                        self.fail(f"F warm-up: {result.error_count} error(s): {result.errors[:5]}")
                    continue
                results.append(result)
            config = {"kind": "closed_loop", "jobs": sz.s3_jobs, "clients": 32, "workers": 1, "window": 32,
                      "latency_ms": 5, "warmup_jobs": sz.warmup}
            self.record_runs("F", "floor: bare Redis Streams, S3's shape", config, results, fl)

    def floor_ratios(self) -> None:
        """inferq's S3 (and S2's p95) as ratios to the floor of this same invocation."""
        scenarios = self.report["scenarios"]
        if "F" not in scenarios or not ({"S3", "S2"} & set(scenarios)):
            return
        ratios = floor_ratios(scenarios)
        self.report["floor_ratios"] = ratios
        self.report["extra_rows"].append({
            "what": "F/S3 inferq vs the floor", "setup": "same invocation; ratios of medians (min-max over run pairs)",
            "figures": fmt_ratios(ratios), "target": ratios["target"]["text"],
            "verdict": report.verdict(ratios["target"])})

    async def scale_out(self) -> None:
        """--scale: gateways x workers x load generators on the direct stack (bench.scale), one row per point."""
        sz = self.sizes
        rows: list[dict[str, Any]] = []
        inner = valkeystats.script_inner_commands()
        for point in self.args.scale:
            jobs = sz.s3_jobs  # per load generator: a point's run lasts about as long as S3's
            env = {**({"INFERQ_LOG_LEVEL": self.args.log_level} if self.args.log_level else {}), **dict(self.args.env)}
            with Stack(workers=point.workers, window=32, mode="direct", gateways=point.gateways, env=env,
                       log_dir=self.logs, name=f"scale-{point.label}") as st:
                warm = await self._run_load(st, "closed_loop", f"scale {point.label} warm-up", sz.warmup, 32, 5,
                                            "warmup")
                if not warm.ok:
                    self.fail(f"scale {point.label} warm-up: {warm.errors[:5]}")
                runs = []
                for i in range(sz.repeats):
                    task = self.progress.add_task(f"scale {point.label} run {i + 1}/{sz.repeats}", total=None)
                    try:
                        runs.append(await self._scale_run(st, point, jobs, inner, i))
                    finally:
                        self.progress.update(task, visible=False)
            row = {"gateways": point.gateways, "workers": point.workers, "generators": point.generators,
                   "jobs": jobs * point.generators, "runs": runs}
            for name in ("jobs_per_s", "p95_ms", "valkey_cpu_ms_per_job", "valkey_core_share", "valkey_usec_per_job"):
                row[f"{name}_spread"] = report.spread([run.get(name) for run in runs])
                row[name] = row[f"{name}_spread"]["median"]
            rows.append(row)
            for run in runs:
                if not run["ok"]:
                    self.fail(f"scale {point.label}: {run['errors']} error(s): {run['error_messages'][:5]}")
        self.report["scale"] = {"rows": rows, "markdown": scale.table(rows),
                                "setup": "direct stack, one Valkey (AOF everysec), mock 5 ms, window 32, "
                                         f"{scale.LOOPS_PER_GENERATOR} closed loops per load generator process"}

    async def _scale_run(self, st: Stack, point: scale.Point, jobs: int, inner: frozenset[str],
                         index: int) -> dict[str, Any]:
        sampler = valkeystats.Sampler(st.redis_url)
        folder = self.out / "scale"
        folder.mkdir(parents=True, exist_ok=True)
        try:
            stats0, roles0 = sampler.snapshot(), st.cpu_by_role()
            start_at = time.perf_counter() + 1.0  # every generator imports first, then all start together
            outs = [folder / f"{point.label}-run{index}-gen{k}.json" for k in range(point.generators)]
            for out in outs:
                out.unlink(missing_ok=True)
            processes = [scale.spawn_generator(st.url, st.api_key, jobs, out, start_at,
                                               deadline_s=self.sizes.deadline_s) for out in outs]
            for process in processes:
                await asyncio.to_thread(_wait_or_kill, process, self.sizes.deadline_s + 60)
            roles = _cpu_delta(roles0, st.cpu_by_role(), 0.0)
            stats = valkeystats.delta(stats0, sampler.snapshot())
        finally:
            sampler.close()
        parts = [json.loads(out.read_text()) if out.exists() else {"jobs": jobs, "ok": False, "errors": 1,
                                                                    "error_messages": [f"{out.name}: no answer"]}
                 for out in outs]
        run = scale.merge(parts)
        done = max(run["done"], 1)
        span = run["done"] / run["jobs_per_s"] if run.get("jobs_per_s") else None
        run["p95_ms"] = run["queue_to_done_ms"].get("p95")
        run["cpu_s_by_role"] = roles
        run["valkey_cpu_ms_per_job"] = roles.get("valkey", 0.0) * 1000 / done
        run["valkey_core_share"] = roles.get("valkey", 0.0) / span if span else None
        run["valkey_usec_per_job"] = valkeystats.per_job(stats, done, inner)["total_usec_per_job"]
        run["loadavg"] = list(os.getloadavg())
        return run

    async def cold_and_drain(self) -> None:
        """Worker cold start and worker drain (no HTTP) against an embedded Valkey of their own."""
        import tempfile

        from emulator.valkey import ValkeyProcess

        with tempfile.TemporaryDirectory(prefix="inferq-bench-") as tmp, ValkeyProcess(Path(tmp)) as server:
            if "C" in self.only:
                await self.worker_cold_start(server.url)
            if "D" in self.only:
                await self.worker_drain(server.url)

    async def worker_cold_start(self, redis_url: str) -> None:
        from inferq.jobs import JobRequest
        from inferq.queue import Queue
        from inferq.settings import Settings

        taken, finished = [], []
        task = self.progress.add_task("C worker cold start", total=self.sizes.repeats)
        for i in range(max(3, self.sizes.repeats)):
            queue = f"bench-cold-{i}"
            q = Queue.connect(Settings(redis_url=redis_url, queue=queue))
            await q.ensure_groups()
            job, _ = await q.enqueue("bench", JobRequest(body=load.job_body(0)["body"]))
            t0 = time.time()
            process = spawn_worker(redis_url, queue, 8, self.logs / "cold-worker.log")
            try:
                deadline = time.monotonic() + 60
                seen = None
                while time.monotonic() < deadline:
                    seen = await q.get(job.id)
                    if seen is not None and seen.status.terminal:
                        break
                    if process.poll() is not None:
                        break
                    await asyncio.sleep(0.005)
                if seen is None or seen.status.value != "succeeded" or seen.started_at is None:
                    self.fail(f"C: worker cold start {i}: the waiting job ended {seen and seen.status.value} "
                              f"(worker exit {process.poll()})")
                else:
                    taken.append((float(seen.started_at) - t0) * 1000)
                    finished.append((float(seen.finished_at or 0) - t0) * 1000)
            finally:
                stop_process(process, 30)
                await q.close()
            self.progress.advance(task, 1)
        self.progress.update(task, visible=False)
        self.report["cold_start"] = {
            **self.report.get("cold_start", {}),
            "worker_start_to_first_job_taken_ms": report.spread(taken),
            "worker_start_to_first_job_done_ms": report.spread(finished),
            "worker_method": "python -m gpu_worker spawned against a queue holding one job (mock 0 ms); time from "
                             "Popen to the job's started_at / finished_at (server clock, same host)",
        }
        self.report["extra_rows"].append({
            "what": "C worker cold start", "setup": f"python -m gpu_worker, 1 job waiting, x{len(taken)}",
            "figures": f"process start -> job taken {report.fmt_spread(report.spread(taken))} ms; -> done "
                       f"{report.fmt_spread(report.spread(finished))} ms"})

    async def worker_drain(self, redis_url: str) -> None:
        from inferq.jobs import JobRequest
        from inferq.queue import Queue
        from inferq.settings import Settings

        n = self.sizes.drain_jobs
        points: dict[str, Any] = {}
        for fleet in (1, 2):
            rates: list[float] = []
            task = self.progress.add_task(f"D worker drain, {fleet} worker(s)", total=self.sizes.repeats)
            for i in range(self.sizes.repeats):
                queue = f"bench-drain-{fleet}-{i}"
                q = Queue.connect(Settings(redis_url=redis_url, queue=queue, max_queue_depth=0))
                await q.ensure_groups()
                request = JobRequest(body=load.job_body(0)["body"])
                for start in range(0, n, 500):
                    await q.enqueue_many("bench", [request] * min(500, n - start))
                processes = [spawn_worker(redis_url, queue, 32, self.logs / "drain-worker.log",
                                          {"INFERQ_WORKER_ID": f"drain-{fleet}-{i}-{k}"}) for k in range(fleet)]
                first = last = None
                try:
                    deadline = time.monotonic() + self.sizes.deadline_s
                    while time.monotonic() < deadline:
                        stats = await q.stats()
                        done = stats.get("succeeded", 0)
                        now = time.perf_counter()
                        if done and first is None:
                            first = (now, done)
                        if done >= n or stats.get("unfinished", n) == 0:
                            last = (now, done)
                            break
                        if any(p.poll() is not None for p in processes):
                            break
                        await asyncio.sleep(0.005)
                    stats = await q.stats()
                finally:
                    for p in processes:
                        stop_process(p, 30)
                    await q.redis.delete(*[k async for k in q.redis.scan_iter(f"inferq:{{{queue}}}:*", count=1000)])
                    await q.close()
                if last is None or first is None or stats.get("succeeded", 0) != n:
                    self.fail(f"D: drain with {fleet} worker(s): {stats.get('succeeded', 0)}/{n} succeeded, stats "
                              f"{stats}")
                elif last[0] > first[0]:
                    rates.append((last[1] - first[1]) / (last[0] - first[0]))
                self.progress.advance(task, 1)
            self.progress.update(task, visible=False)
            points[str(fleet)] = report.spread(rates)
        self.report["worker_drain"] = {
            "method": f"{n} no-op jobs pre-loaded with enqueue_many, then N x python -m gpu_worker (window 32, mock "
                      "0 ms); jobs/s from the first to the last success seen in the queue's stats (no HTTP)",
            "jobs_per_s_by_fleet": points,
        }
        self.report["throughput_vs_fleet"]["worker drain, no HTTP (core path)"] = points
        per_process = points.get("1", {}).get("median")
        target = _core_target(per_process)
        self.report["extra_rows"].append({
            "what": "D worker drain by fleet (core path, no HTTP)",
            "setup": f"{n} pre-loaded no-op jobs, window 32, x{self.sizes.repeats}",
            "figures": f"1 worker {report.fmt_spread(points.get('1'))} jobs/s; 2 workers "
                       f"{report.fmt_spread(points.get('2'))} jobs/s",
            "target": target["text"] + " (drain, 1 worker)", "verdict": report.verdict(target)})
        self.report["worker_drain"]["target"] = target

    def gateway_cold_import(self) -> None:
        code = ("import time; t = time.perf_counter(); import functions.gateway.app; "
                "print(time.perf_counter() - t)")
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
        env.update({"INFERQ_API_KEYS": "bench:benchbenchbench", "PYTHONPATH": str(ROOT)})
        imports, processes = [], []
        for _ in range(max(3, self.sizes.repeats)):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                                 timeout=120)
            wall = time.perf_counter() - t0
            if out.returncode != 0:
                self.fail(f"C: importing functions.gateway.app failed: {out.stderr[-500:]}")
                return
            imports.append(float(out.stdout.strip().splitlines()[-1]) * 1000)
            processes.append(wall * 1000)
        self.report["cold_start"] = {
            **self.report.get("cold_start", {}),
            "gateway_import_ms": report.spread(imports),
            "gateway_process_to_imported_ms": report.spread(processes),
        }
        self.report["extra_rows"].append({
            "what": "C gateway cold import", "setup": "fresh python, import functions.gateway.app",
            "figures": f"import {report.fmt_spread(report.spread(imports))} ms; whole process "
                       f"{report.fmt_spread(report.spread(processes))} ms"})

    def others(self) -> None:
        """The other engineers' parts, by their ``run`` functions, when they exist."""
        quick = self.args.quick
        parts: list[tuple[str, str, str]] = [("C", "bench.gateway", "gateway"), ("D", "bench.worker", "worker"),
                                             ("K", "bench.core", "core"), ("E", "bench.simulate", "elasticity"),
                                             ("V", "bench.efficiency", "efficiency")]
        for key, module_name, section in parts:
            if key not in self.only:
                continue
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name == module_name:
                    self.report.setdefault("missing_parts", []).append(module_name)
                    continue
                raise
            task = self.progress.add_task(f"{key} {module_name}", total=None)
            try:
                params = inspect.signature(module.run).parameters
                kwargs: dict[str, Any] = {"quick": quick} if "quick" in params else {}
                if "out_dir" in params:
                    kwargs["out_dir"] = self.out
                section_report: dict[str, Any] = {}
                with contextlib.redirect_stdout(_Tee(self.logs / f"{section}.txt")):
                    returned = module.run(section_report, **kwargs)
                self.report[f"part_{section}"] = section_report or returned
                text = _elasticity_lines(self.report[f"part_{section}"]) if section == "elasticity" else None
                if text is None and hasattr(module, "render"):
                    with contextlib.suppress(Exception):
                        text = module.render(returned)
                if text is None:
                    text = (self.logs / f"{section}.txt").read_text()[-1500:]
                text = re.sub(r"\s*\[[^\]]*\]", "", text)  # method notes in brackets: kept in results.json
                row = {"what": f"{key} {module_name}", "setup": f"run(report, quick={quick})", "figures": text.strip()}
                if module_name == "bench.worker":
                    part = self.report[f"part_{section}"]
                    target = _core_target(_dig(part, "mock_0ms_end_to_end.jobs_per_s"))
                    row.update(target=target["text"] + " (mock 0 ms end to end, 1 worker)",
                               verdict=report.verdict(target))
                    by_window = {w: _dig(r, "jobs_per_s") for w, r in (part.get("mock_5ms_by_window") or {}).items()}
                    if by_window:
                        self.report["throughput_vs_window"]["bench.worker: mock 5 ms, no HTTP"] = {
                            w: {"median": v, "min": v, "max": v} for w, v in by_window.items() if v is not None}
                self.report["extra_rows"].append(row)
            except Exception as exc:
                self.fail(f"{module_name}.run raised {type(exc).__name__}: {exc}")
                self.report.setdefault("tracebacks", {})[module_name] = traceback.format_exc()
            finally:
                self.progress.update(task, visible=False)

    # ------------------------------------------------------------------ B: a batch

    async def batch_scenario(self) -> None:
        """Scenario B (bench.batch). Always on ``inferq up``: only the emulator has the files bucket (moto's S3)."""
        count = BATCH_LINES_QUICK if self.args.quick else BATCH_LINES
        data = batch.batch_lines(count)
        repeats = self.sizes.repeats
        task = self.progress.add_task(f"B batch of {count:,} lines x{repeats}", total=count * repeats)
        runs: list[dict[str, Any]] = []
        with self.stack("batch", BATCH_WORKERS, BATCH_WINDOW, mode="emulator") as st:
            rss_before = batch.peak_rss_mb(st.pids()["gateway"])
            for _ in range(repeats):
                result = await batch.run_once(st, data, count, lambda k: self.advance(task, k))
                if "error" in result:
                    self.fail(f"B: {result['error']}")
                runs.append(result)
            rss_peak = batch.peak_rss_mb(st.pids()["gateway"])
            described = st.describe()
        self.progress.update(task, visible=False)
        ok = [r for r in runs if "error" not in r]
        summary = batch.summarize(ok)
        self.report["batch"] = {"lines": count, "input_bytes": len(data), "workers": BATCH_WORKERS,
                                "window": BATCH_WINDOW, "stack": described, "runs": runs, "aggregate": summary,
                                "gateway_peak_rss_mb": {"after_start": rss_before, "after_runs": rss_peak}}
        rss = ("" if rss_peak is None else
               f"; gateway peak RSS {rss_peak:.0f} MB (at start {rss_before or 0:.0f} MB)")
        self.report["extra_rows"].append({
            "what": "B batch (Files + Batches API)",
            "setup": f"{count:,} lines x{len(ok)}, {len(data) / 1e6:.1f} MB, {BATCH_WORKERS} workers, window "
                     f"{BATCH_WINDOW}, mock 0 ms, inferq up",
            "figures": f"create -> completed {report.fmt_spread(summary['wall_s'], 1)} s, "
                       f"{report.fmt_spread(summary['lines_per_s'])} lines/s; upload "
                       f"{report.fmt_spread(summary['upload_s'], 2)} s{rss}"})

    # ------------------------------------------------------------------ main

    async def run_async(self) -> None:
        if {"F", "S1", "S2", "S3", "G", "W", "L"} & self.only or self.args.scale:
            await self._guard("HTTP scenarios", self.http_scenarios())
        if {"C", "D"} & self.only:
            await self._guard("worker cold start / drain", self.cold_and_drain())
        if "B" in self.only:
            await self._guard("B batch", self.batch_scenario())

    async def _guard(self, what: str, coro: Any) -> None:
        try:
            await coro
        except Exception as exc:
            self.fail(f"{what}: {type(exc).__name__}: {exc}")
            self.report.setdefault("tracebacks", {})[what] = traceback.format_exc()

    def run(self) -> int:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console()
        if self.console.width < 160:
            self.console = Console(width=160)
        self.logs.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=self.console, transient=False) as progress:
            self.progress = progress
            if "C" in self.only:
                self.gateway_cold_import()
            try:
                import uvloop

                uvloop.run(self.run_async())
            except ImportError:
                asyncio.run(self.run_async())
            self.others()
        self.report["duration_s"] = round(time.monotonic() - started, 1)
        for scenario in self.report["scenarios"].values():
            if scenario["config"]["kind"] == "burst":
                agg = scenario["aggregate"]["jobs_per_s_to_last_finish"]
                workers = scenario["config"]["workers"]
                scenario["per_worker_jobs_per_s"] = (agg["median"] / workers) if agg["median"] else None
                scenario["target"] = {"text": ">= 3,000/s per worker on the core path: see D (HTTP caps S1 at G)",
                                      "met": None}
        self.report["ok"] = not self.report["failures"]
        paths = report.write(self.report, self.out)
        try:
            paths["plots"] = ", ".join(report.plots(self.report, self.latencies, self.out))
        except Exception as exc:
            self.fail(f"plots: {type(exc).__name__}: {exc}")
        (self.out / "results.json").write_text(__import__("json").dumps(self.report, indent=2, default=str))
        self.console.print(report.terminal_table(self.report))
        if self.report.get("scale"):
            self.console.print("scale-out (--scale): " + self.report["scale"]["setup"], highlight=False)
            self.console.print(self.report["scale"]["markdown"], highlight=False, markup=False)
        for caveat in self.report["caveats"]:
            self.console.print(f"[dim]note: {caveat}[/]")
        if self.report.get("missing_parts"):
            self.console.print(f"[yellow]not present, skipped:[/] {', '.join(self.report['missing_parts'])}")
        self.console.print(f"written: {paths}  ({self.report['duration_s']} s)")
        if self.report["failures"]:
            self.console.print(f"[red]{len(self.report['failures'])} failure(s):[/]")
            for failure in self.report["failures"]:
                self.console.print(f"  - {failure}", highlight=False)
            return 1
        return 0


class _Tee:
    """stdout for another part's ``run``: kept in a file and passed through."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("w")
        self.stdout = sys.stdout

    def write(self, text: str) -> int:
        self.file.write(text)
        self.file.flush()
        return self.stdout.write(text)

    def flush(self) -> None:
        self.file.flush()
        self.stdout.flush()


# Where a sample's time goes, by the innermost frame that matches (first match wins, checked from the leaf up).
CATEGORIES = (
    ("logging (uvicorn access log, log records)", ("logging/", "pythonjsonlogger", "aws_lambda_powertools/logging")),
    ("json encode/decode", ("json/",)),
    ("pydantic validation/serialisation", ("pydantic",)),
    ("redis-py client (commands, pool, parser)", ("redis/", "hiredis")),
    ("inferq queue code", ("inferq/",)),
    ("gateway code (auth, edge, models, telemetry)", ("functions/gateway/",)),
    ("worker code", ("gpu_worker/",)),
    ("FastAPI/Starlette (middleware, routing, dependencies, responses)", ("fastapi/", "starlette/")),
    ("uvicorn HTTP protocol (httptools)", ("uvicorn/",)),
    ("prometheus metrics", ("prometheus_client/",)),
    ("asyncio/uvloop, sockets, timeouts", ("asyncio/", "uvloop", "runners.py")),
)


def _category(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, needles in CATEGORIES:
            if any(needle in frame for needle in needles):
                return name
    return "other"


def profile_summary(path: Path, top: int = 40) -> str:
    """Categories, then self and inclusive shares of the hottest frames, of a py-spy raw (collapsed stacks) file."""
    total = 0
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    categories: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
        category = _category(frames)
        categories[category] = categories.get(category, 0) + n
    if not total:
        return "no samples\n"
    out = [f"{total} samples (idle excluded)", "", "by category (innermost matching frame):"]
    out += [f"{100 * v / total:5.1f}%  {k}" for k, v in sorted(categories.items(), key=lambda kv: -kv[1])]
    out += ["", "self:"]
    out += [f"{100 * v / total:5.1f}%  {k}" for k, v in sorted(own.items(), key=lambda kv: -kv[1])[:top]]
    out += ["", "inclusive:"]
    out += [f"{100 * v / total:5.1f}%  {k}" for k, v in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top * 2]]
    return "\n".join(out) + "\n"


def _elasticity_lines(section: dict[str, Any]) -> str | None:
    section = section.get("elasticity", section)
    targets, results = section.get("targets"), section.get("results", {})
    if not targets:
        return None
    lines = []
    for key, t in targets.items():
        name = results.get(key, {}).get("name", key)
        lines.append(f"{name}: {t['gpu_saving_vs_always_on']:.0%} fewer GPU-minutes than always-on, p95 wait "
                     f"{t['p95_ratio_vs_always_on']:.2f}x always-on; vs {t['against']}: fewer GPU-minutes "
                     f"{t['fewer_gpu_minutes_than_keda']}, p95 not worse {t['p95_not_worse_than_keda']} -> "
                     f"{'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)


SYSTEM_ROLES = ("gateway", "workers", "valkey")  # what a bill follows; not the load generator nor AWS's emulation


def run_summary(result: load.LoadResult, inner: frozenset[str] = frozenset(),
                shares: dict[str, float] | None = None, direct: dict[str, float] | None = None) -> dict[str, Any]:
    """One run's figures: the load's summary, CPU per role and in all (gateway + workers + Valkey) per job, and
    Valkey's command time per job by command."""
    n = result.n_jobs
    summary = result.summary()
    summary["loadavg"] = list(os.getloadavg())
    summary["client_cpu_s"] = round(result.client_cpu_s, 3)
    summary["client_cpu_share_of_one_core"] = round(result.client_cpu_s / max(result.elapsed_s, 1e-9), 3)
    summary["cpu_s_by_role"] = result.cpu_by_role
    summary["cpu_ms_per_job_by_role"] = {k: round(v * 1000 / n, 3) for k, v in result.cpu_by_role.items()}
    summary["cpu_ms_per_job_system"] = round(
        sum(v for k, v in result.cpu_by_role.items() if k in SYSTEM_ROLES) * 1000 / n, 3)
    valkey = valkeystats.per_job(result.commandstats, max(result.done, 1), inner, top=6, script_split=shares,
                                 direct=direct)
    summary["valkey_usec_per_job"] = valkey["total_usec_per_job"]
    summary["valkey"] = {k: valkey[k] for k in ("total_usec_per_job", "total_calls_per_job", "top",
                                                "scripts_usec_per_job") if k in valkey}
    summary["commandstats"] = {k: [v.calls, v.usec] for k, v in result.commandstats.items()}
    return summary


def _sum_stats(deltas: Any) -> dict[str, valkeystats.Stat]:
    total: dict[str, valkeystats.Stat] = {}
    for stats in deltas:
        for name, stat in stats.items():
            then = total.get(name, valkeystats.Stat(0, 0))
            total[name] = valkeystats.Stat(then.calls + stat.calls, then.usec + stat.usec)
    return total


def _pair_ratios(num: list[float | None], den: list[float | None]) -> dict[str, Any]:
    pairs = [a / b for a, b in zip(num, den, strict=False) if a is not None and b]
    return report.spread(pairs)


def floor_ratios(scenarios: dict[str, Any]) -> dict[str, Any]:
    """S3's jobs/s and p95 over the floor's (ratio of the medians, min-max over runs paired in order), S2's p95
    over the floor's, and the floor's own figures; the issue's goals as one target."""
    fl = scenarios["F"]
    f_agg = fl["aggregate"]
    out: dict[str, Any] = {
        "floor_jobs_per_s": f_agg["jobs_per_s"], "floor_p95_ms": f_agg["queue_to_done_ms.p95"],
        "floor_valkey_usec_per_job": f_agg.get("valkey_usec_per_job"),
        "floor_cpu_ms_per_job_system": f_agg.get("cpu_ms_per_job_system"),
    }
    met: list[bool] = []
    texts: list[str] = []

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    if "S3" in scenarios:
        s3 = scenarios["S3"]
        agg = s3["aggregate"]
        rate = ratio(agg["jobs_per_s"]["median"], f_agg["jobs_per_s"]["median"])
        p95 = ratio(agg["queue_to_done_ms.p95"]["median"], f_agg["queue_to_done_ms.p95"]["median"])
        out["S3_jobs_per_s_ratio"] = {**_pair_ratios([r.get("jobs_per_s") for r in s3["runs"]],
                                                     [r.get("jobs_per_s") for r in fl["runs"]]), "median": rate}
        out["S3_p95_ratio"] = {**_pair_ratios([_p95(r) for r in s3["runs"]], [_p95(r) for r in fl["runs"]]),
                               "median": p95}
        out["S3_valkey_usec_ratio"] = ratio(_median(agg, "valkey_usec_per_job"), _median(f_agg, "valkey_usec_per_job"))
        out["S3_cpu_ms_per_job_system"] = agg.get("cpu_ms_per_job_system")
        texts += ["S3 jobs/s >= 0.8x floor", "S3 p95 <= 2x floor", "S3 CPU (gateway+workers+Valkey) <= 1.0 ms/job"]
        cpu = _median(agg, "cpu_ms_per_job_system")
        met += [rate is not None and rate >= 0.8, p95 is not None and p95 <= 2.0, cpu is not None and cpu <= 1.0]
    if "S2" in scenarios:
        s2 = scenarios["S2"]
        p95 = ratio(s2["aggregate"]["queue_to_done_ms.p95"]["median"], f_agg["queue_to_done_ms.p95"]["median"])
        out["S2_p95_ratio"] = {**_pair_ratios([_p95(r) for r in s2["runs"]], [_p95(r) for r in fl["runs"]]),
                               "median": p95}
        texts.append("S2 p95 <= floor's p95")
        met.append(p95 is not None and p95 <= 1.0)
    out["target"] = {"text": "; ".join(texts), "met": all(met) if met else None}
    return out


def _p95(run: dict[str, Any]) -> float | None:
    value = (run.get("queue_to_done_ms") or {}).get("p95")
    return float(value) if isinstance(value, int | float) else None


def fmt_ratios(r: dict[str, Any]) -> str:
    """The ratios row: ``S3 0.34x floor's jobs/s (0.30-0.36), p95 3.4x (...); ...; floor 1,750 jobs/s ...``."""
    parts = []
    if "S3_jobs_per_s_ratio" in r:
        parts.append(f"S3 {report.fmt_spread(r['S3_jobs_per_s_ratio'], 2)}x the floor's jobs/s, p95 "
                     f"{report.fmt_spread(r['S3_p95_ratio'], 2)}x; S3 CPU (gateway+workers+Valkey) "
                     f"{report.fmt_spread(r.get('S3_cpu_ms_per_job_system'), 2)} ms/job")
    if "S2_p95_ratio" in r:
        parts.append(f"S2 p95 {report.fmt_spread(r['S2_p95_ratio'], 2)}x the floor's p95")
    parts.append(f"floor {report.fmt_spread(r['floor_jobs_per_s'])} jobs/s, p95 "
                 f"{report.fmt_spread(r['floor_p95_ms'], 1)} ms, Valkey "
                 f"{report.fmt_spread(r.get('floor_valkey_usec_per_job'))} µs/job, CPU "
                 f"{report.fmt_spread(r.get('floor_cpu_ms_per_job_system'), 2)} ms/job")
    return "\n".join(parts)


def log_cost(default: dict[str, Any], warning: dict[str, Any]) -> dict[str, Any]:
    """What the default log level costs against WARNING: the loss of jobs/s (1 - INFO/WARNING, median over the
    alternated run pairs, min-max) and the extra CPU per job of the gateway, the workers and both together."""
    pairs = [1 - a / b for a, b in zip([r.get("jobs_per_s") for r in default["runs"]],
                                       [r.get("jobs_per_s") for r in warning["runs"]], strict=False)
             if a is not None and b]
    loss = report.spread(pairs)
    cpu_d, cpu_w = report.cpu_per_job(default["runs"]), report.cpu_per_job(warning["runs"])
    extra = {role: round(cpu_d.get(role, 0.0) - cpu_w.get(role, 0.0), 3) for role in ("gateway", "workers", "valkey")}
    sys_d, sys_w = _median(default["aggregate"], "cpu_ms_per_job_system"), _median(warning["aggregate"],
                                                                                    "cpu_ms_per_job_system")
    cpu_share = (sys_d / sys_w - 1) if sys_d is not None and sys_w else None
    return {"jobs_per_s_default": default["aggregate"]["jobs_per_s"],
            "jobs_per_s_warning": warning["aggregate"]["jobs_per_s"],
            "jobs_per_s_loss": loss, "extra_cpu_ms_per_job": extra, "system_cpu_extra_share": cpu_share,
            "target": {"text": "the default costs <= 10% of jobs/s against WARNING",
                       "met": loss["median"] is not None and loss["median"] <= 0.10}}


def fmt_log_cost(c: dict[str, Any]) -> str:
    loss = c["jobs_per_s_loss"]
    pct = {k: (None if v is None else v * 100) for k, v in loss.items() if k in ("median", "min", "max")}
    extra = c["extra_cpu_ms_per_job"]
    share = c.get("system_cpu_extra_share")
    return (f"{report.fmt_spread(c['jobs_per_s_default'])} jobs/s at INFO vs "
            f"{report.fmt_spread(c['jobs_per_s_warning'])} at WARNING: costs "
            f"{report.fmt_spread({**pct, 'n': loss.get('n', 0)}, 1)}% of jobs/s\n"
            f"extra CPU ms/job: gateway {extra['gateway']:+.3f}, workers {extra['workers']:+.3f}, valkey "
            f"{extra['valkey']:+.3f}"
            + (f" ({share * 100:+.1f}% of gateway+workers+Valkey)" if share is not None else ""))


def _wait_or_kill(process: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        stop_process(process, 10)


def _cpu_delta(before: dict[str, float], after: dict[str, float], client_s: float) -> dict[str, float]:
    delta = {role: round(after.get(role, 0.0) - before.get(role, 0.0), 3) for role in after}
    delta["load generator (this process)"] = round(client_s, 3)
    return delta


def _dig(section: Any, path: str) -> float | None:
    for part in path.split("."):
        section = section.get(part) if isinstance(section, dict) else None
    return float(section) if isinstance(section, int | float) else None


def _median(agg: dict[str, Any], path: str) -> float | None:
    value = agg.get(path, {}).get("median")
    return float(value) if value is not None else None


def _s2_target(agg: dict[str, Any]) -> dict[str, Any]:
    p95 = _median(agg, "queue_to_done_ms.p95")
    return {"text": "p95 <= 20 ms", "met": p95 is not None and p95 <= 20.0}


def _s3_target(agg: dict[str, Any]) -> dict[str, Any]:
    p95, rate = _median(agg, "queue_to_done_ms.p95"), _median(agg, "jobs_per_s")
    met = p95 is not None and rate is not None and p95 <= 60.0 and rate >= 1000.0
    return {"text": ">= 1,000 jobs/s and p95 <= 60 ms", "met": met}


def _gateway_target(rate: float | None) -> dict[str, Any]:
    return {"text": ">= 1,500 submits/s (one uvicorn process)", "met": rate is not None and rate >= 1500.0}


def _core_target(per_process: float | None) -> dict[str, Any]:
    return {"text": ">= 3,000 jobs/s per worker process", "met": per_process is not None and per_process >= 3000.0}


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.startswith(("INFERQ_", "UVICORN_")):
        raise argparse.ArgumentTypeError(f"expected INFERQ_NAME=VALUE, got {text!r}")
    return name, value


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small counts, 1 repeat")
    parser.add_argument("--repeats", type=int, help="runs per scenario (default 3; --quick 1)")
    parser.add_argument("--only", type=lambda s: [p.strip().upper() for p in s.split(",") if p.strip()],
                        default=list(ALL), help=f"comma-separated subset of {','.join(ALL)} (S1 covers both fleets)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="output folder (bench/out)")
    parser.add_argument("--stack", choices=("emulator", "direct"), default="emulator",
                        help="emulator: inferq up (default); direct: Valkey + uvicorn + workers without it")
    parser.add_argument("--log-level", default=None,
                        help="INFERQ_LOG_LEVEL of the stack under test, for comparisons (default: the stack's own "
                             "default, INFO, as make up runs it; scenario L measures INFO against WARNING)")
    parser.add_argument("--log-debug", action="store_true",
                        help="L also measures INFERQ_LOG_LEVEL=DEBUG (an access line per request) against WARNING")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="load generator's HTTP client: raw (bench.load.RawClient, keep-alive, light: the "
                             "default) or httpx (AsyncClient, ~1 ms CPU per request here)")
    parser.add_argument("--env", action="append", default=[], type=_env_pair, metavar="INFERQ_NAME=VALUE",
                        help="extra setting for the stack under test (repeatable); the caller's own INFERQ_* "
                             "environment is not passed on")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy the gateway and workers during the first run of each HTTP scenario "
                             "(out/profiles/)")
    parser.add_argument("--py-spy", help="path of py-spy (default: on PATH)")
    parser.add_argument("--scale", nargs="?", const="auto", default=None, metavar="GxWxL,...",
                        help="scale-out grid after the scenarios: gateways (uvicorn --workers) x worker processes x "
                             "load generator processes on the direct stack, e.g. 1x1x1,2x2x2,4x2x4 (no value: the "
                             "issue's grid cut to this machine's cores); off by default")
    args = parser.parse_args(argv)
    if args.scale is not None:
        try:
            auto = args.scale == "auto"
            args.scale = scale.default_grid(os.cpu_count() or 1) if auto else scale.parse_grid(args.scale)
        except ValueError as exc:
            parser.error(f"--scale: {exc}")
    unknown = set(args.only) - set(ALL)
    if unknown:
        parser.error(f"unknown scenario(s) {sorted(unknown)}; choose from {','.join(ALL)}")
    return args


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds the ``with Stack`` blocks: every stack started is stopped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    signal.signal(signal.SIGTERM, _terminate)
    return Bench(args).run()


if __name__ == "__main__":
    raise SystemExit(main())
