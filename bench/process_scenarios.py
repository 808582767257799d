"""The process scenario family (C, D): the gateway module's cold import, a worker process's start to its first
job, and a pre-loaded queue drained by worker processes, without HTTP."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import load, report
from .session import Session
from .stack import ROOT, spawn_worker, stop_process
from .summary import core_target


class ProcessScenarios(Session):
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
        from inferq.config.settings import Settings
        from inferq.queue.jobs import JobRequest
        from inferq.queue.protocol import Queue

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
        from inferq.config.settings import Settings
        from inferq.queue.jobs import JobRequest
        from inferq.queue.protocol import Queue

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
        target = core_target(per_process)
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
