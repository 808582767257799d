"""The batch driver: moves every active batch one step along, outside any HTTP request (docs/api.md, "Batches").

It runs inside the scaler's invocation, which runs on its schedule whatever the fleet size, so a batch advances
at zero workers (its lines queue up, and the scaler sees them as lag and starts workers). Each pass takes the
active batches in turn (a rotating window of them) and steps several at once, each under its own lease (one driver
at a time) and its own deadline: a batch whose step fails or hangs (its input file unreadable, S3 down, a bug)
delays no other. A failed step is retried on later passes with backoff; after :data:`MAX_FAULTS` in a row the
batch ends ``failed`` with an ``errors`` entry that says where it stopped.

- ``validating``: read the input file once, streaming (:class:`inferq.batches.lines.Validator`), stopping at the first
  line past ``INFERQ_BATCH_MAX_LINES``; -> ``in_progress`` with the request count, or, when lines are invalid,
  -> ``finalizing`` heading for ``failed``: the batch fails as OpenAI's does, with ``errors``, and its error file
  names the fate of every line (its own error, or ``batch_failed`` for a valid line not run).
- ``in_progress`` (:mod:`inferq.batches.expansion`): turn the next lines into jobs, a chunk at a time, in the ``low``
lane, each line in its own
  model's queue (:mod:`inferq.batches.routing`), obeying what a submit obeys: a line over ``INFERQ_MAX_BODY_BYTES``
  becomes no job and fails alone (``request_too_large``); a body over ``INFERQ_INLINE_MAX_BYTES`` is stored in S3
  first (the claim check); lines go in no faster than the queue's depth limit (of which batches take at most
  :data:`QUEUE_SHARE`, so interactive submits always find room) and the tenant's quota allow: a big batch waits,
  it does not fail. Each line's job is enqueued with the idempotency key ``<batch id>:<line>``, then
  ``advancebatch.lua`` records the chunk's jobs and the byte offset after it in one step: a driver that dies in
  between enqueues the same chunk again and gets the same jobs back. Then the lines in flight are scanned: every
  ended job's record is kept until the batch's own end (``EXPIREAT``, not the result TTL), so the output file
  holds every result however long the batch takes; all ended -> ``finalizing``. Past the completion window ->
  ``finalizing`` (expired).
- ``cancelling``: cancel the jobs not ended yet (once), wait for the running ones (at most ``CANCEL_GRACE_S``).
- ``finalizing``: read the input again beside the jobs and write the output and error files
  (:mod:`inferq.batches.output`, crash-safe: the batch ends once, with one file of each and no orphan object).

Memory: validation holds one read chunk (256 KiB), one line (at most ``INFERQ_MAX_BODY_BYTES``: a longer line is
counted, not kept) and a 12-byte digest per custom_id (about 5 MB for 50,000 lines); expansion and finalisation
hold at most :data:`CHUNK_BYTES` of input lines plus, when finalising, their job records (without request bodies)
and one 8 MiB part per file being written.

File access goes through ``store`` (``functions/storage.py`` in AWS and the emulator): this module imports no AWS
library. Its blocking calls run in a thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inferq.batches.expansion import CANCEL_GRACE_S, CHUNK_LINES, QUEUE_SHARE, SCAN_SLICE, Expansion
from inferq.batches.lines import Validator, validate
from inferq.batches.output import CHUNK_BYTES, BatchOutput
from inferq.batches.records import Batch, Batches, BatchStatus
from inferq.batches.routing import LineRouter, is_job
from inferq.batches.store import FileSource
from inferq.config.registry import Registry
from inferq.config.settings import Settings
from inferq.queue import claimcheck
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import JobNotFound, JobTerminal, Queue, QueueError

log = logging.getLogger(__name__)

__all__ = ["CANCEL_GRACE_S", "CHUNK_BYTES", "CHUNK_LINES", "QUEUE_SHARE", "BatchDriver", "PassReport"]

PASS_WORK_S = 3.0
"""How long one pass keeps enqueueing chunks of one batch before it moves on."""
LOCK_MS = 20_000
"""A driver that dies holding a batch delays it this long at most; a live one renews it every chunk."""
ACTIVE_PER_PASS = 100
"""Batches looked at per pass; the window rotates, so every active batch gets its turn."""
CONCURRENCY = 8
"""Batches stepped at once: one slow batch (a large file, a slow S3) holds one of these, never the others."""
STEP_MAX_S = 50.0
"""The longest one step of one batch may take; past it the step counts as a fault, and validation, which runs in a
thread, stops itself at the same deadline. A step is not cut to what is left of the invocation: one that a Lambda's
end kills is a crash, which every step survives, and a pass's first steps have the whole invocation (60 s)."""
MAX_FAULTS = 5
"""Failed steps in a row after which the batch ends ``failed`` (after about a minute of backoff)."""
FAULT_BACKOFF_S = 2.0
FAULT_BACKOFF_MAX_S = 300.0

