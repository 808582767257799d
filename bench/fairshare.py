"""FS: fair share inside a lane (G10), beside first come, first served, in the same run.

The queue protocol itself (the real scripts on a real Valkey, :class:`inferq.queue.protocol.Queue`), driven by a
worker simulated in virtual time: ``window`` slots; a free slot reads one job (the worker's read, with its
admission), starts it and holds it for the job's service time, its estimated work over a fixed decode rate
(:data:`TOKENS_PER_S`), then finishes it. Arrivals are enqueued when the virtual clock reaches them. So every figure
is what the scripts decided, in job times rather than in the machine's noise, and the same arrivals are served once
with ``INFERQ_FAIR_SHARE=true`` and once with ``false`` (a queue each, one Valkey):

- **one job behind a backlog**: a heavy tenant submits :data:`BACKLOG` equal jobs (256 tokens each), then a light
  tenant submits one; one worker, window 1. The light job's queue wait, in job times.
- **a 10x backlog**: the heavy tenant submits ten times the light tenant's jobs at once; the light tenant submits
  one job every job time meanwhile (a quarter of one worker of window 4: below its fair half, so its jobs should
  not queue); one worker, window 4. The light tenant's p50 and p95 queue wait, in job times.
- **weights 1:2:4**: three tenants (``INFERQ_TENANT_WEIGHTS=a:1,b:2,c:4``) submit equal numbers of jobs of mixed
  sizes (64 to 1,024 tokens, seeded) at once; one worker, window 4. Each tenant's share of the GPU time (the service
  time of the jobs it was given) until the first tenant's jobs have all been taken, beside its weight's share. Goal:
  within +-10% of the weight's share.
- **Valkey cost per job**: :mod:`bench.instrcost`'s phases (enqueue, start, finish, the gateway's read; 1,000 jobs
  enqueued 100 per call, then read 100 per read: with fair share they wait for admission and are admitted as the
  worker reads, fair share's dearest path) in server instructions under callgrind, fair share on and off on the same
  server. Goal (PLAN.md): on <= 1.2x off.

``python -m bench --only FS`` (``run(report, quick)``), or ``python -m bench.fairshare [--quick]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
import statistics
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.fairshare import estimated_work
from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.protocol import Queue

from . import instrcost, protocost
from .report import part_main

TOKENS_PER_S = 50.0
"""The decode rate a job's service time is reckoned at (a job of 256 tokens: about 5 s)."""
BACKLOG = 5000
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 4.0}
SIZES = (64, 128, 256, 512, 1024)
RESULT = {"status_code": 200, "body": {}}
MODES = {"fair share": True, "first come, first served": False}


def request(max_tokens: int = 256) -> JobRequest:
    return JobRequest(body={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens})


JOB_S = estimated_work(request().body) / TOKENS_PER_S
"""One job time: the service time of the equal jobs of the backlog scenarios."""


@dataclass
class Arrival:
    at: float
    tenant: str
    request: JobRequest


@dataclass
class Served:
    """What a simulated worker did with a scenario's arrivals: per job, its tenant, its queue wait and service time
    (virtual seconds), in the order the jobs started."""

    jobs: list[tuple[str, float, float]] = field(default_factory=list)

    def waits(self, tenant: str) -> list[float]:
        return [wait for who, wait, _ in self.jobs if who == tenant]


