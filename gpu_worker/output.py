"""A job attempt's output, on its way from the backend to the job's output stream (:mod:`inferq.queue.output`).

The backend writes the first choice's text as it is made (:class:`OutputWriter` is its
:class:`~gpu_worker.backends.base.Output`); the writer sends it to Redis in batches, as the holder of the delivery
(``appendoutput.lua``: its first batch owner-checked and placed by its byte position, so a resend adds nothing;
each later one fenced, asking for the stream id after its last, which costs Valkey half as much; a fenced batch
refused is sent again owner-checked, which says what holds). An attempt that continues after kept output fences
the stream before it writes (``fenceoutput.lua``), reading the kept output in the same step:

- only while someone watches the job (its record's ``watch``: the front door's ``stream: true``, or a reader of
  ``GET /v1/jobs/{id}/stream``, which the worker learns at the start or from a lease renewal: :meth:`go_live`). A job
  nobody watches costs Redis nothing more while it runs: its result has the whole text;
- the first piece at once (the time to first token), then one write per interval with everything made meanwhile,
  or sooner once ``INFERQ_OUTPUT_FLUSH_TOKENS`` tokens wait. The interval starts at ``INFERQ_OUTPUT_FLUSH_MS`` and
  doubles after each write up to ``INFERQ_OUTPUT_FLUSH_MAX_MS``: a short answer comes in several pieces, and the
  Valkey cost of a streamed job is bounded by its run time, not its tokens, within twice an unstreamed job's for a
  10-second answer (docs/benchmarks.md, ST). The intervals of every job of a worker end on the same ticks
  (multiples of ``INFERQ_OUTPUT_FLUSH_MS`` on the event loop's clock), so their writes go together: one script call
  for all (:class:`Appends`);
- an attempt that does not succeed (a retry, a timeout, a hand-back at shutdown) writes all it made before its
  outcome (:meth:`settle`), watched or not, so the next attempt continues after it and the deltas always spell the
  final text.

Writing the output is best effort: a Redis fault delays a batch to the next flush, and nothing here fails a job or
the worker (the result is written as always). An owner-checked append's answer also says when cancellation was
requested: the writer aborts the job at once (``on_cancel``); a fenced one reads nothing but its stream, and the
lease renewal (at least once a second) tells of a cancel then.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from inferq.config.settings import Settings
from inferq.queue import output
from inferq.queue.output import Kept
from inferq.queue.protocol import Delivery
from inferq.redis.coalescing import Coalescer
from inferq.redis.faults import Fault, classify
from inferq.redis.scripting import Code

log = logging.getLogger(__name__)

SETTLE_WRITES = 3
"""Writes :meth:`OutputWriter.settle` tries at most (a misplaced batch is sent again from where the stream ends)."""


class Appends:
    """A worker's appends of output, and its closes: those of its jobs that are due in the same turn of the event
    loop go in one round trip and one script call (:class:`~inferq.redis.coalescing.Coalescer`)."""

    def __init__(self, queue: Any) -> None:
        self._coalescer: Coalescer[output.Delta, output.Appended] = Coalescer(partial(output.append_many, queue))
        self._closes: Coalescer[str, None] = Coalescer(partial(_close_many, queue))

    async def __call__(self, delta: output.Delta) -> output.Appended:
        return await self._coalescer.submit(delta)

    async def close(self, job_id: str) -> None:
        await self._closes.submit(job_id)


async def _close_many(queue: Any, job_ids: list[str]) -> list[None]:
    await output.close(queue, job_ids)
    return [None] * len(job_ids)


async def output_for(queue: Any, settings: Settings, delivery: Delivery, body: dict[str, Any], timeout_s: float,
                     on_cancel: Callable[[], object], appends: Appends | None = None) -> OutputWriter | None:
    """The writer of an attempt's output, continuing after what earlier attempts kept (read only when the record
    says there is some); None for a request whose output cannot stream (:func:`~gpu_worker.backends.base.continuable`:
    it is answered whole)."""
    from .backends.base import continuable

    job = delivery.job
    if not continuable(job.url, body) or not job.continuation:  # opted out: every attempt starts over, whole
        return None
    ttl_s = int(timeout_s) + settings.result_ttl_s
    kept, fence = Kept(), None
    if job.has_output:  # fenced first: a writer of an earlier delivery adds nothing after what is read here
        fenced = await output.fence(queue, job.id, delivery.entry_id, delivery.lease, ttl_s)
        kept, fence = fenced.kept, fenced.fence
        if fenced.cancel:
            on_cancel()
    return OutputWriter(queue, delivery, kept, live=job.watched, flush_ms=settings.output_flush_ms,
                        flush_tokens=settings.output_flush_tokens, ttl_s=ttl_s, on_cancel=on_cancel,
                        appends=appends, fence=fence, flush_max_ms=settings.output_flush_max_ms)


class OutputWriter:
    """The output of one attempt of one job."""

    def __init__(self, queue: Any, delivery: Delivery, kept: Kept, *, live: bool, flush_ms: int, flush_tokens: int,
                 ttl_s: int, on_cancel: Callable[[], object] | None = None, appends: Appends | None = None,
                 fence: output.Fence | None = None, flush_max_ms: int = 0) -> None:
        self.queue = queue
        self.appends = appends or Appends(queue)
        self.delivery = delivery
        self.kept = kept.text
        self.kept_tokens = kept.tokens
        self.live = live
        self.flush_s = flush_ms / 1000.0
        self.flush_max_s = max(flush_ms, flush_max_ms) / 1000.0
        """The longest interval: it starts at ``flush_s`` and doubles after each write up to this."""
        self.flush_tokens = flush_tokens
        self.ttl_s = ttl_s
        self.on_cancel = on_cancel
        self._made: list[str] = [kept.text] if kept.text else []
        self._size = kept.size
        """Bytes of the output so far, kept included."""
        self._tokens = kept.tokens
        self._sent = kept.size
        """Bytes the stream holds, as far as its answers said."""
        self._unsent: list[str] = []
        self._unsent_tokens = 0
        self._fence = fence
        """What this attempt's next batch asks for (None: its next batch is owner-checked)."""
        self._last_flush: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.wrote = kept.size > 0
        """Whether the job has output in its stream (kept, or written here): it is closed once the job ends."""
        self.writes = 0
        """Appends sent (tests, benchmarks)."""
        self._written = 0
        """Appends that wrote: the interval doubles after each."""
        self.first_at: float | None = None
        """When this attempt wrote its first token (``time.monotonic()``): with :attr:`made`, its rate."""
        self.expected: int | None = None
        """The tokens this attempt will write in all, when its backend said (:meth:`expect`)."""

    @property
    def interval_s(self) -> float:
        """The interval after the last write: ``flush_s`` after the first, doubling after each, up to
        ``flush_max_s``."""
        return min(self.flush_s * 2 ** min(max(self._written - 1, 0), 30), self.flush_max_s)

    @property
    def made(self) -> int:
        """Tokens this attempt has written (the kept ones not counted)."""
        return self._tokens - self.kept_tokens

    # ------------------------------------------------------------------ what the backend calls

    def write(self, delta: str, tokens: int = 1) -> None:
        if not delta:
            return
        if self.first_at is None:
            self.first_at = time.monotonic()
        self._made.append(delta)
        self._size += len(delta.encode())
        self._tokens += tokens
        self._unsent.append(delta)
        self._unsent_tokens += tokens
        if self.live:
            self._schedule()

    def expect(self, tokens: int) -> None:
        self.expected = max(tokens, 0)

    # ------------------------------------------------------------------ what the worker calls

    def go_live(self) -> None:
        """Someone watches the job now: write what was made at once, and the rest as it comes."""
        if not self.live:
            self.live = True
            if self._unsent:
                self._schedule()

    async def settle(self, succeeded: bool) -> None:
        """The backend call is over. A success writes nothing more (its result has the whole text); anything else
        writes all the attempt made, so that the next attempt continues after it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            await asyncio.shield(self._task)
        if succeeded:
            return
        for _ in range(SETTLE_WRITES):
            if self._stopped or not self._unsent:
                return
            await self._flush()

    async def close(self) -> None:
        """After the attempt's outcome: close the job's stream if the job has ended (one that goes on keeps its
        output for the next attempt)."""
        if self.wrote:
            try:
                await self.appends.close(self.delivery.job.id)
            except Exception as exc:  # the stream expires by itself; readers learn the end from the record
                log.warning("could not close the output stream: %s", type(exc).__name__)

    # ------------------------------------------------------------------ batching

    def _schedule(self) -> None:
        if self._stopped or self._task is not None:
            return  # a write under way schedules the next when it ends
        if self.flush_tokens and self._unsent_tokens >= self.flush_tokens:
            if self._timer is not None:
                self._timer.cancel()
            self._start()
            return
        if self._timer is not None:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._last_flush is None or not self.flush_s:
            self._start()  # the first piece at once: the time to first token
            return
        # the interval doubles after each write (the first piece's included), up to its longest; it ends on a tick
        # of the shortest interval's multiples: every job's writes on the same ticks, so they go together
        due = (math.floor((self._last_flush + self.interval_s) / self.flush_s + 1e-9)) * self.flush_s
        if due <= now:
            self._start()
        else:
            self._timer = loop.call_at(due, self._start)

    def _start(self) -> None:
        self._timer = None
        if self._task is None and not self._stopped and self._unsent:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            await self._flush()
        finally:
            self._task = None
        if self._unsent and self.live:
            self._schedule()

    async def _flush(self) -> None:
        """Send what is unsent; on the answer, move on, send again from where the stream ends, or stop."""
        text, tokens, batch_tokens = "".join(self._unsent), self._tokens, self._unsent_tokens
        self._unsent, self._unsent_tokens = [], 0
        self._last_flush = asyncio.get_running_loop().time()
        d = self.delivery
        try:
            appended = await self.appends(output.Delta(d.job.id, d.entry_id, d.lease, self._sent, text, tokens,
                                                       self.ttl_s, self._fence))
        except Exception as exc:
            if classify(exc) is Fault.BUG:
                log.exception("writing the output failed; the job goes on without streaming")
                self._stopped = True
                return
            self._unsent.insert(0, text)  # a fault to wait out: with the next batch
            self._unsent_tokens += batch_tokens
            return
        self.writes += 1
        if appended.cancel and self.on_cancel is not None:
            on_cancel, self.on_cancel = self.on_cancel, None
            on_cancel()
        self._fence = appended.fence
        if appended.code == 0:
            self._sent = appended.kept
            self.wrote = True
            self._written += 1
        elif appended.code == Code.FENCED:  # the stream is not as this writer left it: owner-checked, at once
            self._unsent.insert(0, text)
            self._unsent_tokens += batch_tokens
            self._last_flush = None
        elif appended.code == Code.MISPLACED and appended.kept <= self._size:
            # the stream ends elsewhere (a lost answer, a failover): send again from where it ends
            self._sent = appended.kept
            try:
                rest = "".join(self._made).encode()[appended.kept:].decode()
            except UnicodeDecodeError:
                self._stopped = True
                return
            self._unsent = [rest] if rest else []
        else:  # not the job's holder any more, the job ended, or the stream is full: nothing more to write
            self._stopped = True
