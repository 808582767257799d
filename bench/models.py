"""Scenario M: several models cost nothing against one (issue 14, "S3 with 2 models shows no loss against one").

S3's load shape (2,000 jobs, mock 5 ms, 32 closed loops) runs on two stacks up at once, their runs alternated so
that the machine's drift falls on both alike:

- **one model**: no registry, one queue, 2 workers at window 16;
- **two models**: a registry written here (``chat`` and ``embed``, each its own queue and fleet), 1 worker at
  window 16 per model, the closed loops' jobs naming the two models in turn.

Both have the same capacity (two worker processes, 32 slots, as many as the closed loops), so a difference is
what routing by model and a second queue cost. Reported: jobs/s and p95 of each, and two models over one (ratio
of the medians, min-max over the run pairs).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from . import load, report
from .session import Session
from .stack import READY_TIMEOUT_S, Stack, StackError
from .summary import dig

MODELS = ("chat", "embed")
WINDOW = 16
TARGET_RATE = 0.9
TARGET_P95 = 1.2


def write_registry(folder: Path) -> Path:
    """Two models on their own queues; every other field from the stack's INFERQ_* settings (fleet, window)."""
    path = folder / "models.json"
    path.write_text(json.dumps({"default": MODELS[0], "models": [{"name": m, "queue": m} for m in MODELS]}))
    return path


def wait_model_fleet(st: Stack, model: str, workers: int) -> None:
    """Until ``/v1/scale?model=`` shows ``workers`` live workers for ``model`` (the stack waits for the first)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    seen: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            seen = httpx.get(st.url + "/v1/scale", params={"model": model}, headers=st.headers, timeout=5).json()
            if seen.get("workers") == workers:
                return
        time.sleep(0.2)
    raise StackError(f"model {model}: {workers} worker(s) not live within {READY_TIMEOUT_S:g}s (last: {seen})")


def ratios(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    """Two models over one: jobs/s and p95, each the ratio of the medians with the min-max over the run pairs."""
    def pairs(path: str) -> dict[str, Any]:
        def values(entry: dict[str, Any]) -> list[Any]:
            return [dig(run, path) for run in entry["runs"]]

        spread = report.spread([a / b for a, b in zip(values(two), values(one), strict=False) if a is not None and b])
        a, b = two["aggregate"][path]["median"], one["aggregate"][path]["median"]
        return {**spread, "median": a / b if a is not None and b else None}

    rate, p95 = pairs("jobs_per_s"), pairs("queue_to_done_ms.p95")
    return {"jobs_per_s_one": one["aggregate"]["jobs_per_s"], "jobs_per_s_two": two["aggregate"]["jobs_per_s"],
            "p95_ms_one": one["aggregate"]["queue_to_done_ms.p95"],
            "p95_ms_two": two["aggregate"]["queue_to_done_ms.p95"],
            "jobs_per_s_ratio": rate, "p95_ratio": p95,
            "target": {"text": f"two models >= {TARGET_RATE}x one model's jobs/s, p95 <= {TARGET_P95}x",
                       "met": rate["median"] is not None and rate["median"] >= TARGET_RATE
                       and p95["median"] is not None and p95["median"] <= TARGET_P95}}


def fmt_ratios(r: dict[str, Any]) -> str:
    return (f"one model {report.fmt_spread(r['jobs_per_s_one'])} jobs/s, p95 {report.fmt_spread(r['p95_ms_one'], 1)}"
            f" ms; two models {report.fmt_spread(r['jobs_per_s_two'])} jobs/s, p95 "
            f"{report.fmt_spread(r['p95_ms_two'], 1)} ms\n"
            f"two/one: jobs/s {report.fmt_spread(r['jobs_per_s_ratio'], 2)}x, p95 "
            f"{report.fmt_spread(r['p95_ratio'], 2)}x")


class ModelScenarios(Session):
    async def models_scenario(self) -> None:
        """M: S3's shape on one model and split over two, two stacks up at once, runs alternated."""
        sz = self.sizes
        results: dict[str, list[load.LoadResult]] = {"one": [], "two": []}
        with tempfile.TemporaryDirectory(prefix="inferq-bench-models-") as folder, contextlib.ExitStack() as stacks:
            registry = write_registry(Path(folder))
            shapes: dict[str, tuple[int, dict[str, str], tuple[str, ...]]] = {
                "one": (2, {}, ()), "two": (1, {"INFERQ_MODELS": str(registry)}, MODELS)}
            started = {name: stacks.enter_context(self.stack(f"models-{name}", workers=workers, window=WINDOW,
                                                             env=env))
                       for name, (workers, env, _) in shapes.items()}
            for model in MODELS[1:]:
                wait_model_fleet(started["two"], model, 1)
            for name, st in started.items():
                warm = await self._run_load(st, "closed_loop", f"M {name} warm-up", sz.warmup, 32, 5, "warmup",
                                            models=shapes[name][2])
                if not warm.ok:
                    self.fail(f"M {name} warm-up: {warm.error_count} error(s): {warm.errors[:5]}")
            for i in range(sz.repeats):
                order = list(started.items())
                order = order[i % 2:] + order[:i % 2]  # each first in turn
                for name, st in order:
                    results[name].append(await self._run_load(
                        st, "closed_loop", f"M {name} model(s) run {i + 1}/{sz.repeats}", sz.s3_jobs, 32, 5,
                        f"M/{name}", models=shapes[name][2]))
            for name, st in started.items():
                workers, _, models = shapes[name]
                config = {"kind": "closed_loop", "jobs": sz.s3_jobs, "clients": 32, "latency_ms": 5,
                          "warmup_jobs": sz.warmup, "window": WINDOW,
                          "workers": workers * max(1, len(models)), "models": list(models) or ["(no registry)"]}
                title = ("S3's shape, one model: 2 workers x window 16" if name == "one" else
                         "S3's shape over two models: 1 worker x window 16 each")
                self.record_runs(f"M/{name}", title, config, results[name], st, keep_latencies=False)
        found = ratios(self.report["scenarios"]["M/one"], self.report["scenarios"]["M/two"])
        self.report["models_ratio"] = found
        self.report["extra_rows"].append({
            "what": "M two models vs one", "setup": "S3's shape, same capacity (2 workers, 32 slots), runs alternated",
            "figures": fmt_ratios(found), "target": found["target"]["text"],
            "verdict": report.verdict(found["target"])})