async def serve(q: Queue, arrivals: list[Arrival], window: int,
                done: Callable[[Served, Counter[str]], bool]) -> Served:
    """Run ``arrivals`` (sorted by time) through ``q`` with one simulated worker of ``window`` slots, until ``done``
    (given what was served and each tenant's jobs not started yet) or nothing is left."""
    served, left = Served(), Counter(a.tenant for a in arrivals)
    submitted: dict[str, tuple[float, float]] = {}  # job id -> (arrived at, service time)
    slots = [0.0] * window
    nxt = 0
    while slots:
        now = heapq.heappop(slots)
        while nxt < len(arrivals) and arrivals[nxt].at <= now:  # a tenant's arrivals due now: one call
            first = arrivals[nxt]
            run = [first]
            while (nxt + len(run) < len(arrivals) and len(run) < 32 and arrivals[nxt + len(run)].at <= now
                   and arrivals[nxt + len(run)].tenant == first.tenant):
                run.append(arrivals[nxt + len(run)])
            jobs = await q.enqueue_many(first.tenant, [a.request for a in run])
            for (job, _), a in zip(jobs, run, strict=True):
                submitted[job.id] = (a.at, estimated_work(a.request.body) / TOKENS_PER_S)
            nxt += len(run)
        got, _ = await q.read("fs-worker", 1)
        if not got:
            if nxt < len(arrivals):
                heapq.heappush(slots, arrivals[nxt].at)  # idle until the next arrival
            continue
        (d,) = got
        arrived, service = submitted[d.job.id]
        served.jobs.append((d.job.tenant, now - arrived, service))
        left[d.job.tenant] -= 1
        await q.finish(d, JobStatus.SUCCEEDED, result=RESULT)
        if done(served, left):
            break
        heapq.heappush(slots, now + service)
    return served


async def _both(valkey: ValkeyProcess, arrivals: list[Arrival], window: int,
                done: Callable[[Served, Counter[str]], bool], **settings: Any) -> dict[str, Served]:
    out = {}
    for mode, fair in MODES.items():
        q = Queue.connect(Settings(redis_url=valkey.url, queue="bench-fs-" + uuid.uuid4().hex[:8], max_queue_depth=0,
                                   fair_share=fair, **settings))
        try:
            await q.ensure_groups()
            out[mode] = await serve(q, arrivals, window, done)
        finally:
            await q.redis.delete(*await q.redis.keys(q.keys.prefix + "*") or ["-"])
            await q.close()
    return out


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def behind_a_backlog(valkey: ValkeyProcess, backlog: int) -> dict[str, Any]:
    arrivals = [Arrival(0.0, "heavy", request()) for _ in range(backlog)] + [Arrival(0.0, "light", request())]
    served = await _both(valkey, arrivals, 1, lambda s, left: left["light"] == 0)
    return {"backlog": backlog, "light_wait_job_times": {m: round(s.waits("light")[0] / JOB_S, 2)
                                                         for m, s in served.items()}}


async def ten_times_backlog(valkey: ValkeyProcess, light: int) -> dict[str, Any]:
    arrivals = [Arrival(0.0, "heavy", request()) for _ in range(10 * light)]
    arrivals += [Arrival(JOB_S * (i + 1), "light", request()) for i in range(light)]
    arrivals.sort(key=lambda a: a.at)
    served = await _both(valkey, arrivals, 4, lambda s, left: left["light"] == 0)
    out: dict[str, Any] = {"light_jobs": light, "heavy_jobs": 10 * light, "window": 4}
    for mode, s in served.items():
        waits = [w / JOB_S for w in s.waits("light")]
        out[mode] = {"p50_job_times": round(statistics.median(waits), 2), "p95_job_times": round(_p(waits, 0.95), 2)}
    return out


async def weighted(valkey: ValkeyProcess, each: int) -> dict[str, Any]:
    rng = random.Random(46)
    arrivals = [Arrival(0.0, t, request(rng.choice(SIZES))) for _ in range(each) for t in WEIGHTS]
    served = await _both(valkey, arrivals, 4, lambda s, left: min(left.values()) == 0, tenant_weights=WEIGHTS)
    out: dict[str, Any] = {"jobs_each": each, "weights": WEIGHTS}
    total_weight = sum(WEIGHTS.values())
    for mode, s in served.items():
        gpu: dict[str, float] = dict.fromkeys(WEIGHTS, 0.0)
        for tenant, _, service in s.jobs:
            gpu[tenant] += service
        shares = {t: gpu[t] / sum(gpu.values()) for t in WEIGHTS}
        out[mode] = {"jobs_taken": len(s.jobs), "gpu_share": {t: round(v, 4) for t, v in shares.items()},
                     "off_weight": {t: round(shares[t] / (w / total_weight) - 1, 4) for t, w in WEIGHTS.items()}}
    return out


