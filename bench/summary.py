"""Figures derived from runs: one run's summary (CPU per role, Valkey per command), inferq against the floor,
the log level's cost, and the targets each scenario is held to."""

from __future__ import annotations

import os
import statistics
from typing import Any

from . import load, report, valkeystats

SYSTEM_ROLES = ("gateway", "workers", "valkey")  # what a bill follows; not the load generator nor AWS's emulation


def run_summary(result: load.LoadResult, inner: frozenset[str] = frozenset(),
                shares: dict[str, float] | None = None, direct: dict[str, float] | None = None) -> dict[str, Any]:
    """One run's figures: the load's summary, CPU per role and in all (gateway + workers + Valkey) per job, and
    Valkey's command time per job by command."""
    n = result.n_jobs
    summary = result.summary()
    summary["loadavg"] = list(os.getloadavg())
    summary["client_cpu_s"] = round(result.client_cpu_s, 3)
    summary["client_cpu_share_of_one_core"] = round(result.client_cpu_s / max(result.elapsed_s, 1e-9), 3)
    summary["cpu_s_by_role"] = result.cpu_by_role
    summary["cpu_ms_per_job_by_role"] = {k: round(v * 1000 / n, 3) for k, v in result.cpu_by_role.items()}
    summary["cpu_ms_per_job_system"] = round(
        sum(v for k, v in result.cpu_by_role.items() if k in SYSTEM_ROLES) * 1000 / n, 3)
    if result.io_calls_by_role:
        summary["io_calls_per_job_by_role"] = {k: round(v / n, 2) for k, v in result.io_calls_by_role.items()
                                               if k in SYSTEM_ROLES}
    valkey = valkeystats.per_job(result.commandstats, max(result.done, 1), inner, top=6, script_split=shares,
                                 direct=direct)
    summary["valkey_usec_per_job"] = valkey["total_usec_per_job"]
    summary["valkey"] = {k: valkey[k] for k in ("total_usec_per_job", "total_calls_per_job", "top",
                                                "scripts_usec_per_job") if k in valkey}
    summary["commandstats"] = {k: [v.calls, v.usec] for k, v in result.commandstats.items()}
    return summary


def sum_stats(deltas: Any) -> dict[str, valkeystats.Stat]:
    total: dict[str, valkeystats.Stat] = {}
    for stats in deltas:
        for name, stat in stats.items():
            then = total.get(name, valkeystats.Stat(0, 0))
            total[name] = valkeystats.Stat(then.calls + stat.calls, then.usec + stat.usec)
    return total


def _pair_ratios(num: list[float | None], den: list[float | None]) -> dict[str, Any]:
    pairs = [a / b for a, b in zip(num, den, strict=False) if a is not None and b]
    return report.spread(pairs)


