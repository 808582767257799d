"""A batch's ``in_progress`` step (:mod:`inferq.batches.driver`): its next lines turned into jobs, a chunk at a time,
and the lines in flight scanned for the ones that ended.

Each line's job is enqueued with the idempotency key ``<batch id>:<line>``, then ``advancebatch.lua`` records the
chunk's jobs and the byte offset after it in one step: a driver that dies in between enqueues the same chunk again
and gets the same jobs back. Lines go in no faster than the queue's depth limit (of which batches take at most
:data:`QUEUE_SHARE`) and the tenant's quota allow.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from inferq.batches.lines import parse_line
from inferq.batches.output import CHUNK_BYTES
from inferq.batches.records import Batch
from inferq.batches.routing import NO_JOB, UNROUTED, LineRouter, is_job
from inferq.batches.store import FileSource, read_lines
from inferq.config.settings import Settings
from inferq.queue import claimcheck
from inferq.queue.jobs import JobRequest, Priority
from inferq.queue.protocol import Queue, QueueFull

CHUNK_LINES = 500
"""Lines enqueued per round trip."""
IN_FLIGHT_LINES = 10_000
"""Lines of one batch enqueued and not yet passed by its scan: what one pass rereads to keep their outcomes."""
SCAN_SLICE = 2000
"""Line numbers read per round trip when scanning or cancelling a batch's lines."""
QUEUE_SHARE = 0.5
"""Of a queue's ``INFERQ_MAX_QUEUE_DEPTH``, what batch lines may fill: the rest stays free for submits, so a batch
never pushes another tenant's ``POST /v1/jobs`` into 429."""
CANCEL_GRACE_S = 600
"""How long a cancelling batch waits for its running lines to end (OpenAI allows up to 10 minutes)."""


