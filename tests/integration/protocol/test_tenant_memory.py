"""The most cache memory one tenant can hold (G11), computed from the deployed defaults and the sizes of the records
a real Valkey holds (``MEMORY USAGE``), and held to what docs/operations.md states ("What one tenant can hold"):
this fails when a default grows, when a record grows, and when the charge of an ended job (inferq/queue/holds.py)
falls below what its record costs.

The bound, per tenant and queue (model): ``Q + D x R + S``, where

- ``Q`` is ``INFERQ_TENANT_MAX_RETAINED_BYTES``: a submit is admitted only while what the tenant's ended jobs are
  charged is below it, and each charge covers what its record costs (checked here, kind by kind);
- ``D`` is ``INFERQ_TENANT_MAX_DEPTH``: the jobs admitted before the charge reached ``Q`` are at most ``D`` unfinished
  ones, each of which costs at most ``R`` -- the largest of an unfinished job (its body inline at its bound,
  everything else at its bound too, with its stream entry and idempotency key, and its output stream at its bound:
  ``INFERQ_OUTPUT_MAX_BYTES`` (``OutputMaxBytes``) of text in one delta per ``INFERQ_OUTPUT_FLUSH_MS`` of every
  attempt's run time) and the charge of an ended one (its result inline at its bound, or a dead letter with its
  body and errors; an ended job's output stream is closed);
- ``S`` is the rest of what a tenant holds: its long-poll slots, its rate-limit bucket, its fields of the bounds
  hash over every hour its records may be charged in, its ``INFERQ_TENANT_MAX_BATCHES`` unfinished batches' records
  with their metadata at its bound (an ended batch is charged like an ended job: ``retirebatch.lua``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from inferq.batches.records import Batches
from inferq.config.settings import Settings
from inferq.queue import output
from inferq.queue.holds import BUCKET_MS
from inferq.queue.jobs import JobRequest, JobStatus, Priority
from inferq.queue.protocol import Outcome, Queue
from inferq.queue.waitslots import WaitSlots
from tests.infra.cfn import TEMPLATE, load
from tests.support.queued import read_all

DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
BOUND_RE = re.compile(r"at most \*\*([\d,]+) MiB\*\* per tenant and model")
N = 20
"""Jobs of each kind written: what streams and sorted sets cost per entry is measured over many."""
MIB = 1024 * 1024

TEMPLATE_DEFAULTS = {name: int(p["Default"]) for name, p in load(TEMPLATE)["Parameters"].items()
                     if p.get("Type") == "Number"}
DEPTH = TEMPLATE_DEFAULTS["TenantMaxDepth"]
RETAINED = TEMPLATE_DEFAULTS["TenantMaxRetainedBytes"]
WAITS = TEMPLATE_DEFAULTS["TenantMaxWaits"]
BATCHES = TEMPLATE_DEFAULTS["TenantMaxBatches"]
JOB_TIMEOUT_S = TEMPLATE_DEFAULTS["JobTimeoutSeconds"]
OUTPUT = TEMPLATE_DEFAULTS["OutputMaxBytes"]
DEFAULTS = Settings()
INLINE = DEFAULTS.inline_max_bytes
"""The deployed template always has a files bucket: a body or a result above this is kept in S3 (the claim check)."""


def body_of(size: int) -> dict[str, Any]:
    """A chat body whose compact JSON is ``size`` bytes: the largest the gateway keeps inline."""
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": ""}]}
    body["messages"][0]["content"] = "x" * (size - len(json.dumps(body, separators=(",", ":"))))
    return body


def widest_request(n: int) -> JobRequest:
    """Every field at its bound: metadata of 16 pairs of 64-character keys and 512 four-byte characters, a 2,048
    character webhook URL, a 255-character idempotency key, a body inline at its bound."""
    return JobRequest(
        body=body_of(INLINE), url="/v1/completions", priority=Priority.NORMAL, timeout_s=3600, ttl_s=31_622_400,
        metadata={f"{i:02d}" + "k" * 62: "\U0001f600" * 512 for i in range(16)},
        webhook_url="https://" + "h" * (2048 - len("https://.example.com/")) + ".example.com/",
        idempotency_key=f"{n:03d}" + "k" * 252, traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
    )


async def held_bytes(q: Queue) -> int:
    """What every key of the queue costs, as the server counts it."""
    total = 0
    async for key in q.redis.scan_iter(match=q.keys.prefix + "*", count=1000):
        total += int(await q.redis.memory_usage(key, samples=0) or 0)
    return total


async def charged(q: Queue, tenant: str) -> int:
    return int(await q.redis.hget(q.keys.bounds, f"{tenant}|kept") or 0)


async def test_the_most_one_tenant_can_hold_at_the_deployed_defaults_is_what_the_docs_state(
    valkey: Any, queue_name: str
) -> None:
    q = Queue.connect(Settings(redis_url=valkey.url, queue=queue_name, max_attempts=2, output_max_bytes=OUTPUT))
    await q.ensure_groups()
    try:
        await q.enqueue("warm", JobRequest(body={"model": "m"}))  # the streams' and hashes' first allocations
        (first,), _ = await q.read("w", 1)
        await q.finish(first, JobStatus.SUCCEEDED, result={"status_code": 200, "body": {}})

        # an unfinished job's output stream at its bound: every attempt ran its whole timeout, writing a delta per
        # flush interval, up to the stream's most bytes (a job the worker streams, or one whose attempts failed)
        stream_job, _ = await q.enqueue("s", JobRequest(body={"model": "m"}))
        (streaming,), _ = await q.read("w", 1)
        flushes = DEFAULTS.max_attempts * JOB_TIMEOUT_S * 1000 // DEFAULTS.output_flush_ms
        size = OUTPUT // flushes
        deltas = [output.Delta(stream_job.id, streaming.entry_id, streaming.lease, i * size, "x" * size, i + 1,
                               3600) for i in range(flushes)]
        for first_delta in range(0, flushes, 1000):
            assert {a.code for a in await output.append_many(q, deltas[first_delta:first_delta + 1000])} == {0}
        stream = int(await q.redis.memory_usage(q.keys.out(stream_job.id), samples=0) or 0)
        assert stream >= OUTPUT * 0.95

        # unfinished: every field at its bound, with its stream entry, idempotency key and expiry entry
        before = await held_bytes(q)
        for n in range(N):
            await q.enqueue("t", widest_request(n))
        queued = (await held_bytes(q) - before) / N
        unfinished = queued + stream  # what an unfinished job may hold, its output stream at its bound

        # ended with a result inline at its bound
        before, kept = await held_bytes(q), await charged(q, "t")
        result = {"status_code": 200, "body": body_of(INLINE)}
        deliveries, _ = await read_all(q, "w", N)
        assert len(deliveries) == N and all(d.job.tenant == "t" for d in deliveries)
        for delivery in deliveries[: N // 2]:
            assert await q.finish(delivery, JobStatus.SUCCEEDED, result=result) is Outcome.WRITTEN
        succeeded = (await held_bytes(q) - before) / (N // 2) + queued  # what the record costs now, in all
        succeeded_charge = (await charged(q, "t") - kept) / (N // 2)

        # dead-lettered after two attempts: its body kept for a redrive, both errors at their bound
        before, kept = await held_bytes(q), await charged(q, "t")
        error = {"type": "server_error", "message": "\U0001f600" * 2000}
        for delivery in deliveries[N // 2:]:
            assert await q.retry(delivery, delay_ms=0, error=error) is Outcome.RETRY_SCHEDULED
        again, _ = await read_all(q, "w", N)
        for delivery in again:
            assert await q.retry(delivery, delay_ms=0, error=error) is Outcome.DEAD_LETTERED
        dead = (await held_bytes(q) - before) / (N - N // 2) + queued
        dead_charge = (await charged(q, "t") - kept) / (N - N // 2)

        # a charge covers what its record costs (what goes with the job's end included)
        assert succeeded_charge >= succeeded, (succeeded_charge, succeeded)
        assert dead_charge >= dead, (dead_charge, dead)
        largest = max(unfinished, succeeded_charge, dead_charge)

        # the rest: long-poll slots at their limit, a rate bucket, the bounds hash over every hour a record may be
        # charged in (a day's result TTL, or a batch's window, its cancel grace and the TTL)
        slots = WaitSlots(q, WAITS, margin_s=10)
        for _ in range(WAITS):
            await slots.take("t", 20)
        await q.take_rate("t", 50.0, 100)
        hours = 3 * 24 * 3_600_000 // BUCKET_MS
        await q.redis.hset(q.keys.bounds, mapping={f"t|{h}": 10**9 for h in range(hours)})
        rest = sum([int(await q.redis.memory_usage(k, samples=0) or 0)
                    for k in (q.keys.waits("t"), q.keys.rate("t"))]) + int(
            await q.redis.memory_usage(q.keys.bounds, samples=0) or 0)
        # and its unfinished batches, each with its metadata at its bound (an ended one is charged: retirebatch.lua)
        batches = Batches(q)
        before = await held_bytes(q)
        for n in range(N):
            await batches.create("t", f"file-{n:024d}", "/v1/chat/completions", "24h", widest_request(n).metadata)
        rest += BATCHES * (await held_bytes(q) - before) / N

        bound = RETAINED + DEPTH * largest + rest
        stated = int(BOUND_RE.search(DOC.read_text()).group(1).replace(",", "")) * MIB  # type: ignore[union-attr]
        print(f"output stream {stream} B, unfinished {unfinished:.0f} B, succeeded {succeeded:.0f} B "
              f"(charged {succeeded_charge:.0f}), dead {dead:.0f} B (charged {dead_charge:.0f}), rest {rest} B: "
              f"bound {bound / MIB:.1f} MiB")
        assert bound <= stated, f"one tenant can now hold {bound / MIB:.1f} MiB: more than docs/operations.md says"
        assert bound >= 0.95 * stated, f"one tenant holds at most {bound / MIB:.1f} MiB: update docs/operations.md"
    finally:
        await q.close()