def floor_ratios(scenarios: dict[str, Any]) -> dict[str, Any]:
    """S3's jobs/s and p95 over the floor's (ratio of the medians, min-max over runs paired in order), S2's p95
    over the floor's, and the floor's own figures; the issue's goals as one target."""
    fl = scenarios["F"]
    f_agg = fl["aggregate"]
    out: dict[str, Any] = {
        "floor_jobs_per_s": f_agg["jobs_per_s"], "floor_p95_ms": f_agg["queue_to_done_ms.p95"],
        "floor_valkey_usec_per_job": f_agg.get("valkey_usec_per_job"),
        "floor_cpu_ms_per_job_system": f_agg.get("cpu_ms_per_job_system"),
    }
    met: list[bool] = []
    texts: list[str] = []

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    if "S3" in scenarios:
        s3 = scenarios["S3"]
        agg = s3["aggregate"]
        rate = ratio(agg["jobs_per_s"]["median"], f_agg["jobs_per_s"]["median"])
        p95 = ratio(agg["queue_to_done_ms.p95"]["median"], f_agg["queue_to_done_ms.p95"]["median"])
        out["S3_jobs_per_s_ratio"] = {**_pair_ratios([r.get("jobs_per_s") for r in s3["runs"]],
                                                     [r.get("jobs_per_s") for r in fl["runs"]]), "median": rate}
        out["S3_p95_ratio"] = {**_pair_ratios([_p95(r) for r in s3["runs"]], [_p95(r) for r in fl["runs"]]),
                               "median": p95}
        out["S3_valkey_usec_ratio"] = ratio(_median(agg, "valkey_usec_per_job"), _median(f_agg, "valkey_usec_per_job"))
        out["S3_cpu_ms_per_job_system"] = agg.get("cpu_ms_per_job_system")
        texts += ["S3 jobs/s >= 0.8x floor", "S3 p95 <= 2x floor", "S3 CPU (gateway+workers+Valkey) <= 1.0 ms/job"]
        cpu = _median(agg, "cpu_ms_per_job_system")
        met += [rate is not None and rate >= 0.8, p95 is not None and p95 <= 2.0, cpu is not None and cpu <= 1.0]
    if "S2" in scenarios:
        s2 = scenarios["S2"]
        p95 = ratio(s2["aggregate"]["queue_to_done_ms.p95"]["median"], f_agg["queue_to_done_ms.p95"]["median"])
        out["S2_p95_ratio"] = {**_pair_ratios([_p95(r) for r in s2["runs"]], [_p95(r) for r in fl["runs"]]),
                               "median": p95}
        texts.append("S2 p95 <= floor's p95")
        met.append(p95 is not None and p95 <= 1.0)
    if "FH" in scenarios:  # a reference beside the floor, not a goal: what two HTTP requests per job cost here
        fh = scenarios["FH"]
        h_agg = fh["aggregate"]
        out["http_floor_jobs_per_s"] = h_agg["jobs_per_s"]
        out["http_floor_p95_ms"] = h_agg["queue_to_done_ms.p95"]
        out["http_floor_cpu_ms_per_job_system"] = h_agg.get("cpu_ms_per_job_system")
        gateway = [r["cpu_ms_per_job_by_role"]["gateway"] for r in fh["runs"]
                   if "gateway" in r.get("cpu_ms_per_job_by_role", {})]
        out["http_floor_gateway_cpu_ms_per_job"] = statistics.median(gateway) if gateway else None
        out["FH_jobs_per_s_ratio"] = {
            **_pair_ratios([r.get("jobs_per_s") for r in fh["runs"]], [r.get("jobs_per_s") for r in fl["runs"]]),
            "median": ratio(h_agg["jobs_per_s"]["median"], f_agg["jobs_per_s"]["median"])}
        if "S3" in scenarios:
            s3 = scenarios["S3"]
            out["S3_to_http_floor_jobs_per_s_ratio"] = {
                **_pair_ratios([r.get("jobs_per_s") for r in s3["runs"]], [r.get("jobs_per_s") for r in fh["runs"]]),
                "median": ratio(s3["aggregate"]["jobs_per_s"]["median"], h_agg["jobs_per_s"]["median"])}
            out["S3_to_http_floor_p95_ratio"] = {
                **_pair_ratios([_p95(r) for r in s3["runs"]], [_p95(r) for r in fh["runs"]]),
                "median": ratio(s3["aggregate"]["queue_to_done_ms.p95"]["median"],
                                h_agg["queue_to_done_ms.p95"]["median"])}
    out["target"] = {"text": "; ".join(texts), "met": all(met) if met else None}
    return out


def _p95(run: dict[str, Any]) -> float | None:
    value = (run.get("queue_to_done_ms") or {}).get("p95")
    return float(value) if isinstance(value, int | float) else None


def fmt_ratios(r: dict[str, Any]) -> str:
    """The ratios row: ``S3 0.34x floor's jobs/s (0.30-0.36), p95 3.4x (...); ...; floor 1,750 jobs/s ...``."""
    parts = []
    if "S3_jobs_per_s_ratio" in r:
        parts.append(f"S3 {report.fmt_spread(r['S3_jobs_per_s_ratio'], 2)}x the floor's jobs/s, p95 "
                     f"{report.fmt_spread(r['S3_p95_ratio'], 2)}x; S3 CPU (gateway+workers+Valkey) "
                     f"{report.fmt_spread(r.get('S3_cpu_ms_per_job_system'), 2)} ms/job")
    if "S2_p95_ratio" in r:
        parts.append(f"S2 p95 {report.fmt_spread(r['S2_p95_ratio'], 2)}x the floor's p95")
    parts.append(f"floor {report.fmt_spread(r['floor_jobs_per_s'])} jobs/s, p95 "
                 f"{report.fmt_spread(r['floor_p95_ms'], 1)} ms, Valkey "
                 f"{report.fmt_spread(r.get('floor_valkey_usec_per_job'))} µs/job, CPU "
                 f"{report.fmt_spread(r.get('floor_cpu_ms_per_job_system'), 2)} ms/job")
    if "http_floor_jobs_per_s" in r:
        gateway = r.get("http_floor_gateway_cpu_ms_per_job")
        text = (f"HTTP floor (bare ASGI under uvicorn, S3's client) {report.fmt_spread(r['http_floor_jobs_per_s'])} "
                f"jobs/s = {report.fmt_spread(r['FH_jobs_per_s_ratio'], 2)}x the floor's, p95 "
                f"{report.fmt_spread(r['http_floor_p95_ms'], 1)} ms, CPU "
                f"{report.fmt_spread(r.get('http_floor_cpu_ms_per_job_system'), 2)} ms/job"
                + (f" (gateway {gateway:.2f})" if gateway is not None else ""))
        if "S3_to_http_floor_jobs_per_s_ratio" in r:
            text += (f"; S3 {report.fmt_spread(r['S3_to_http_floor_jobs_per_s_ratio'], 2)}x its jobs/s, p95 "
                     f"{report.fmt_spread(r['S3_to_http_floor_p95_ratio'], 2)}x")
        parts.append(text)
    return "\n".join(parts)