async def _instructions(server: instrcost.CallgrindValkey, n: int) -> dict[str, dict[str, float]]:
    phase = instrcost.phase_counter(server)
    out = {}
    for mode, fair in MODES.items():
        # a server under valgrind answers a batch of scripts slowly on a loaded machine: a long socket timeout
        q = Queue.connect(Settings(redis_url=server.url, queue="bench-fs-instr-" + ("fair" if fair else "fcfs"),
                                   max_queue_depth=0, fair_share=fair, redis_timeout_s=120.0))
        try:
            await q.ensure_groups()
            await protocost._inferq_once(q, min(n, 200))  # warm: scripts loaded, the first allocations made
            out[mode] = {k: round(v / 1000, 1) for k, v in (await protocost._inferq_once(q, n, phase)).items()}
        finally:
            await q.close()
    return out


def valkey_cost(n: int) -> dict[str, Any]:
    why = instrcost.available()
    if why:
        return {"skipped": why}
    with tempfile.TemporaryDirectory() as tmp:
        server = instrcost.CallgrindValkey(Path(tmp), appendfsync=None)
        server.start(timeout=120)
        try:
            counted = asyncio.run(_instructions(server, n))
        finally:
            server.stop()
    on, off = counted["fair share"], counted["first come, first served"]
    return {"jobs": n, "kinstructions_per_job": counted, "ratio": round(on["total"] / off["total"], 3)}


def run(report: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="inferq-bench-fs-") as tmp:
        valkey = ValkeyProcess(Path(tmp), appendfsync=None)
        valkey.start()
        try:
            report["behind_a_backlog"] = asyncio.run(behind_a_backlog(valkey, 1000 if quick else BACKLOG))
            report["ten_times_backlog"] = asyncio.run(ten_times_backlog(valkey, 30 if quick else 100))
            report["weighted"] = asyncio.run(weighted(valkey, 150 if quick else 400))
        finally:
            valkey.stop()
    report["valkey_cost"] = valkey_cost(300 if quick else 1000)
    return report


def target(part: dict[str, Any]) -> dict[str, Any]:
    fair = (part.get("weighted") or {}).get("fair share") or {}
    worst = max((abs(v) for v in (fair.get("off_weight") or {}).values()), default=None)
    ratio = (part.get("valkey_cost") or {}).get("ratio")
    met = None if worst is None else worst <= 0.10 and (ratio is None or ratio <= 1.2)
    return {"text": "GPU shares within +-10% of weights 1:2:4; Valkey instructions per job with fair share <= 1.2x "
                    "first come, first served", "met": met}


def render(part: dict[str, Any]) -> str:
    lines = []
    one = part.get("behind_a_backlog") or {}
    if one:
        w = one["light_wait_job_times"]
        lines.append(f"one job behind another tenant's {one['backlog']}: waits {w['fair share']:.1f} job times with "
                     f"fair share, {w['first come, first served']:.0f} first come, first served")
    ten = part.get("ten_times_backlog") or {}
    if ten:
        f, c = ten["fair share"], ten["first come, first served"]
        lines.append(f"light tenant beside a 10x backlog ({ten['light_jobs']} vs {ten['heavy_jobs']} jobs, window 4): "
                     f"p95 wait {f['p95_job_times']:.1f} job times with fair share, {c['p95_job_times']:.0f} first "
                     f"come, first served (p50 {f['p50_job_times']:.1f} / {c['p50_job_times']:.0f})")
    weights = part.get("weighted") or {}
    if weights:
        f, c = weights["fair share"]["gpu_share"], weights["first come, first served"]["gpu_share"]
        lines.append("GPU shares, weights 1:2:4 (due 0.143/0.286/0.571): fair share "
                     + "/".join(f"{f[t]:.3f}" for t in WEIGHTS) + ", first come, first served "
                     + "/".join(f"{c[t]:.3f}" for t in WEIGHTS))
    cost = part.get("valkey_cost") or {}
    if "skipped" in cost:
        lines.append(f"Valkey cost: not measured ({cost['skipped']})")
    elif cost:
        k = cost["kinstructions_per_job"]
        lines.append(f"Valkey instructions per job (callgrind, a backlog): fair share "
                     f"{k['fair share']['total']:.1f} k, first come, first served "
                     f"{k['first come, first served']['total']:.1f} k: {cost['ratio']:.3f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(part_main("python -m bench.fairshare", __doc__, run, "smoke run: smaller backlogs"))
