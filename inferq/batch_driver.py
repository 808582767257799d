"""The batch driver: moves every active batch one step along, outside any HTTP request (docs/api.md, "Batches").

It runs inside the scaler's invocation, which runs on its schedule whatever the fleet size, so a batch advances
at zero workers (its lines queue up, and the scaler sees them as lag and starts workers). Each pass, for each
active batch, under a per-batch lease (one driver at a time):

- ``validating``: read the input file once, streaming, and check every line; -> ``failed`` with line errors, or
  ``in_progress`` with the request count.
- ``in_progress``: turn the next lines into jobs, a chunk at a time and no more than the queue has room for, in
  the ``low`` lane (bulk work never delays interactive jobs, and still gets its share of takes), each line in its
  own model's queue (:mod:`inferq.batch_models`; a line naming no served model fails alone). Each line's job
  is enqueued with the idempotency key ``<batch id>:<line>``, then ``advancebatch.lua`` records the
  chunk's jobs and the byte offset after it in one step: a driver that dies in between enqueues the same chunk
  again and gets the same jobs back, so a crash never makes two jobs for one line. Then scan forward over lines
  whose jobs have ended; all ended -> ``finalizing``. Past the completion window -> ``finalizing`` (expired).
- ``cancelling``: cancel the jobs not ended yet (once), wait for the running ones (at most ``CANCEL_GRACE_S``).
- ``finalizing``: read the input again beside the jobs, line by line, and stream the output and error files to S3
  as multipart uploads (a part of memory at most). A crash here starts the files over; the bucket's lifecycle rule
  removes the abandoned parts.

File access goes through ``store`` (``functions/storage.py`` in AWS and the emulator): this module imports no AWS
library. Its blocking calls run in a thread.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from . import claimcheck
from .batch_io import FileSource, Writer, custom_id_of, read_lines
from .batch_models import UNROUTED, LineRouter, unrouted_line
from .batches import Batch, Batches, BatchStatus, new_file_id, output_line, parse_line, validate
from .jobs import Job, JobRequest, Priority
from .queue import JobNotFound, JobTerminal, Queue, QueueError, QueueFull
from .registry import Registry
from .settings import Settings

CHUNK_LINES = 500
"""Lines enqueued per round trip."""
PASS_WORK_S = 3.0
"""How long one pass keeps enqueueing chunks of one batch before it moves on."""
SCAN_LINES = 2000
"""Lines whose jobs one pass checks for an end, per batch."""
FINALIZE_LINES = 1000
LOCK_MS = 20_000
"""A driver that dies holding a batch delays it this long at most; a live one renews it every chunk."""
CANCEL_GRACE_S = 600
"""How long a cancelling batch waits for its running lines to end (OpenAI allows up to 10 minutes)."""
ACTIVE_PER_PASS = 100


@dataclass
class PassReport:
    batches: int = 0
    enqueued: int = 0
    finished: list[str] = field(default_factory=list)


class BatchDriver:
    def __init__(self, queue: Queue, store: FileSource, settings: Settings, registry: Registry | None = None) -> None:
        """``queue``: the primary queue, which holds the batch records; ``registry``: the models whose queues the
        lines go to (None: every line to ``queue``)."""
        self.queue = queue
        self.lines = LineRouter(queue, registry)
        self.store = store
        self.settings = settings
        self.batches = Batches(queue)
        self.redis = queue.redis
        self.keys = queue.keys
        self._held: tuple[str, str] | None = None  # (lock key, token) of the batch this driver works on

    async def run(self, budget_s: float, interval_s: float = 2.0) -> PassReport:
        """Passes until ``budget_s`` is nearly spent (at least one)."""
        deadline = time.monotonic() + budget_s
        total = PassReport()
        while True:
            report = await self.run_once()
            total.batches += report.batches
            total.enqueued += report.enqueued
            total.finished += report.finished
            if time.monotonic() + interval_s >= deadline:
                return total
            await asyncio.sleep(interval_s)

    async def run_once(self) -> PassReport:
        report = PassReport()
        for batch_id in await self.redis.zrange(self.keys.batches_active, 0, ACTIVE_PER_PASS - 1):
            token = secrets.token_hex(8)
            lock = self.keys.batch_lock(batch_id)
            if not await self.redis.set(lock, token, nx=True, px=LOCK_MS):
                continue  # another driver has it
            self._held = (lock, token)
            try:
                report.batches += 1
                await self.step(batch_id, report)
            finally:
                self._held = None
                if await self.redis.get(lock) == token:
                    await self.redis.delete(lock)
        return report

    async def _renew(self) -> None:
        """Extend this driver's lease on its batch (between chunks of a long step)."""
        if self._held is not None:
            lock, token = self._held
            if await self.redis.get(lock) == token:
                await self.redis.pexpire(lock, LOCK_MS)

    async def step(self, batch_id: str, report: PassReport) -> None:
        """One step of one batch; a batch that reaches ``finalizing`` is finalized in the same pass."""
        batch = await self.batches.get(batch_id)
        if batch is None or batch.status.terminal:
            await self.redis.zrem(self.keys.batches_active, batch_id)
            return
        if batch.status is BatchStatus.VALIDATING:
            await self._validate(batch)
            return
        if batch.status is BatchStatus.IN_PROGRESS:
            await self._progress(batch, report)
        elif batch.status is BatchStatus.CANCELLING:
            await self._cancelling(batch)
        fresh = await self.batches.get(batch_id)
        if fresh is not None and fresh.status is BatchStatus.FINALIZING:
            await self._finalize(fresh, report)

    # ------------------------------------------------------------------ validating

    async def _validate(self, batch: Batch) -> None:
        now = int(time.time())
        info = await asyncio.to_thread(self.store.head, batch.tenant, batch.input_file_id)
        if info is None:
            missing = [{"code": "file_not_found", "message": f"no file {batch.input_file_id}",
                        "param": "input_file_id", "line": None}]
            await self.batches.move(batch.id, (BatchStatus.VALIDATING,), BatchStatus.FAILED, failed_at=now,
                                    errors=json.dumps(missing))
            return

        def check() -> tuple[int, list[Any], int]:
            return validate(self.store.chunks(batch.tenant, batch.input_file_id), batch.endpoint,
                            self.settings.batch_max_lines)

        count, errors, bad = await asyncio.to_thread(check)
        if bad:
            data = [e.to_api() for e in errors]
            if bad > len(errors):
                data.append({"code": "more_errors", "message": f"{bad - len(errors)} more lines have errors",
                             "param": None, "line": None})
            await self.batches.move(batch.id, (BatchStatus.VALIDATING,), BatchStatus.FAILED, failed_at=now,
                                    errors=json.dumps(data), total=count)
        else:
            await self.batches.move(batch.id, (BatchStatus.VALIDATING,), BatchStatus.IN_PROGRESS, in_progress_at=now,
                                    total=count)

    # ------------------------------------------------------------------ in progress

    async def _progress(self, batch: Batch, report: PassReport) -> None:
        if time.time() >= (batch.times.get("expires_at") or 0):
            await self.batches.move(batch.id, (BatchStatus.IN_PROGRESS,), BatchStatus.FINALIZING,
                                    finalizing_at=int(time.time()), end=BatchStatus.EXPIRED.value)
            return
        stop = time.monotonic() + PASS_WORK_S
        while batch.next_line < batch.total and time.monotonic() < stop:
            enqueued = await self._enqueue_chunk(batch)
            if not enqueued:
                break
            report.enqueued += enqueued
            await self._renew()
            fresh = await self.batches.get(batch.id)
            if fresh is None or fresh.status is not BatchStatus.IN_PROGRESS:
                return
            batch = fresh
        done_line = await self._scan(batch, batch.next_line)
        if done_line >= batch.total:
            await self.batches.move(batch.id, (BatchStatus.IN_PROGRESS,), BatchStatus.FINALIZING,
                                    finalizing_at=int(time.time()), end=BatchStatus.COMPLETED.value)

    async def _room(self, queue: Queue) -> int:
        """How many more jobs ``queue`` takes now (its own ``max_queue_depth``), at most a chunk."""
        if queue.settings.max_queue_depth <= 0:
            return CHUNK_LINES
        unfinished = int(await self.redis.hget(queue.keys.stats, "unfinished") or 0)
        return max(0, min(CHUNK_LINES, queue.settings.max_queue_depth - unfinished))

    async def _enqueue_chunk(self, batch: Batch) -> int:
        rooms = {q.settings.queue: await self._room(q) for q in self.lines.queues()}
        want = min(sum(rooms.values()), CHUNK_LINES, batch.total - batch.next_line)
        if want <= 0:
            return 0  # every queue is full: backpressure, not an error; the next pass tries again
        lines = await asyncio.to_thread(
            read_lines, self.store, batch.tenant, batch.input_file_id, batch.next_offset, want
        )
        by_queue: dict[str, tuple[Queue, list[tuple[int, JobRequest]]]] = {}
        ids: list[str] = []
        for i, (_, raw) in enumerate(lines):
            request, error = parse_line(raw, batch.endpoint, 0)
            if request is None:  # validated already; a changed file is the only way here
                raise ValueError(f"batch {batch.id}: line {batch.next_line + i} no longer parses: {error}")
            queue = self.lines.queue_for(request["body"])
            if queue is not None:
                if rooms[queue.settings.queue] <= 0:
                    break  # lines go in file order: the chunk ends at the first line whose queue is full
                rooms[queue.settings.queue] -= 1
                by_queue.setdefault(queue.settings.queue, (queue, []))[1].append((i, JobRequest(
                    body=request["body"], url=batch.endpoint,
                    metadata={"batch_id": batch.id, "custom_id": request["custom_id"]},
                    idempotency_key=f"{batch.id}:{batch.next_line + i}", priority=Priority.LOW,
                )))
            ids.append(UNROUTED)
        if not ids:
            return 0
        try:  # a queue refusing part-way leaves jobs its next try gets back by their idempotency keys
            for queue, numbered in by_queue.values():
                accepted = await queue.enqueue_many(batch.tenant, [r for _, r in numbered])
                for (i, _), (job, _) in zip(numbered, accepted, strict=True):
                    ids[i] = job.id
        except QueueFull:
            return 0
        pairs: list[Any] = []
        for i, job_id in enumerate(ids):
            pairs += [batch.next_line + i, job_id]
        lines = lines[:len(ids)]
        end = batch.next_line + len(lines)
        await self.queue.scripts("advancebatch", [self.keys.batch(batch.id), self.keys.batch_lines(batch.id)],
                                 [batch.next_line, end, lines[-1][0], *pairs])
        return len(lines)

    async def _scan(self, batch: Batch, upto: int) -> int:
        """Move ``done_line`` over the lines whose jobs have ended, counting them; the new ``done_line``."""
        start = batch.done_line
        end = min(upto, start + SCAN_LINES)
        if end <= start:
            return start
        ids = await self.redis.hmget(self.keys.batch_lines(batch.id), list(range(start, end)))
        statuses = await self.lines.job_fields(ids, "status")
        completed = failed = 0
        line = start
        for job_id, status in zip(ids, statuses, strict=True):
            if job_id is None or status in ("queued", "running"):
                break
            if status == "succeeded":
                completed += 1
            else:  # failed, cancelled, expired, or a record past its retention
                failed += 1
            line += 1
        if line > start:
            await self.redis.hset(self.keys.batch(batch.id), mapping={
                "done_line": line, "completed": batch.completed + completed, "failed": batch.failed + failed,
            })
        return line

    # ------------------------------------------------------------------ cancelling

    async def _cancel_unfinished(self, batch: Batch) -> None:
        """Cancel every job of the batch not ended yet (queued ones end at once, running ones are asked to)."""
        for start in range(batch.done_line, batch.next_line, FINALIZE_LINES):
            end = min(batch.next_line, start + FINALIZE_LINES)
            ids = await self.redis.hmget(self.keys.batch_lines(batch.id), list(range(start, end)))
            live = [j for j in ids if j and j != UNROUTED]
            for group in range(0, len(live), 100):
                await asyncio.gather(*(self._cancel_job(batch.tenant, j) for j in live[group:group + 100]))
            await self._renew()
        await self.redis.hset(self.keys.batch(batch.id), "cancel_sent", "1")

    async def _cancel_job(self, tenant: str, job_id: str) -> None:
        try:
            await self.lines.queue_of(job_id).cancel(tenant, job_id)
        except (JobTerminal, JobNotFound):
            pass

    async def _cancelling(self, batch: Batch) -> None:
        if not batch.cancel_sent:
            await self._cancel_unfinished(batch)
        done_line = await self._scan(batch, batch.next_line)
        waited = time.time() - (batch.times.get("cancelling_at") or 0)
        if done_line >= batch.next_line or waited > CANCEL_GRACE_S:
            await self.batches.move(batch.id, (BatchStatus.CANCELLING,), BatchStatus.FINALIZING,
                                    finalizing_at=int(time.time()), end=BatchStatus.CANCELLED.value)

    # ------------------------------------------------------------------ finalizing

    async def _finalize(self, batch: Batch, report: PassReport) -> None:
        end = BatchStatus(batch.end or BatchStatus.COMPLETED.value)
        if end is BatchStatus.EXPIRED and not batch.cancel_sent:
            await self._cancel_unfinished(batch)
        output_id, error_id = new_file_id(), new_file_id()
        output = await asyncio.to_thread(
            self.store.writer, batch.tenant, output_id, f"{batch.id}_output.jsonl", "batch_output")
        errors = await asyncio.to_thread(
            self.store.writer, batch.tenant, error_id, f"{batch.id}_error.jsonl", "batch_output")
        try:
            completed, failed = await self._write_files(batch, end, output, errors)
            await self._close(output, completed)
            await self._close(errors, failed)
        except BaseException:
            for writer in (output, errors):
                try:
                    await asyncio.to_thread(writer.abort)
                except Exception:  # noqa: S110 - the lifecycle rule removes what an abort could not
                    pass
            raise
        fields: dict[str, Any] = {f"{end.value}_at": int(time.time()), "completed": completed, "failed": failed,
                                  "output_file_id": output_id if completed else "",
                                  "error_file_id": error_id if failed else ""}
        await self.batches.move(batch.id, (BatchStatus.FINALIZING,), end, **fields)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(self.keys.batches_active, batch.id)
        pipe.expire(self.keys.batch(batch.id), self.settings.result_ttl_s)
        pipe.expire(self.keys.batch_lines(batch.id), self.settings.result_ttl_s)
        await pipe.execute()
        report.finished.append(batch.id)

    async def _read_back(self, job: Job) -> Job:
        """A claimed result read back from S3 (docs/api.md, "Large payloads"): output lines hold every body inline,
        as OpenAI's do. An S3 fault ends this pass's files like any other; the next pass starts them over."""
        claim = claimcheck.claim_of_result(job.result, job.tenant, job.id)
        assert claim is not None and job.result is not None
        data = await asyncio.to_thread(self.store.claimed, claim.key)
        if not claimcheck.verify(claim, data):
            raise ValueError(f"the stored result of {job.id} does not match its reference")
        return dataclasses.replace(job, result={"status_code": job.result.get("status_code", 200),
                                                "body": json.loads(data)})

    async def _close(self, writer: Writer, lines: int) -> None:
        """Complete a file that has lines; an empty one is not kept (OpenAI leaves its id null)."""
        await asyncio.to_thread(writer.close if lines else writer.abort)

    async def _write_files(self, batch: Batch, end: BatchStatus, output: Writer, errors: Writer) -> tuple[int, int]:
        completed = failed = 0
        line = 0
        offset = 0
        while True:
            lines = await asyncio.to_thread(
                read_lines, self.store, batch.tenant, batch.input_file_id, offset, FINALIZE_LINES)
            if not lines:
                break
            ids = await self.redis.hmget(self.keys.batch_lines(batch.id), list(range(line, line + len(lines))))
            records = await self.lines.job_fields(ids, None)
            good = bytearray()
            bad = bytearray()
            for (_, raw), job_id, record in zip(lines, ids, records, strict=True):
                custom_id = custom_id_of(raw)
                job = Job.from_hash(record) if record and "status" in record else None
                if job is not None and claimcheck.claim_of_result(job.result, job.tenant, job.id) is not None:
                    job = await self._read_back(job)
                if job_id == UNROUTED:
                    is_error, entry = True, unrouted_line(custom_id, raw)
                else:
                    is_error, entry = output_line(custom_id, job, end)
                target = bad if is_error else good
                target += json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
                if is_error:
                    failed += 1
                else:
                    completed += 1
            if good:
                await asyncio.to_thread(output.write, bytes(good))
            if bad:
                await asyncio.to_thread(errors.write, bytes(bad))
            line += len(lines)
            offset = lines[-1][0]
            await self._renew()
            if len(lines) < FINALIZE_LINES:
                break
        return completed, failed


__all__ = ["BatchDriver", "FileSource", "PassReport", "QueueError"]
