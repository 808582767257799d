"""Scale-out (``--scale``): where one queue saturates. A grid of gateways x workers x load generators on the direct
stack (one Valkey, ``uvicorn --workers G``, W worker processes, L load generator processes of 32 closed loops
each, mock 5 ms, window 32), one row per point: jobs/s, p95, Valkey CPU per job and its share of one core, and
Valkey's command time per job. Off by default: on a machine with few cores every point measures the same
contention. ``python -m bench.scale loadgen ...`` is one load generator process.

Load generators are separate processes so that the client side is not one event loop on one core; their clocks
agree because ``time.perf_counter`` is the system's monotonic clock on Linux, shared by every process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import clients, load, report

LOOPS_PER_GENERATOR = 32


@dataclass(frozen=True)
class Point:
    gateways: int
    workers: int
    generators: int

    @property
    def label(self) -> str:
        return f"{self.gateways}x{self.workers}x{self.generators}"


def parse_grid(text: str) -> list[Point]:
    """``"1x1x1,2x2x2"`` -> points (gateways x workers x load generators); each at least 1."""
    points = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        fields = part.lower().split("x")
        if len(fields) != 3 or not all(f.isdigit() and int(f) >= 1 for f in fields):
            raise ValueError(f"expected GATEWAYSxWORKERSxGENERATORS like 2x2x2, got {part!r}")
        points.append(Point(*(int(f) for f in fields)))
    if not points:
        raise ValueError("an empty grid")
    return points


def default_grid(cores: int) -> list[Point]:
    """The issue's table, cut to what the machine's cores can drive: at most two processes per core (Valkey and
    the emulator-free stack's processes are mostly waiting at the small points, busy at the top)."""
    grid = [Point(1, 1, 1), Point(2, 2, 2), Point(4, 2, 4), Point(8, 3, 8), Point(10, 4, 10)]
    fitting = [p for p in grid if p.gateways + p.workers + p.generators <= cores * 2]
    return fitting or grid[:1]


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The load generators' answers as one run: jobs/s from the first submit to the last job in hand across all of
    them, latency percentiles over every job, errors summed."""
    starts = [p["first_submit"] for p in parts if p.get("first_submit") is not None]
    ends = [p["last_done"] for p in parts if p.get("last_done") is not None]
    latencies = sorted(v for p in parts for v in p.get("latencies_ms", []))
    done = sum(p.get("done", 0) for p in parts)
    jobs = sum(p.get("jobs", 0) for p in parts)
    span = (max(ends) - min(starts)) if starts and ends else 0.0
    return {"jobs": jobs, "done": done, "errors": sum(p.get("errors", 0) for p in parts),
            "error_messages": [m for p in parts for m in p.get("error_messages", [])][:20],
            "ok": done == jobs and all(p.get("ok") for p in parts) and bool(parts),
            "jobs_per_s": done / span if span > 0 else None, "queue_to_done_ms": load.distribution(latencies),
            "client_cpu_s": round(sum(p.get("cpu_s", 0.0) for p in parts), 3)}


def table(rows: list[dict[str, Any]]) -> str:
    """The issue's table, in Markdown."""
    lines = ["| gateways | workers | load generators | jobs/s | p95 ms | Valkey CPU per job | Valkey CPU, share of one "
             "core | Valkey command time per job |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['gateways']} | {row['workers']} | {row['generators']} | {report.fmt(row.get('jobs_per_s'))} | "
            f"{report.fmt(row.get('p95_ms'))} | {_ms(row.get('valkey_cpu_ms_per_job'))} | "
            f"{_pct(row.get('valkey_core_share'))} | {_us(row.get('valkey_usec_per_job'))} |")
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} µs"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


async def _generate(url: str, api_key: str, jobs: int, loops: int, latency_ms: int, deadline_s: float) -> dict[str,
                                                                                                               Any]:
    cpu0 = time.process_time()
    async with clients.make_pool(url, api_key, loops, timeout_s=40.0) as pool:
        result = await load.closed_loop(pool, jobs, loops, load.job_body(latency_ms), deadline_s=deadline_s)
    done = [r for r in result.records if r.done]
    return {"jobs": jobs, "done": len(done), "errors": result.error_count, "error_messages": result.errors[:5],
            "ok": result.ok, "latencies_ms": result.latencies_ms(),
            "first_submit": min((r.t_submit for r in result.records if r.t_submit is not None), default=None),
            "last_done": max((r.t_done for r in done if r.t_done is not None), default=None),
            "cpu_s": time.process_time() - cpu0}


def spawn_generator(url: str, api_key: str, jobs: int, out: Path, start_at: float, latency_ms: int = 5,
                    deadline_s: float = 300.0) -> subprocess.Popen[bytes]:
    """One load generator process; it waits until ``start_at`` (perf_counter) so that all start together."""
    from .stack import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    argv = [sys.executable, "-m", "bench.scale", "loadgen", "--url", url, "--jobs", str(jobs), "--out", str(out),
            "--latency-ms", str(latency_ms), "--deadline-s", str(deadline_s), "--start-at", repr(start_at)]
    return subprocess.Popen(argv, cwd=ROOT, env={**env, "BENCH_API_KEY": api_key}, stdin=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description="one load generator process")
    parser.add_argument("role", choices=("loadgen",))
    parser.add_argument("--url", required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--loops", type=int, default=LOOPS_PER_GENERATOR)
    parser.add_argument("--latency-ms", type=int, default=5)
    parser.add_argument("--deadline-s", type=float, default=300.0)
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    clients.check_loopback(args.url)
    api_key = os.environ["BENCH_API_KEY"]  # not on the command line: ps shows that
    time.sleep(max(0.0, args.start_at - time.perf_counter()))
    try:
        import uvloop

        answer = uvloop.run(_generate(args.url, api_key, args.jobs, args.loops, args.latency_ms, args.deadline_s))
    except ImportError:
        answer = asyncio.run(_generate(args.url, api_key, args.jobs, args.loops, args.latency_ms, args.deadline_s))
    args.out.write_text(json.dumps(answer))
    return 0 if answer["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