class Expansion:
    """Turns a batch's lines into jobs (:meth:`enqueue_chunk`) and follows them (:meth:`scan`)."""

    def __init__(self, queue: Queue, lines: LineRouter, store: FileSource, settings: Settings) -> None:
        self.queue = queue
        self.lines = lines
        self.store = store
        self.settings = settings
        self.redis = queue.redis
        self.keys = queue.keys

    async def room(self, queue: Queue, tenant: str) -> int:
        """How many more of the tenant's batch jobs ``queue`` takes now: its share of the queue's depth limit
        (:data:`QUEUE_SHARE`) and what the tenant's quota leaves, at most a chunk."""
        room = CHUNK_LINES
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(queue.keys.stats, "unfinished")
        pipe.hget(queue.keys.tenants, tenant)
        unfinished, mine = await pipe.execute()
        if queue.settings.max_queue_depth > 0:
            room = min(room, int(queue.settings.max_queue_depth * QUEUE_SHARE) - int(unfinished or 0))
        if queue.settings.tenant_max_depth > 0:
            room = min(room, queue.settings.tenant_max_depth - int(mine or 0))
        return max(0, room)

    async def enqueue_chunk(self, batch: Batch) -> int:
        rooms = {q.settings.queue: await self.room(q, batch.tenant) for q in self.lines.queues()}
        want = min(sum(rooms.values()), CHUNK_LINES, batch.total - batch.next_line,
                   IN_FLIGHT_LINES - (batch.next_line - batch.done_line))
        if want <= 0:
            return 0  # every queue is full, or the tenant's quota: backpressure, not an error; the next pass tries
        lines = await asyncio.to_thread(
            read_lines, self.store, batch.tenant, batch.input_file_id, batch.next_offset, want,
            max_line=self.settings.max_body_bytes, max_bytes=CHUNK_BYTES,
        )
        by_queue: dict[str, tuple[Queue, list[tuple[int, JobRequest]]]] = {}
        ids: list[str] = []
        for i, line in enumerate(lines):
            request, marker = self.parse(batch, line.data)
            if request is not None:
                queue = self.lines.queue_for(request["body"])
                if queue is None:
                    marker = UNROUTED
                else:
                    if rooms[queue.settings.queue] <= 0:
                        break  # lines go in file order: the chunk ends at the first line whose queue is full
                    job_request = await self.job_request(batch, batch.next_line + i, request)
                    if job_request is None:
                        marker = NO_JOB + "invalid_request"
                    else:
                        rooms[queue.settings.queue] -= 1
                        by_queue.setdefault(queue.settings.queue, (queue, []))[1].append((i, job_request))
            ids.append(marker)
        if not ids:
            return 0
        try:  # a queue refusing part-way leaves jobs its next try gets back by their idempotency keys
            for queue, numbered in by_queue.values():
                accepted = await queue.enqueue_many(batch.tenant, [r for _, r in numbered])
                for (i, _), (job, _) in zip(numbered, accepted, strict=True):
                    ids[i] = job.id
        except QueueFull:
            return 0
        await self.keep(batch, [j for j in ids if is_job(j)])
        pairs: list[Any] = []
        for i, job_id in enumerate(ids):
            pairs += [batch.next_line + i, job_id]
        lines = lines[:len(ids)]
        end = batch.next_line + len(lines)
        await self.queue.scripts("advancebatch", [self.keys.batch(batch.id), self.keys.batch_lines(batch.id)],
                                 [batch.next_line, end, lines[-1].end, *pairs])
        return len(lines)

    def keep_until(self, batch: Batch) -> int:
        """Until when a line's job record is kept: the batch's window, the cancel grace, then the result TTL."""
        return int(batch.times.get("expires_at") or time.time()) + CANCEL_GRACE_S + self.settings.result_ttl_s

    async def keep(self, batch: Batch, job_ids: list[str]) -> None:
        """Keep the jobs' records until the batch has written its output: the terminal transition honours
        ``keep_until`` over the result TTL. ``NX``: a record that has ended already keeps the expiry it has (the
        scan extends it); one that expired meanwhile, which the ``HSET`` made anew, does not stay for ever."""
        until = self.keep_until(batch)
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            key = self.lines.queue_of(job_id).keys.job(job_id)
            pipe.hset(key, "keep_until", until)
            pipe.expireat(key, until, nx=True)
        await pipe.execute()

    def parse(self, batch: Batch, raw: bytes | None) -> tuple[dict[str, Any] | None, str]:
        """The request of a line, or the ``!<code>`` marker of a line that becomes no job
        (:data:`inferq.batches.records.NOT_RUN`)."""
        if raw is None:
            return None, NO_JOB + "request_too_large"
        request, _ = parse_line(raw, batch.endpoint, 0, self.lines.multimodal)
        if request is None:  # validated already: a file changed under its id is the only way here
            return None, NO_JOB + "invalid_request"
        return request, ""

    async def job_request(self, batch: Batch, number: int, request: dict[str, Any]) -> JobRequest | None:
        """The job a line becomes, its body claim-checked when large (as a submit's: the record holds a reference,
        the body is in S3); None when its body cannot be stored."""
        body = request["body"]
        try:
            data = claimcheck.encode(body)
        except (ValueError, TypeError):
            return None
        idempotency_key = f"{batch.id}:{number}"
        if len(data) > self.settings.inline_max_bytes:
            # the line's own object, the same if this pass is made again (the job's idempotency key names it)
            claim = claimcheck.request_claim(batch.tenant, data, idempotency_key)
            await asyncio.to_thread(self.store.put_claim, claim.key, data)
            body = claimcheck.claimed_body(claim)
        return JobRequest(
            body=body, url=batch.endpoint, metadata={"batch_id": batch.id, "custom_id": request["custom_id"]},
            idempotency_key=idempotency_key, priority=Priority.LOW,
        )

    async def scan(self, batch: Batch, upto: int) -> int:
        """Keep the outcome of every ended line in flight until the batch's own end, and move ``done_line`` over
        the lines whose jobs have ended, counting them; the new ``done_line``."""
        start = batch.done_line
        end = min(upto, start + IN_FLIGHT_LINES)
        if end <= start:
            return start
        keep_until = self.keep_until(batch)
        completed = failed = 0
        line = start
        contiguous = True
        for first in range(start, end, SCAN_SLICE):
            ids = await self.redis.hmget(self.keys.batch_lines(batch.id), list(range(first, min(end, first +
                                                                                                   SCAN_SLICE))))
            statuses = await self.lines.job_fields(ids, "status")
            pipe = self.redis.pipeline(transaction=False)
            kept = 0
            for job_id, status in zip(ids, statuses, strict=True):
                ended = job_id is not None and (not is_job(job_id) or status not in ("queued", "running"))
                if ended and is_job(job_id) and status is not None:
                    # a job record ends with the result TTL; a batch line's outcome must last the batch (GT: a
                    # record without a TTL, still running, is left alone)
                    pipe.expireat(self.lines.queue_of(job_id).keys.job(job_id), keep_until, gt=True)
                    kept += 1
                if contiguous and ended:
                    if status == "succeeded":
                        completed += 1
                    else:  # failed, cancelled, expired, no job, or a record past its retention
                        failed += 1
                    line += 1
                elif not ended:
                    contiguous = False
            if kept:
                await pipe.execute()
        if line > start:
            await self.redis.hset(self.keys.batch(batch.id), mapping={
                "done_line": line, "completed": batch.completed + completed, "failed": batch.failed + failed,
            })
        return line