def log_cost(default: dict[str, Any], warning: dict[str, Any]) -> dict[str, Any]:
    """What the default log level costs against WARNING: the loss of jobs/s (1 - INFO/WARNING, median over the
    alternated run pairs, min-max) and the extra CPU per job of the gateway, the workers and both together."""
    pairs = [1 - a / b for a, b in zip([r.get("jobs_per_s") for r in default["runs"]],
                                       [r.get("jobs_per_s") for r in warning["runs"]], strict=False)
             if a is not None and b]
    loss = report.spread(pairs)
    cpu_d, cpu_w = report.cpu_per_job(default["runs"]), report.cpu_per_job(warning["runs"])
    extra = {role: round(cpu_d.get(role, 0.0) - cpu_w.get(role, 0.0), 3) for role in ("gateway", "workers", "valkey")}
    sys_d, sys_w = _median(default["aggregate"], "cpu_ms_per_job_system"), _median(warning["aggregate"],
                                                                                    "cpu_ms_per_job_system")
    cpu_share = (sys_d / sys_w - 1) if sys_d is not None and sys_w else None
    return {"jobs_per_s_default": default["aggregate"]["jobs_per_s"],
            "jobs_per_s_warning": warning["aggregate"]["jobs_per_s"],
            "jobs_per_s_loss": loss, "extra_cpu_ms_per_job": extra, "system_cpu_extra_share": cpu_share,
            "target": {"text": "the default costs <= 10% of jobs/s against WARNING",
                       "met": loss["median"] is not None and loss["median"] <= 0.10}}


def fmt_log_cost(c: dict[str, Any]) -> str:
    loss = c["jobs_per_s_loss"]
    pct = {k: (None if v is None else v * 100) for k, v in loss.items() if k in ("median", "min", "max")}
    extra = c["extra_cpu_ms_per_job"]
    share = c.get("system_cpu_extra_share")
    return (f"{report.fmt_spread(c['jobs_per_s_default'])} jobs/s at INFO vs "
            f"{report.fmt_spread(c['jobs_per_s_warning'])} at WARNING: costs "
            f"{report.fmt_spread({**pct, 'n': loss.get('n', 0)}, 1)}% of jobs/s\n"
            f"extra CPU ms/job: gateway {extra['gateway']:+.3f}, workers {extra['workers']:+.3f}, valkey "
            f"{extra['valkey']:+.3f}"
            + (f" ({share * 100:+.1f}% of gateway+workers+Valkey)" if share is not None else ""))



def cpu_delta(before: dict[str, float], after: dict[str, float], client_s: float) -> dict[str, float]:
    delta = {role: round(after.get(role, 0.0) - before.get(role, 0.0), 3) for role in after}
    delta["load generator (this process)"] = round(client_s, 3)
    return delta


def dig(section: Any, path: str) -> float | None:
    for part in path.split("."):
        section = section.get(part) if isinstance(section, dict) else None
    return float(section) if isinstance(section, int | float) else None


def _median(agg: dict[str, Any], path: str) -> float | None:
    value = agg.get(path, {}).get("median")
    return float(value) if value is not None else None


def s2_target(agg: dict[str, Any]) -> dict[str, Any]:
    p95 = _median(agg, "queue_to_done_ms.p95")
    return {"text": "p95 <= 20 ms", "met": p95 is not None and p95 <= 20.0}


def s3_target(agg: dict[str, Any]) -> dict[str, Any]:
    p95, rate = _median(agg, "queue_to_done_ms.p95"), _median(agg, "jobs_per_s")
    met = p95 is not None and rate is not None and p95 <= 60.0 and rate >= 1000.0
    return {"text": ">= 1,000 jobs/s and p95 <= 60 ms", "met": met}


def gateway_target(rate: float | None) -> dict[str, Any]:
    """G is reported, no longer held to a goal (issue 41): what is deployed is the Lambda, one request per sandbox
    at a time, whose figures and goals are GL's (bench.lambda_gateway). ``met`` None reads n/a."""
    return {"text": "none: reported only (the deployed gateway is the Lambda: see GL)", "met": None}


def core_target(per_process: float | None) -> dict[str, Any]:
    return {"text": ">= 3,000 jobs/s per worker process", "met": per_process is not None and per_process >= 3000.0}
