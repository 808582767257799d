"""One bench session, what every scenario family builds on: its sizes per mode, the report being built, stacks as
``make up`` runs them, measured load runs (:mod:`bench.measured`), runs aggregated into a scenario, and py-spy
profilers (:mod:`bench.profiles`) when asked."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import floor, load, report, valkeystats
from .clients import make_pool
from .measured import measured
from .measured import script_sample as sample_script_shares
from .profiles import start_profilers, stop_profilers
from .stack import Stack
from .summary import SYSTEM_ROLES, cpu_delta, run_summary, sum_stats

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


class Session:
    """What every scenario family uses: the report, the stacks, a measured load run and its summary, profilers."""

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
                        name: str, models: tuple[str, ...] = ()) -> load.LoadResult:
        """One measured run; ``models``: the closed loops' jobs name these models in turn (``body.model``)."""
        task = self.progress.add_task(title, total=n)
        body = load.job_body(latency_ms)
        bodies = [{"body": {**body["body"], "model": model}} for model in models]
        with measured(st.redis_url, st.cpu_by_role, st.io_calls_by_role) as finish:
            async with make_pool(st.url, st.api_key, clients, timeout_s=40.0, kind=self.args.client) as client:
                if kind == "closed_loop":
                    result = await load.closed_loop(client, n, clients, body, name=name, bodies=bodies,
                                                    deadline_s=self.sizes.deadline_s,
                                                    progress=lambda k: self.progress.advance(task, k))
                else:
                    result = await load.burst(client, n, clients, body, name=name, deadline_s=self.sizes.deadline_s,
                                              progress=lambda k: self.progress.advance(task, k))
            finish(result)
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
        async with make_pool(st.url, st.api_key, clients, kind=self.args.client) as pool:

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
        cpu = cpu_delta(roles0, st.cpu_by_role(), time.process_time() - cpu0)
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
        entry["valkey"] = valkeystats.per_job(sum_stats(r.commandstats for r in results),
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
        """Each script's share of Valkey's time over a short unmeasured batch (:func:`bench.measured.script_sample`);
        None, with a note in the report, when the server would not say."""
        try:
            return await sample_script_shares(st.redis_url, lambda: self._run_load(
                st, "closed_loop", f"{key} script sample", self.sizes.warmup, clients, latency_ms, "script-sample"))
        except Exception as exc:
            self.report.setdefault("notes", []).append(f"{key}: no script sample ({type(exc).__name__}: {exc})")
            return None

    def start_profilers(self, st: Stack, key: str) -> list[tuple[subprocess.Popen[bytes], Path]]:
        """py-spy on the gateway and each worker for one run (``--profile``): collapsed stacks in out/profiles/."""
        tool = self.args.py_spy or shutil.which("py-spy")
        if not tool:
            self.report.setdefault("notes", []).append("--profile: py-spy not found (pip install py-spy)")
            return []
        return start_profilers(tool, st.pids(), self.out / "profiles", key)

    def stop_profilers(self, profilers: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
        stop_profilers(profilers)
