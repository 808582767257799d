"""The output and error files of a batch (docs/api.md, "Batches"): what the driver's ``finalizing`` step writes,
streamed to S3 as two multipart uploads, in input file order, one line per request in OpenAI's format.

Crash-safe: the two file ids are chosen once and kept in the batch record, so every try writes the same two
objects; a try first aborts the uploads a killed one left open, and a file that turns out to have no lines is not
kept (nor what an earlier try completed under its id). The driver moves the batch to its end only after both
files are complete: a batch ends once, with one output file and one error file, and no orphan object.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferq.batches.lines import Validator, scan_lines
from inferq.batches.records import NOT_RUN, Batch, BatchStatus, error_line, new_file_id, output_line
from inferq.batches.routing import NO_JOB, UNROUTED, LineRouter, is_job, unrouted_line
from inferq.batches.store import FileSource, Writer, line_custom_id, read_lines
from inferq.config.settings import Settings
from inferq.queue import claimcheck
from inferq.queue.jobs import Job
from inferq.queue.protocol import Queue
from inferq.queue.storage import Storage

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 * 1024 * 1024
"""Input bytes held at once (a chunk ends at the line that crosses it), and error-file bytes buffered."""
FINALIZE_LINES = 200
"""Lines read, with their job records (without request bodies), per round trip."""


@dataclass(frozen=True)
class Written:
    output_id: str
    error_id: str
    completed: int
    failed: int


class BatchOutput:
    """Writes a finalising batch's two files. ``step(batch id, name)`` is called at each boundary (the
    kill-at-every-step test's hook); ``renew()`` between chunks keeps the driver's lease."""

    def __init__(self, queue: Queue, lines: LineRouter, store: FileSource, settings: Settings,
                 step: Callable[[str, str], None], renew: Callable[[], Any]) -> None:
        self.redis = queue.redis
        self.keys = queue.keys
        self.lines = lines
        self.store = store
        self.storage = Storage(queue)
        self.settings = settings
        self._step = step
        self._renew = renew

    async def file_ids(self, batch: Batch) -> tuple[str, str]:
        """The ids of the batch's output and error files, chosen by the first finalisation and kept in its record,
        so every later try writes the same two objects."""
        key = self.keys.batch(batch.id)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hsetnx(key, "final_output_id", new_file_id())
        pipe.hsetnx(key, "final_error_id", new_file_id())
        pipe.hmget(key, "final_output_id", "final_error_id")
        *_, (output_id, error_id) = await pipe.execute()
        return str(output_id), str(error_id)

    async def discard(self, batch: Batch) -> None:
        """Remove what finalising tries of a batch that then failed left (best effort: the bucket's lifecycle
        rule aborts open uploads after a day)."""
        for file_id in await self.redis.hmget(self.keys.batch(batch.id), "final_output_id", "final_error_id"):
            if file_id:
                try:
                    await asyncio.to_thread(self.store.discard_uploads, batch.tenant, file_id)
                    await asyncio.to_thread(self.store.delete, batch.tenant, file_id)
                    await self.storage.drop_file(batch.tenant, file_id)
                except Exception as exc:  # S3 is what failed the batch, most likely
                    log.warning("batch %s: removing what its finalising tries wrote under %s failed (%s); the "
                                "bucket's lifecycle rule removes it", batch.id, file_id, type(exc).__name__)

    async def write(self, batch: Batch, end: BatchStatus) -> Written:
        """Both files, complete (an empty one not kept); the batch is not moved."""
        output_id, error_id = await self.file_ids(batch)
        self._step(batch.id, "ids")
        for file_id in (output_id, error_id):  # what a killed try left open
            await asyncio.to_thread(self.store.discard_uploads, batch.tenant, file_id)
        self._step(batch.id, "discarded")
        output = await asyncio.to_thread(
            self.store.writer, batch.tenant, output_id, f"{batch.id}_output.jsonl", "batch_output")
        errors = await asyncio.to_thread(
            self.store.writer, batch.tenant, error_id, f"{batch.id}_error.jsonl", "batch_output")
        self._step(batch.id, "opened")
        try:
            if end is BatchStatus.FAILED:
                completed, failed = 0, await self._write_refused(batch, errors)
            else:
                completed, failed = await self._write_files(batch, end, output, errors)
            self._step(batch.id, "written")
            await self._close(output, completed, batch.tenant, output_id)
            self._step(batch.id, "output_closed")
            await self._close(errors, failed, batch.tenant, error_id)
            self._step(batch.id, "errors_closed")
        except BaseException:
            for writer, file_id in ((output, output_id), (errors, error_id)):
                try:
                    await asyncio.to_thread(writer.abort)
                except Exception as exc:  # the next try discards it; the lifecycle rule after that
                    log.warning("batch %s: aborting the upload of %s failed (%s); the next try discards it",
                                batch.id, file_id, type(exc).__name__)
            raise
        return Written(output_id, error_id, completed, failed)

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

    async def _close(self, writer: Writer, lines: int, tenant: str, file_id: str) -> None:
        """Complete a file that has lines; an empty one is not kept (OpenAI leaves its id null), nor what an
        earlier try may have completed under its id. A file kept counts against its tenant's file quotas
        (:mod:`inferq.queue.storage`; never refused: the batch's results must be kept)."""
        if lines:
            size = await asyncio.to_thread(writer.close)
            await self.storage.add_file(tenant, file_id, size)
            return
        await asyncio.to_thread(writer.abort)
        await asyncio.to_thread(self.store.delete, tenant, file_id)
        await self.storage.drop_file(tenant, file_id)

    async def _write_files(self, batch: Batch, end: BatchStatus, output: Writer, errors: Writer) -> tuple[int, int]:
        completed = failed = 0
        line = 0
        offset = 0
        while True:
            lines = await asyncio.to_thread(
                read_lines, self.store, batch.tenant, batch.input_file_id, offset, FINALIZE_LINES,
                max_line=self.settings.max_body_bytes, max_bytes=CHUNK_BYTES)
            if not lines:
                break
            ids = await self.redis.hmget(self.keys.batch_lines(batch.id), list(range(line, line + len(lines))))
            records = await self.lines.job_fields(ids, None)
            good = bytearray()
            bad = bytearray()
            for item, job_id, record in zip(lines, ids, records, strict=True):
                custom_id = line_custom_id(item)
                job = Job.from_hash(record) if record and "status" in record else None
                if job is not None and claimcheck.claim_of_result(job.result, job.tenant, job.id) is not None:
                    job = await self._read_back(job)
                if job_id == UNROUTED:
                    is_error, entry = True, unrouted_line(custom_id, item.data)
                elif job_id is not None and not is_job(job_id):
                    code = job_id[len(NO_JOB):]
                    is_error, entry = True, error_line(custom_id, code, NOT_RUN.get(code, code))
                else:
                    is_error, entry = output_line(custom_id, job, end, job_id)
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
            offset = lines[-1].end
            await self._renew()
            self._step(batch.id, "chunk")
        return completed, failed

    async def _write_refused(self, batch: Batch, errors: Writer) -> int:
        """The error file of a batch that failed validation: every line, with its own error or ``batch_failed``
        (valid, not run), so each line of the file is accounted for; how many lines."""
        validator = Validator(batch.endpoint, self.settings.batch_max_lines, self.lines.multimodal)
        code, message = "batch_failed", "This request was not executed: the input file has invalid lines."

        def write() -> int:
            count = 0
            pending = bytearray()
            for line in scan_lines(self.store.chunks(batch.tenant, batch.input_file_id), 0,
                                   self.settings.max_body_bytes):
                error = validator.check(line)
                if error is not None:
                    entry = error_line(line_custom_id(line), error.code, f"line {line.number}: {error.message}")
                elif line.data is None:
                    entry = error_line(line_custom_id(line), "request_too_large",
                                       f"line {line.number}: {NOT_RUN['request_too_large']}")
                else:
                    entry = error_line(line_custom_id(line), code, message)
                pending += json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
                count += 1
                if len(pending) >= CHUNK_BYTES:
                    errors.write(bytes(pending))
                    pending.clear()
            if pending:
                errors.write(bytes(pending))
            return count

        return await asyncio.to_thread(write)
