"""The simulator checked against the real loop: one short bursty trace replayed on ``inferq up`` (the real
scaler handler, moto's ECS service, the emulator's ECS agent with an emulated GPU boot, real ``gpu_worker``
processes with the mock backend, each job's service time given by ``body.mock.latency_ms``) and through
:class:`bench.sim_fleet.Sim` with the same policy settings. Both report worker-seconds (GPU time: a task counts
from the scaler's request, boot included, to its stop) and the p95 queue wait (enqueue -> first attempt's start).

Real side, measured from outside every 0.25 s: the scaler's desired count (``inferq:{Q}:scale``) and the live
workers (fresh heartbeats); GPU time is the integral of the larger of the two (a task is paid for from the
request, and a surplus one still finishing a job is paid for until it stops). Waits come from the job records.
Sim side: boot = ``INFERQ_EMULATOR_BOOT_S`` + :data:`PROCESS_START_S` (the worker process's own start here), the
scaler evaluated every ``INFERQ_SCALER_INTERVAL_S`` plus the gateway's wake.

Run: ``python -m bench.sim_realloop [--quick]`` (``make bench`` runs it as scenario R). Agreement: worker-seconds
within :data:`TOLERANCE` of each other, p95 waits within the tolerance or :data:`WAIT_SLACK_S`, whichever is
larger (the real loop adds HTTP, a scaler tick's jitter and process starts that vary).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from inferq.queue.keys import Keys
from inferq.scaling.policy import ScalePolicy

from .sim_fleet import Scenario, Sim, Trace, percentile
from .sim_strategies import InferqPolicy
from .stack import Stack

TOLERANCE = 0.25
WAIT_SLACK_S = 3.0
PROCESS_START_S = 1.5
"""A worker process's own start on this machine (imports, Redis, first heartbeat): what the emulated boot adds."""


@dataclass(frozen=True)
class LoopScenario:
    seed: int = 41
    span_s: float = 150.0
    base_per_s: float = 0.15
    bursts: tuple[tuple[float, int], ...] = ((20.0, 40), (95.0, 60))
    burst_spread_s: float = 8.0
    service_mean_s: float = 2.0
    service_sigma: float = 0.5
    window: int = 4
    boot_s: float = 8.0  # INFERQ_EMULATOR_BOOT_S
    scale_max: int = 4
    cooldown_s: int = 10
    zero_after_s: int = 20
    interval_s: float = 1.0

    def quick(self) -> LoopScenario:
        return LoopScenario(span_s=80.0, bursts=((15.0, 30),), base_per_s=0.1)

    def env(self) -> dict[str, str]:
        return {
            "INFERQ_SCALE_MIN": "0", "INFERQ_SCALE_MAX": str(self.scale_max), "INFERQ_WINDOW": str(self.window),
            "INFERQ_SCALE_DOWN_COOLDOWN_S": str(self.cooldown_s),
            "INFERQ_SCALE_TO_ZERO_AFTER_S": str(self.zero_after_s),
            "INFERQ_SCALER_INTERVAL_S": f"{self.interval_s:g}",
            "INFERQ_EMULATOR_BOOT_S": f"{self.boot_s:g}",
            "INFERQ_SCALE_BOOT_S": f"{self.boot_s + PROCESS_START_S:g}",
            "INFERQ_DRAIN_S": "2",
        }

    def policy(self) -> ScalePolicy:
        return ScalePolicy(min=0, max=self.scale_max, target_per_worker=self.window, cooldown_s=self.cooldown_s,
                           zero_after_s=self.zero_after_s, boot_s=self.boot_s + PROCESS_START_S)


def make_loop_trace(sc: LoopScenario) -> Trace:
    rng = random.Random(sc.seed)
    times, t = [], 0.0
    while True:
        t += rng.expovariate(sc.base_per_s)
        if t >= sc.span_s:
            break
        times.append(t)
    for start, count in sc.bursts:
        times.extend(start + rng.uniform(0.0, sc.burst_spread_s) for _ in range(count))
    times.sort()
    mu = math.log(sc.service_mean_s) - sc.service_sigma**2 / 2
    service = [round(rng.lognormvariate(mu, sc.service_sigma), 3) for _ in times]
    return Trace(times, service, list(sc.bursts))


def predict(sc: LoopScenario, trace: Trace) -> dict[str, Any]:
    """The simulator's figures for the trace."""
    scenario = Scenario(window=sc.window, boot_s=sc.boot_s + PROCESS_START_S, day_s=sc.span_s)
    sim = Sim(trace, scenario)
    result = sim.run(InferqPolicy(sc.policy(), every_s=sc.interval_s, wake_gap_s=5.0, wake_latency_s=0.2))
    return {"worker_s": round(result["gpu_minutes"] * 60.0, 1), "p95_wait_s": round(result["p95_wait_s"], 2),
            "p50_wait_s": round(result["p50_wait_s"], 2), "jobs": result["jobs"],
            "scale_changes": result["scale_changes"]}


