"""The HTTP scenario family (F, S1, S2, S3, G, W, L, and the ``--scale`` grid): load through the gateway of a
stack, each scenario's runs recorded by :class:`bench.session.Session`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import subprocess
import time
from typing import Any

from . import floor, load, report, scale, valkeystats
from .clients import make_pool
from .measured import measured
from .session import Session, Sizes
from .stack import Stack, stop_process
from .summary import (
    cpu_delta,
    floor_ratios,
    fmt_log_cost,
    fmt_ratios,
    gateway_target,
    log_cost,
    s2_target,
    s3_target,
)


class HttpScenarios(Session):
    async def http_scenarios(self) -> None:
        sz = self.sizes
        if "F" in self.only and "S3" not in self.only:
            await self.floor_scenario()
        if {"S1", "S3"} & self.only:
            with self.stack("w1x32", workers=1, window=32) as st:
                if "S3" in self.only and "F" in self.only:
                    await self.floor_scenario(st)  # S3's runs alternated with the floor's
                elif "S3" in self.only:
                    await self.repeated(st, "S3", "latency under load", "closed_loop", sz.s3_jobs, 32, 5, 32, 1,
                                        target=s3_target)
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
                                    target=s2_target)
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
                entry["target"] = gateway_target(entry["aggregate"]["submit_per_s"]["median"])
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

    async def floor_scenario(self, s3: Stack | None = None) -> None:
        """F: the bare Redis Streams queue with S3's shape (bench.floor), run beside S3 in this invocation; and FH,
        the same queue behind a bare ASGI gateway under uvicorn, driven by S3's load generator. With ``s3`` (S3's
        stack, up beside the floor's) S3's runs are made here too. The runs alternate, each scenario first in turn
        from one round to the next, so a machine whose speed drifts during the invocation (it does: up to 2x in an
        hour here) favours none of them, and the ratios to the floor pair runs of the same round."""
        sz = self.sizes
        keys = ["F", "FH", *(["S3"] if s3 is not None else [])]
        with floor.HttpFloor(window=32, latency_ms=5, log_dir=self.logs) as fl:
            results: dict[str, list[load.LoadResult]] = {key: [] for key in keys}
            for i in range(sz.repeats + 1):  # the first is the warm-up, as for the HTTP scenarios
                n = sz.warmup if i == 0 else sz.s3_jobs
                turn = max(0, i - 1) % len(keys)
                for key in keys[turn:] + keys[:turn]:
                    title = f"{key} warm-up" if i == 0 else f"{key} floor run {i}/{sz.repeats}"
                    if key == "S3":
                        assert s3 is not None
                        result = await self._s3_run(s3, i, n)
                    else:
                        result = await self._floor_run(fl, key, title, n)
                    if i == 0:
                        if not result.ok:
                            self.fail(f"{key} warm-up: {result.error_count} error(s): {result.errors[:5]}")
                        continue
                    results[key].append(result)
            config = {"kind": "closed_loop", "jobs": sz.s3_jobs, "clients": 32, "workers": 1, "window": 32,
                      "latency_ms": 5, "warmup_jobs": sz.warmup}
            self.record_runs("F", "floor: bare Redis Streams, S3's shape", config, results["F"], fl)
            self.record_runs("FH", "HTTP floor: the floor behind a bare ASGI gateway (uvicorn), S3's load generator",
                             config, results["FH"], fl)
        if s3 is not None:
            split = await self.script_sample(s3, "S3", 32, 5)
            self.record_runs("S3", "latency under load", config, results["S3"], s3, split, s3_target)

    async def _floor_run(self, fl: floor.HttpFloor, key: str, title: str, n: int) -> load.LoadResult:
        """One run of F (the floor's own client) or FH (S3's load generator through the bare ASGI gateway)."""
        sz = self.sizes
        task = self.progress.add_task(title, total=n)
        progress = functools.partial(self.advance, task)
        with measured(fl.url, fl.cpu_by_role, fl.io_calls_by_role) as finish:
            if key == "F":
                result = await floor.closed_loop(fl.url, n, 32, deadline_s=sz.deadline_s, progress=progress)
            else:
                async with make_pool(fl.url_http, "floor", 32, timeout_s=40.0, kind=self.args.client) as client:
                    result = await load.closed_loop(client, n, 32, load.job_body(5), name="FH",
                                                    deadline_s=sz.deadline_s, progress=progress)
            finish(result)
        self.progress.update(task, visible=False)
        return result

    async def _s3_run(self, st: Stack, i: int, n: int) -> load.LoadResult:
        """S3's warm-up (``i`` 0) or its measured run ``i``, as :meth:`repeated` makes them."""
        if i == 0:
            return await self._run_load(st, "closed_loop", "S3 warm-up", n, 32, 5, "warmup")
        profilers = self.start_profilers(st, "S3") if self.args.profile and i == 1 else []
        try:
            return await self._run_load(st, "closed_loop", f"S3 latency under load run {i}/{self.sizes.repeats}", n,
                                        32, 5, "S3")
        finally:
            self.stop_profilers(profilers)

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
            roles = cpu_delta(roles0, st.cpu_by_role(), 0.0)
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


def _wait_or_kill(process: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        stop_process(process, 10)
