"""The queue protocol's own Valkey cost per job, on an otherwise idle server (part of K).

The HTTP scenarios' ``Valkey µs/job`` is measured while the gateway, the workers and the load generator share the
machine's cores with Valkey: a command's time in ``INFO commandstats`` is wall time, so every time the OS runs
another process in the middle of a script, that script looks slower. On 2 shared cores this inflates the figure
two to four times, and by a different factor every run. This measures the same transitions with nothing else
running: one client, pipelined (100 jobs per round trip), on K's own Valkey (AOF everysec), ``CONFIG RESETSTAT``
around each phase, so each transition's cost is read alone:

- enqueue (``enqueue.lua``), start (``XREADGROUP``, ``start.lua`` and the worker's ``HGETALL`` of the record),
  finish (``finish.lua``), and the gateway's read of a finished job (``HMGET`` of the record without its body, as
  ``GET /v1/jobs/{id}`` does);
- the floor's commands for the same jobs (bench F: ``XADD``, ``XREADGROUP``, ``XACK``, ``RPUSH`` of the result,
  the client's ``LPOP``).

A shard's ceiling is what these add up to: 1e6 / (µs per job) jobs/s of Valkey's one thread, before networking.
The same phases are also counted in server instructions under callgrind (:mod:`bench.instrcost`), which does not
move with the machine's load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from inferq.jobs import JobRequest, JobStatus
from inferq.queue import Queue

BATCH = 100
FLOOR_COMMANDS = frozenset(("xadd", "xreadgroup", "xack", "rpush", "lpop"))
BODY = {"model": "m", "prompt": "hello world " * 8, "max_tokens": 16}
RESULT = {"status_code": 200, "body": {"choices": [{"text": "x" * 64}]}}


async def _usec(q: Queue) -> dict[str, float]:
    stats = await q.redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): float(v["usec"]) for name, v in stats.items()
            if not name.startswith("cmdstat_config") and not name.startswith("cmdstat_info")}


Phase = Callable[[Queue, Callable[[], Awaitable[Any]], frozenset[str]], Awaitable[float]]
"""Measures one phase: (queue, the phase's work, the commands the client sends itself) -> its cost."""


async def _phase(q: Queue, work: Callable[[], Awaitable[Any]], sent: frozenset[str] = frozenset()) -> float:
    """Server command time of ``work``, µs: its scripts (with the commands they call) plus the commands the client
    sends itself, named in ``sent``. A command a script calls is also counted under its own name in
    ``INFO commandstats``; adding every ``xadd`` or ``hmget`` would count those twice."""
    await q.redis.config_resetstat()
    await work()
    usec = await _usec(q)
    return sum(v for k, v in usec.items() if k.startswith("eval") or k in sent)


async def _inferq_once(q: Queue, n: int, phase: Phase = _phase) -> dict[str, float]:
    deliveries: list[Any] = []
    jobs: list[str] = []

    async def enqueue() -> None:
        for _ in range(n // BATCH):
            jobs.extend(j.id for j, _ in await q.enqueue_many("bench", [JobRequest(body=dict(BODY))] * BATCH))

    async def start() -> None:
        while len(deliveries) < len(jobs):
            got, _ = await q.read("bench-worker", BATCH)
            if not got:
                break
            deliveries.extend(got)

    async def finish() -> None:
        for i in range(0, len(deliveries), BATCH):
            await q.finish_many([(d, JobStatus.SUCCEEDED, RESULT, None) for d in deliveries[i:i + BATCH]])

    async def read() -> None:
        from inferq.jobs import RECORD_FIELDS_BUT_BODY

        for i in range(0, len(jobs), BATCH):
            pipe = q.redis.pipeline(transaction=False)
            for job_id in jobs[i:i + BATCH]:
                pipe.hmget(q.keys.job(job_id), RECORD_FIELDS_BUT_BODY)
            await pipe.execute()

    # a worker reads each started job's record itself (HGETALL piped after its start): part of start
    out = {name: await phase(q, work, frozenset(sent)) / n for name, work, sent in
           (("enqueue", enqueue, ()), ("start", start, ("xreadgroup", "hgetall")), ("finish", finish, ()),
            ("read", read, ("hmget",)))}
    out["total"] = sum(out.values())
    return out


async def _floor_once(q: Queue, n: int, phase: Phase = _phase) -> float:
    r, stream, group = q.redis, f"bench:floor:{time.monotonic_ns()}", "g"
    await r.xgroup_create(stream, group, id="0", mkstream=True)

    async def work() -> None:
        for _ in range(n // BATCH):
            pipe = r.pipeline(transaction=False)
            for i in range(BATCH):
                pipe.xadd(stream, {"job": f"j{i}", "body": "x"})
            await pipe.execute()
            [[_, entries]] = await r.xreadgroup(group, "c", {stream: ">"}, count=BATCH)
            pipe = r.pipeline(transaction=False)
            for entry_id, fields in entries:
                pipe.xack(stream, group, entry_id)
                pipe.rpush(f"{stream}:r:{fields['job']}", "done")
            await pipe.execute()
            pipe = r.pipeline(transaction=False)
            for i in range(BATCH):
                pipe.lpop(f"{stream}:r:j{i}")
            await pipe.execute()

    usec = await phase(q, work, FLOOR_COMMANDS) / n
    await r.delete(stream)
    return usec


async def measure(q: Queue, n: int, repeats: int) -> dict[str, Any]:
    runs = [await _inferq_once(q, n) for _ in range(repeats)]
    floors = [await _floor_once(q, n) for _ in range(repeats)]
    out: dict[str, Any] = {
        "method": f"{n} jobs x {repeats}, one client, {BATCH} per round trip, nothing else running; "
                  "INFO commandstats per phase (scripts with their inner commands, once)",
        "usec_per_job": {k: {"median": round(statistics.median(r[k] for r in runs), 1),
                             "min": round(min(r[k] for r in runs), 1), "max": round(max(r[k] for r in runs), 1)}
                         for k in runs[0]},
        "floor_usec_per_job": {"median": round(statistics.median(floors), 1), "min": round(min(floors), 1),
                               "max": round(max(floors), 1)},
    }
    out["ratio_to_floor"] = round(out["usec_per_job"]["total"]["median"] / out["floor_usec_per_job"]["median"], 2)
    return out


def render(cost: dict[str, Any]) -> str:
    u = cost["usec_per_job"]
    parts = ", ".join(f"{k} {u[k]['median']:.1f}" for k in ("enqueue", "start", "finish", "read"))
    return (f"protocol cost on an idle Valkey: {u['total']['median']:.1f} µs/job ({u['total']['min']:.1f}-"
            f"{u['total']['max']:.1f}; {parts}) vs the floor's commands {cost['floor_usec_per_job']['median']:.1f} "
            f"µs/job: {cost['ratio_to_floor']:.1f}x")