_held: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("batch_lock", default=None)


@dataclass
class PassReport:
    batches: int = 0
    enqueued: int = 0
    finished: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)


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
        self.on_step: Callable[[str, str], None] | None = None
        """Called at each boundary of finalisation with (batch id, step name): the kill-at-every-step test's hook."""
        self.expansion = Expansion(queue, self.lines, store, settings)
        self.output = BatchOutput(queue, self.lines, store, settings, self._step, self._renew)
        self._start = 0

    async def run(self, budget_s: float, interval_s: float = 2.0) -> PassReport:
        """Passes until ``budget_s`` is nearly spent (at least one)."""
        deadline = time.monotonic() + budget_s
        total = PassReport()
        while True:
            report = await self.run_once()
            total.batches += report.batches
            total.enqueued += report.enqueued
            total.finished += report.finished
            total.faults += report.faults
            if time.monotonic() + interval_s >= deadline:
                return total
            await asyncio.sleep(interval_s)

    async def run_once(self) -> PassReport:
        report = PassReport()
        count = await self.redis.zcard(self.keys.batches_active)
        if not count:
            return report
        start = self._start % count
        ids = await self.redis.zrange(self.keys.batches_active, start, start + ACTIVE_PER_PASS - 1)
        if len(ids) < ACTIVE_PER_PASS and start:
            ids += await self.redis.zrange(self.keys.batches_active, 0, min(start, ACTIVE_PER_PASS - len(ids)) - 1)
        self._start = start + len(ids)
        slots = asyncio.Semaphore(CONCURRENCY)

        async def one(batch_id: str) -> None:
            async with slots:
                await self._guarded(batch_id, report)

        await asyncio.gather(*(one(b) for b in dict.fromkeys(ids)))
        return report

    async def _guarded(self, batch_id: str, report: PassReport) -> None:
        """One step of one batch under its lease and deadline; whatever goes wrong stays with this batch."""
        token = secrets.token_hex(8)
        lock = self.keys.batch_lock(batch_id)
        try:
            retry_at = await self.redis.hget(self.keys.batch(batch_id), "retry_at")
            if retry_at and float(retry_at) > time.time():
                return  # backing off after a fault
            if not await self.redis.set(lock, token, nx=True, px=LOCK_MS):
                return  # another driver has it
        except Exception:
            log.exception("batch driver: cannot take batch %s", batch_id)
            return
        _held.set((lock, token))
        report.batches += 1
        try:
            async with asyncio.timeout(STEP_MAX_S):
                await self.step(batch_id, report, deadline=time.monotonic() + STEP_MAX_S)
        except Exception as exc:  # any fault of this batch's: retried with backoff, then the batch fails alone
            report.faults.append(batch_id)
            log.warning("batch driver: step of %s failed (%s)", batch_id, type(exc).__name__, exc_info=True)
            try:
                await self._fault(batch_id, exc)
            except Exception:
                log.exception("batch driver: cannot record the fault of %s", batch_id)
        finally:
            _held.set(None)
            try:
                if await self.redis.get(lock) == token:
                    await self.redis.delete(lock)
            except Exception:  # noqa: S110 - the lease expires by itself
                pass

    async def _fault(self, batch_id: str, exc: BaseException) -> None:
        faults = await self.redis.hincrby(self.keys.batch(batch_id), "faults", 1)
        if faults < MAX_FAULTS:
            await self._back_off(batch_id, faults)
            return
        batch = await self.batches.get(batch_id)
        if batch is None or batch.status.terminal:
            return
        where = batch.status.value
        error = {"code": "batch_processing_error",
                 "message": f"the batch could not be processed ({type(exc).__name__} while {where}, "
                            f"{faults} attempts); its input file may be gone or unreadable",
                 "param": None, "line": None}
        if batch.status in (BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING, BatchStatus.FINALIZING):
            try:
                await self._cancel_unfinished(batch)
            except Exception as cancel:
                # failed now, its jobs would run on on the GPUs for nothing: it stays active, and the next pass
                # that fails it again tries the cancel again
                log.warning("batch driver: cancelling the jobs of failing batch %s failed (%s); tried again",
                            batch_id, type(cancel).__name__)
                await self._back_off(batch_id, faults)
                return
        await self.batches.move(batch_id, tuple(s for s in BatchStatus if not s.terminal), BatchStatus.FAILED,
                                failed_at=int(time.time()), errors=json.dumps([error]))
        await self._retire(batch_id)
        if batch.status is BatchStatus.FINALIZING:  # what its tries wrote is no file of the batch's now
            await self.output.discard(batch)

    async def _back_off(self, batch_id: str, faults: int) -> None:
        delay_s = min(FAULT_BACKOFF_S * 2 ** (faults - 1), FAULT_BACKOFF_MAX_S)
        await self.redis.hset(self.keys.batch(batch_id), "retry_at", f"{time.time() + delay_s:.3f}")

    async def _renew(self) -> None:
        """Extend this driver's lease on its batch (between chunks of a long step)."""
        held = _held.get()
        if held is not None:
            lock, token = held
            if await self.redis.get(lock) == token:
                await self.redis.pexpire(lock, LOCK_MS)

    def _step(self, batch_id: str, name: str) -> None:
        if self.on_step is not None:
            self.on_step(batch_id, name)

    async def step(self, batch_id: str, report: PassReport, deadline: float | None = None) -> None:
        """One step of one batch; a batch that reaches ``finalizing`` is finalized in the same pass."""
        batch = await self.batches.get(batch_id)
        if batch is None or batch.status.terminal:
            await self.redis.zrem(self.keys.batches_active, batch_id)
            return
        if batch.status is BatchStatus.VALIDATING:
            await self._validate(batch, deadline)
        elif batch.status is BatchStatus.IN_PROGRESS:
            await self._progress(batch, report)
        elif batch.status is BatchStatus.CANCELLING:
            await self._cancelling(batch)
        fresh = await self.batches.get(batch_id)
        if fresh is not None and fresh.status is BatchStatus.FINALIZING:
            await self._finalize(fresh, report)
        if batch.faults:
            await self.redis.hdel(self.keys.batch(batch_id), "faults", "retry_at")

    # ------------------------------------------------------------------ validating

    async def _validate(self, batch: Batch, deadline: float | None) -> None:
        now = int(time.time())
        info = await asyncio.to_thread(self.store.head, batch.tenant, batch.input_file_id)
        if info is None:
            missing = [{"code": "file_not_found", "message": f"no file {batch.input_file_id}",
                        "param": "input_file_id", "line": None}]
            await self.batches.move(batch.id, (BatchStatus.VALIDATING,), BatchStatus.FAILED, failed_at=now,
                                    errors=json.dumps(missing))
            return

        def check() -> Validator:
            return validate(self.store.chunks(batch.tenant, batch.input_file_id), batch.endpoint,
                            self.settings.batch_max_lines, self.settings.max_body_bytes, deadline,
                            multimodal=self.lines.multimodal)

        checked = await asyncio.to_thread(check)
        if checked.too_many or checked.count == 0:  # refused whole: no line is looked at further
            errors = [e.to_api() for e in checked.errors if e.code == "too_many_requests"][:1] or [
                {"code": "empty_file", "message": "the input file has no requests", "param": None, "line": 1}]
            await self.batches.move(batch.id, (BatchStatus.VALIDATING,), BatchStatus.FAILED, failed_at=now,
                                    errors=json.dumps(errors))
        elif checked.bad:
            data = [e.to_api() for e in checked.errors]
            if checked.bad > len(checked.errors):
                data.append({"code": "more_errors", "message": f"{checked.bad - len(checked.errors)} more lines "
                             "have errors (the error file lists every line)", "param": None, "line": None})
            await self.batches.move(batch.id, (BatchStatus.VALIDATING,), BatchStatus.FINALIZING, finalizing_at=now,
                                    end=BatchStatus.FAILED.value, errors=json.dumps(data), total=checked.count)
        else:
            await self.batches.move(batch.id, (BatchStatus.VALIDATING,), BatchStatus.IN_PROGRESS, in_progress_at=now,
                                    total=checked.count)

    # ------------------------------------------------------------------ in progress

    async def _progress(self, batch: Batch, report: PassReport) -> None:
        if time.time() >= (batch.times.get("expires_at") or 0):
            await self.batches.move(batch.id, (BatchStatus.IN_PROGRESS,), BatchStatus.FINALIZING,
                                    finalizing_at=int(time.time()), end=BatchStatus.EXPIRED.value)
            return
        stop = time.monotonic() + PASS_WORK_S
        while batch.next_line < batch.total and time.monotonic() < stop:
            enqueued = await self.expansion.enqueue_chunk(batch)
            if not enqueued:
                break
            report.enqueued += enqueued
            await self._renew()
            fresh = await self.batches.get(batch.id)
            if fresh is None or fresh.status is not BatchStatus.IN_PROGRESS:
                return
            batch = fresh
        done_line = await self.expansion.scan(batch, batch.next_line)
        if done_line >= batch.total:
            await self.batches.move(batch.id, (BatchStatus.IN_PROGRESS,), BatchStatus.FINALIZING,
                                    finalizing_at=int(time.time()), end=BatchStatus.COMPLETED.value)

    # ------------------------------------------------------------------ cancelling

    async def _cancel_unfinished(self, batch: Batch) -> None:
        """Cancel every job of the batch not ended yet (queued ones end at once, running ones are asked to)."""
        for start in range(batch.done_line, batch.next_line, SCAN_SLICE):
            end = min(batch.next_line, start + SCAN_SLICE)
            ids = await self.redis.hmget(self.keys.batch_lines(batch.id), list(range(start, end)))
            live = [j for j in ids if j is not None and is_job(j)]
            for group in range(0, len(live), 100):
                await asyncio.gather(*(self._cancel_job(batch.tenant, j) for j in live[group:group + 100]))
            await self._renew()
        await self.redis.hset(self.keys.batch(batch.id), "cancel_sent", "1")

    async def _cancel_job(self, tenant: str, job_id: str) -> None:
        queue = self.lines.queue_of(job_id)
        # a line's claim-checked body is deleted when the cancel ends its job here (queued), as the gateway's
        # cancel does; the terminal transition drops the record's reference, so it is read first
        raw = await queue.redis.hget(queue.keys.job(job_id), "body")
        try:
            job = await queue.cancel(tenant, job_id)
        except (JobTerminal, JobNotFound):
            return
        if not raw or claimcheck.MARKER not in raw or job.status is not JobStatus.CANCELLED:
            return
        claim = claimcheck.claim_of_body(json.loads(raw), tenant)
        if claim is None:
            return
        try:
            await asyncio.to_thread(self.store.delete_claim, claim.key)
        except Exception as exc:  # best effort: the bucket's lifecycle rule on claims/ is the net
            log.warning("could not delete a cancelled line's request body: %s", type(exc).__name__)

    async def _cancelling(self, batch: Batch) -> None:
        if not batch.cancel_sent:
            await self._cancel_unfinished(batch)
        done_line = await self.expansion.scan(batch, batch.next_line)
        waited = time.time() - (batch.times.get("cancelling_at") or 0)
        if done_line >= batch.next_line or waited > CANCEL_GRACE_S:
            await self.batches.move(batch.id, (BatchStatus.CANCELLING,), BatchStatus.FINALIZING,
                                    finalizing_at=int(time.time()), end=BatchStatus.CANCELLED.value)

    # ------------------------------------------------------------------ finalizing

    async def _finalize(self, batch: Batch, report: PassReport) -> None:
        end = BatchStatus(batch.end or BatchStatus.COMPLETED.value)
        if end is BatchStatus.EXPIRED and not batch.cancel_sent:
            await self._cancel_unfinished(batch)
        files = await self.output.write(batch, end)
        fields: dict[str, Any] = {f"{end.value}_at": int(time.time()),
                                  "output_file_id": files.output_id if files.completed else "",
                                  "error_file_id": files.error_id if files.failed else ""}
        if end is not BatchStatus.FAILED:
            fields.update(completed=files.completed, failed=files.failed)
        await self.batches.move(batch.id, (BatchStatus.FINALIZING,), end, **fields)
        self._step(batch.id, "moved")
        await self._retire(batch.id)
        report.finished.append(batch.id)

    async def _retire(self, batch_id: str) -> None:
        """Off the active set; the record and its lines kept the result TTL, charged to the tenant (G11)."""
        await self.queue.scripts(
            "retirebatch",
            [self.keys.batch(batch_id), self.keys.batch_lines(batch_id), self.keys.batches_active, self.keys.bounds],
            [batch_id, self.settings.result_ttl_s, self.batches.index_keep_s()])


__all__ = ["BatchDriver", "FileSource", "PassReport", "QueueError"]