async def measure(sc: LoopScenario, trace: Trace, log_dir: Path) -> dict[str, Any]:
    """Replay the trace on ``inferq up`` and measure it."""
    with Stack(workers=0, window=sc.window, env=sc.env(), log_dir=log_dir, name="realloop") as st:
        keys = Keys("default")
        r = redis.Redis.from_url(st.redis_url, decode_responses=True)
        samples: list[tuple[float, int]] = []
        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():
                now_ms = time.time() * 1000
                desired = int(r.hget(keys.scale, "desired") or 0)
                beats = r.hgetall(keys.workers)
                live = sum(1 for b in beats.values() if now_ms - int(b.split(" ", 1)[0]) <= 5000)
                samples.append((time.monotonic(), max(desired, live)))
                await asyncio.sleep(0.25)

        sampler = asyncio.create_task(sample())
        ids: list[str] = []
        async with httpx.AsyncClient(base_url=st.url, headers=st.headers, timeout=30) as client:
            t0 = time.monotonic()
            for at, service in zip(trace.arrivals, trace.service, strict=True):
                delay = t0 + at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                body = {"body": {"model": "mock", "messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
                                 "mock": {"latency_ms": int(service * 1000)}}}
                reply = await client.post("/v1/jobs", json=body)
                reply.raise_for_status()
                ids.append(reply.json()["id"])
            jobs = []
            for job_id in ids:
                while True:
                    job = (await client.get(f"/v1/jobs/{job_id}", params={"wait": "20"})).json()
                    if job["status"] in ("succeeded", "failed", "cancelled", "expired"):
                        jobs.append(job)
                        break
            # until the fleet is back at zero: its idle tail is part of what it costs
            deadline = time.monotonic() + sc.zero_after_s + sc.cooldown_s + 30
            while time.monotonic() < deadline and (samples[-1][1] if samples else 1) > 0:
                await asyncio.sleep(0.5)
        done.set()
        await sampler
        r.close()
    worker_s = sum((b[0] - a[0]) * a[1] for a, b in itertools.pairwise(samples))
    waits = sorted(j["started_at"] - j["created_at"] for j in jobs if j.get("started_at"))
    return {"worker_s": round(worker_s, 1), "p95_wait_s": round(percentile(waits, 95), 2),
            "p50_wait_s": round(percentile(waits, 50), 2), "jobs": len(waits),
            "failed": sum(1 for j in jobs if j["status"] != "succeeded")}


def agree(real: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    work = abs(real["worker_s"] - sim["worker_s"]) / max(sim["worker_s"], 1e-9)
    wait_gap = abs(real["p95_wait_s"] - sim["p95_wait_s"])
    wait_ok = wait_gap <= max(TOLERANCE * sim["p95_wait_s"], WAIT_SLACK_S)
    return {"worker_s_gap": round(work, 3), "p95_wait_gap_s": round(wait_gap, 2),
            "agree": work <= TOLERANCE and wait_ok and real["jobs"] == sim["jobs"]}


def run(report: dict[str, Any], out_dir: Path | None = None, quick: bool = False) -> dict[str, Any]:
    sc = LoopScenario().quick() if quick else LoopScenario()
    trace = make_loop_trace(sc)
    sim = predict(sc, trace)
    log_dir = (out_dir or Path("bench/out")) / "logs"
    real = asyncio.run(measure(sc, trace, log_dir))
    section = {"jobs": len(trace.arrivals), "span_s": sc.span_s, "boot_s": sc.boot_s, "settings": sc.env(),
               "real": real, "sim": sim, **agree(real, sim), "tolerance": TOLERANCE, "wait_slack_s": WAIT_SLACK_S}
    report["realloop"] = section
    print(render(section))
    return section


def render(section: dict[str, Any]) -> str:
    real, sim = section["real"], section["sim"]
    return "\n".join([
        f"real loop vs simulator: {section['jobs']} jobs over {section['span_s']:.0f} s, emulated boot "
        f"{section['boot_s']:.0f} s (+ process start), mock service times",
        f"{'':12} {'worker-s':>9} {'p50 wait':>9} {'p95 wait':>9} {'jobs':>6}",
        f"{'inferq up':12} {real['worker_s']:9.1f} {real['p50_wait_s']:8.2f}s {real['p95_wait_s']:8.2f}s "
        f"{real['jobs']:6d}",
        f"{'simulator':12} {sim['worker_s']:9.1f} {sim['p50_wait_s']:8.2f}s {sim['p95_wait_s']:8.2f}s {sim['jobs']:6d}",
        f"worker-seconds differ by {section['worker_s_gap']:.0%}, p95 by {section['p95_wait_gap_s']:.1f} s "
        f"(tolerance {section['tolerance']:.0%} / {section['wait_slack_s']:g} s): "
        f"{'agree' if section['agree'] else 'DISAGREE'}",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args()
    report: dict[str, Any] = {}
    run(report, args.out, quick=args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "realloop.json").write_text(json.dumps(report["realloop"], indent=2))


if __name__ == "__main__":
    main()
