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

import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.protocol import Queue
from inferq.usage.spend import Spend

BATCH = 100
FLOOR_COMMANDS = frozenset(("xadd", "xreadgroup", "xack", "rpush", "lpop"))
BODY = {"model": "m", "prompt": "hello world " * 8, "max_tokens": 16}
RESULT = {"status_code": 200, "body": {"choices": [{"text": "x" * 64}], "usage": {"prompt_tokens": 24,
                                                                          "completion_tokens": 16}}}
SPEND = Spend(run_ms=5, gpu_ms=5, prompt_tokens=24, completion_tokens=16)
"""What a worker reports with each finish (its usage; counted unless metering is off)."""


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
            await q.finish_many([(d, JobStatus.SUCCEEDED, RESULT, None, SPEND) for d in deliveries[i:i + BATCH]])

    async def read() -> None:
        from inferq.queue.jobs import RECORD_FIELDS_BUT_BODY

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


CONTRACT_COMMANDS = frozenset(("xadd", "hset", "hincrby", "xreadgroup", "hgetall", "xack", "xdel", "expire", "rpush",
                               "hmget"))


async def _contract_once(q: Queue, n: int, phase: Phase = _phase) -> dict[str, float]:
    """The writes and reads the contract's keys need for each job, sent as plain commands (pipelined as inferq's
    are), with no script, no check and no atomicity: a lower bound for any protocol that keeps the keys
    ``docs/data-model.md`` names.

    - enqueue: the stream entry (``XADD``), the job record with what the job object and the worker read (``HSET``:
      inferq's fields and values, less its own bookkeeping), the ``enqueued`` and ``unfinished`` counters;
    - start: ``XREADGROUP``, the record's ``status`` and ``started_at`` (the job object shows both), and the
      worker's read of the record (``HGETALL``);
    - finish: ``XACK`` and ``XDEL`` (one entry per live attempt), the record's ``status``, ``finished_at`` and
      ``result``, the ``unfinished`` and ``succeeded`` counters, the terminal event (capped ``XADD``), the record's
      result TTL, the wakeup list (``RPUSH``, and its own expiry);
    - read: the gateway's ``HMGET`` of the finished record without its body, as inferq's read.

    Everything inferq adds on top (lease tokens, owner and resend checks, delivery counts, the tenant count, latency
    sums) is left out, so the gap between this and inferq's own figure is what its scripts and guarantees cost."""
    from inferq.queue.jobs import RECORD_FIELDS_BUT_BODY
    from inferq.queue.records import record_fields

    r, keys, settings = q.redis, q.keys, q.settings
    now = int(time.time() * 1000)
    # the record's fields as inferq's enqueue writes them, less its own bookkeeping (entry, deliveries, digest)
    extra = record_fields(JobRequest(body=dict(BODY)))
    record = {"tenant": "bench", "status": "queued", "attempts": "1", "created_at": str(now),
              **{str(extra[i]): str(extra[i + 1]) for i in range(0, len(extra), 2)}}
    tag = f"{keys.prefix}contract:{time.monotonic_ns()}"  # inside the queue's hash tag, as the queue's keys are
    stream, stats, events = tag, f"{tag}:stats", f"{tag}:events"  # its own counters: the queue's stay right
    await r.xgroup_create(stream, "g", id="0", mkstream=True)
    jobs = [f"contract-{time.monotonic_ns()}-{i}" for i in range(n)]
    entries: list[tuple[str, str]] = []
    result = json.dumps(RESULT)

    async def batches(each: Callable[[Any, int], None], items: int) -> None:
        for start in range(0, items, BATCH):
            pipe = r.pipeline(transaction=False)
            for i in range(start, min(start + BATCH, items)):
                each(pipe, i)
            await pipe.execute()

    def enqueue_one(pipe: Any, i: int) -> None:
        pipe.xadd(stream, {"job": jobs[i], "attempt": "1"})
        pipe.hset(keys.job(jobs[i]), mapping={**record, "id": jobs[i]})
        pipe.hincrby(stats, "enqueued", 1)
        pipe.hincrby(stats, "unfinished", 1)

    async def enqueue() -> None:
        await batches(enqueue_one, n)

    async def start() -> None:
        while len(entries) < n:
            got = await r.xreadgroup("g", "c", {stream: ">"}, count=BATCH)
            if not got:
                break
            fresh = [(entry_id, fields["job"]) for entry_id, fields in got[0][1]]
            entries.extend(fresh)
            pipe = r.pipeline(transaction=False)
            for _, job_id in fresh:
                pipe.hset(keys.job(job_id), mapping={"status": "running", "started_at": "1"})
                pipe.hgetall(keys.job(job_id))
            await pipe.execute()

    def finish_one(pipe: Any, i: int) -> None:
        entry_id, job_id = entries[i]
        pipe.xack(stream, "g", entry_id)
        pipe.xdel(stream, entry_id)
        pipe.hset(keys.job(job_id), mapping={"status": "succeeded", "finished_at": "2", "result": result})
        pipe.hincrby(stats, "unfinished", -1)
        pipe.hincrby(stats, "succeeded", 1)
        pipe.xadd(events, {"job": job_id, "status": "succeeded", "tenant": "bench", "webhook": "0"},
                  maxlen=settings.events_maxlen, approximate=True)
        pipe.expire(keys.job(job_id), settings.result_ttl_s)
        pipe.rpush(keys.done(job_id), "succeeded")
        pipe.expire(keys.done(job_id), 300)

    async def finish() -> None:
        await batches(finish_one, len(entries))

    async def read() -> None:
        await batches(lambda pipe, i: pipe.hmget(keys.job(jobs[i]), RECORD_FIELDS_BUT_BODY), n)

    out = {name: await phase(q, work, CONTRACT_COMMANDS) / n
           for name, work in (("enqueue", enqueue), ("start", start), ("finish", finish), ("read", read))}
    out["total"] = sum(out.values())
    await r.delete(stream, stats, events, *(keys.job(j) for j in jobs), *(keys.done(j) for j in jobs))
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


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


