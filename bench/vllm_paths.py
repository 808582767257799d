"""The paths scenario V (:mod:`bench.efficiency`) measures, and where their processes run: the request set, the
engine's gauges and counters sampled during a run, one run straight to the vLLM server by closed loops
(:func:`direct`), one run through inferq with a worker at a given window (:func:`through_inferq`), and the engine's
placement on a CPU of its own (:func:`engine_placement`, :func:`pin_group`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import statistics
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