async def measure(q: Queue, n: int, repeats: int) -> dict[str, Any]:
    runs = [await _inferq_once(q, n) for _ in range(repeats)]
    floors = [await _floor_once(q, n) for _ in range(repeats)]
    contract = [await _contract_once(q, n) for _ in range(repeats)]  # after the floor, as in instrcost
    out: dict[str, Any] = {
        "method": f"{n} jobs x {repeats}, one client, {BATCH} per round trip, nothing else running; "
                  "INFO commandstats per phase (scripts with their inner commands, once)",
        "usec_per_job": {k: _spread([r[k] for r in runs]) for k in runs[0]},
        "contract_usec_per_job": {k: _spread([r[k] for r in contract]) for k in contract[0]},
        "floor_usec_per_job": _spread(floors),
    }
    floor = out["floor_usec_per_job"]["median"]
    out["ratio_to_floor"] = round(out["usec_per_job"]["total"]["median"] / floor, 2)
    out["contract_ratio_to_floor"] = round(out["contract_usec_per_job"]["total"]["median"] / floor, 2)
    return out


def render(cost: dict[str, Any]) -> str:
    u, c = cost["usec_per_job"], cost["contract_usec_per_job"]
    parts = ", ".join(f"{k} {u[k]['median']:.1f}" for k in ("enqueue", "start", "finish", "read"))
    return (f"protocol cost on an idle Valkey: {u['total']['median']:.1f} µs/job ({u['total']['min']:.1f}-"
            f"{u['total']['max']:.1f}; {parts}) vs the floor's commands {cost['floor_usec_per_job']['median']:.1f} "
            f"µs/job: {cost['ratio_to_floor']:.1f}x; the contract's keys written with plain commands, no script "
            f"(a lower bound): {c['total']['median']:.1f} µs/job, {cost['contract_ratio_to_floor']:.1f}x")
