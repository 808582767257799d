"""One blocking reader per process for every long-poll waiter of a queue (``GET /v1/jobs/{id}?wait=``).

A waiter that blocks on its own job's wakeup list (``done:<id>``, ``BLMOVE``) costs a pooled connection for the
whole wait, a blocking command on the server, and three round trips (read, block, read). A long-lived process
(uvicorn, a container) serving many waiters at once does better with one reader: a single ``XREAD BLOCK`` on
the queue's ``events`` stream (every terminal transition adds an entry there, in the same script that ends the
job) wakes the waiters of the jobs it sees. Each waiter then costs a future in memory and a read of its job, and
the server runs one blocking read per process instead of one per waiter. A waiter that names the fields it wants
(the gateway's job object) is handed its job's record with the wake: the reader reads the records of every waiter
one ``XREAD`` woke in one pipelined round trip (``HMGET`` each), where each waiter would otherwise read its own.

Correctness does not rest on the reader. A waiter registers its future before it reads the job, and the reader
has fixed its starting id before any waiter registers, so a job that ends after that read is seen by the reader;
and every ``recheck_s`` a waiter still waiting reads its job's status again, so a reader that fell behind, lost
its connection, or missed an entry (a failover to a replica that lacked it, a stream trimmed under it) delays a
wake by ``recheck_s`` at most and never loses one. The reader stops after ``idle_stop_s`` without waiters (on an
injectable ``clock``) and starts again on the next one. It retries what waiting out helps (a transient fault, a full
server: inferq.redis.faults); anything else is a bug, which retrying would only repeat: the reader stops, logs it,
and fails its waiters with it (the gateway's logged 500), and the next waiter starts a reader that tries once
more.

A job this process has just submitted needs no read to be waited for: the submit names it to the reader
(:meth:`SharedWaiters.expect`) while the reader runs, before the job can end, and the reader notes its end when
it reads it. A wait for such a job registers and blocks at once when no end was noted (the job exists, it is the
tenant's, and any end is ahead of the reader's position); it reads first only when the reader was restarted
since, or noted an end (a redrive may have brought it back). One round trip less per submit-then-wait, the
commonest use; the recheck still covers a reader that loses an event.

A Lambda invocation serves one request and is frozen between invocations, where a background task would stall;
the gateway uses this only outside Lambda (``Producer.wait(shared=True)``), and the per-job list stays the
contract's wakeup for every other waiter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from inferq.queue.jobs import record_of
from inferq.redis.connection import pipelined
from inferq.redis.faults import Fault, classify

log = logging.getLogger(__name__)

READ_COUNT = 1000
"""Entries one ``XREAD`` answers at most."""
EXPECTED_MAX = 50_000
"""Jobs submitted here that :meth:`SharedWaiters.expect` keeps at most (the oldest are dropped: a wait for one of
them reads first, as for any other job)."""

Record = dict[str, str]
Wake = Record | None
"""What a waiter's future resolves with: its job's record (the fields it asked for, as ``HMGET`` found them: empty
when the job is gone), or None when it asked for none or the reader could not read it (then it reads its own)."""
_Waiter = tuple["asyncio.Future[Wake]", tuple[str, ...]]


class SharedWaiters:
    """The waiters of one queue's terminal events in one process and event loop."""

    def __init__(self, redis: Any, events_key: str, *, block_s: float, recheck_s: float = 2.0,
                 idle_stop_s: float = 10.0, job_key: Callable[[str], str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._redis = redis
        self._key = events_key
        self._job_key = job_key
        """A job's record key: without it, waiters that ask for fields are woken without them."""
        self._block_ms = max(10, int(block_s * 1000))
        self.recheck_s = recheck_s
        self._idle_stop_s = idle_stop_s
        self._clock = clock
        self._waiting: dict[str, list[_Waiter]] = {}
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started: asyncio.Future[None] | None = None
        self._last_id = "0-0"
        self._idle_since = self._clock()
        self._run_no = 0
        """Which run of the reader this is: an expectation holds only within the run it was made in."""
        self._expected: dict[str, tuple[str, int, bool]] = {}
        """Job id -> (tenant, reader run, an end was read) of the jobs submitted here (:meth:`expect`)."""
        self.wakes = 0
        """Waiters woken by an event (tests and metrics)."""
        self.reads = 0
        """``XREAD`` calls answered (tests and metrics)."""
        self.record_reads = 0
        """Round trips that read woken waiters' records (tests and metrics)."""
        self.records = 0
        """Records read for woken waiters (tests and metrics)."""

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def waiting(self, job_id: str) -> int:
        """How many waiters of the job are registered (tests and metrics)."""
        return len(self._waiting.get(job_id, ()))

    async def _ensure_started(self) -> None:
        """Start the reader (once per event loop) and wait until it has fixed the id it reads after."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or not self.running:
            self._loop = loop
            self._waiting = {}
            self._expected = {}
            self._run_no += 1
            self._started = loop.create_future()
            self._idle_since = self._clock()  # a reader started for a waiter about to register stays up
            self._task = loop.create_task(self._run(self._started), name=f"waiters {self._key}")
        assert self._started is not None
        if not self._started.done():
            await asyncio.shield(self._started)
        elif self._started.cancelled():  # the reader stopped before it fixed its start (as the shield would raise)
            raise asyncio.CancelledError

    async def register(self, job_id: str, fields: Sequence[str] = ()) -> asyncio.Future[Wake]:
        """A future resolved once an event says the job ended: with its record's ``fields`` when some are named
        (see :data:`Wake`), else with None. Register before reading the job: an end after that read is then never
        missed. Call :meth:`unregister` when done with it."""
        await self._ensure_started()
        future: asyncio.Future[Wake] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(job_id, []).append((future, tuple(fields)))
        return future

    def expect(self, job_id: str, tenant: str) -> None:
        """Note a job about to be submitted (call it before the job can end), so a wait for it here need not read it
        first (:meth:`expected`). Nothing is noted while the reader is not running: it would not see the end."""
        if not self.running or self._started is None or not self._started.done() \
                or self._loop is not asyncio.get_running_loop():
            return
        expected = self._expected
        if len(expected) >= EXPECTED_MAX:
            del expected[next(iter(expected))]
        expected[job_id] = (tenant, self._run_no, False)

    def forget(self, job_id: str) -> None:
        """Drop a job noted by :meth:`expect` (it was not accepted, or its wait is over)."""
        self._expected.pop(job_id, None)

    def expected(self, job_id: str, tenant: str | None) -> bool | None:
        """For a job submitted here (:meth:`expect`) by ``tenant`` while this run of the reader has been reading:
        whether the reader has read an end of it (True) or not yet (False: it exists, it is the tenant's, and its
        end is still ahead of the reader). None for any other job. Ask after :meth:`register`: a waiter registered
        then is woken by an end not read yet."""
        noted = self._expected.get(job_id)
        if noted is None or noted[1] != self._run_no or not self.running or (tenant is not None and noted[0] != tenant):
            return None
        return noted[2]

    def unregister(self, job_id: str, future: asyncio.Future[Wake]) -> None:
        waiters = self._waiting.get(job_id)
        if waiters is None:
            return
        self._waiting[job_id] = waiters = [w for w in waiters if w[0] is not future]
        if not waiters:
            del self._waiting[job_id]
            if not self._waiting:
                self._idle_since = self._clock()

    async def _start_id(self) -> str:
        newest = await self._redis.xrevrange(self._key, count=1)
        return newest[0][0] if newest else "0-0"

    async def _run(self, started: asyncio.Future[None]) -> None:
        backoff = 0.05
        try:
            while True:
                try:
                    if not started.done():
                        self._last_id = await self._start_id()
                        started.set_result(None)
                    if not self._waiting and self._clock() - self._idle_since > self._idle_stop_s:
                        return
                    reply = await self._redis.xread({self._key: self._last_id}, count=READ_COUNT,
                                                    block=self._block_ms)
                    backoff = 0.05
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if classify(exc) is Fault.BUG:
                        self._stop_on_bug(exc, started)
                        return
                    log.warning("waiters reader: %s; retrying (waiters recheck every %.0f s meanwhile)",
                                type(exc).__name__, self.recheck_s)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                    continue
                self.reads += 1
                woken = self._deliver(reply)
                if woken:
                    await self._wake(woken)
        finally:
            if not started.done():
                started.cancel()

    def _stop_on_bug(self, exc: Exception, started: asyncio.Future[None]) -> None:
        """A fault that waiting does not cure: log it, and hand it to whoever waits on this reader (the waiter
        starting it, the waiters registered), so each request fails with it instead of a reader retrying it
        forever in the background."""
        log.error("waiters reader: stopped by an unexpected error", exc_info=exc)
        if not started.done():
            started.set_exception(exc)
        waiting, self._waiting = self._waiting, {}
        for waiters in waiting.values():
            for future, _fields in waiters:
                if not future.done():
                    future.set_exception(exc)

    def _deliver(self, reply: Any) -> list[tuple[str, list[_Waiter]]]:
        """The waiters of the jobs an ``XREAD`` answer says ended, taken out of the registry."""
        if not reply:
            return []
        # RESP2 answers [[stream, entries]], RESP3 {stream: [entries]}
        entries = reply[0][1] if isinstance(reply, list) else next(iter(reply.values()))[0]
        woken = []
        expected = self._expected
        for entry_id, fields in entries:
            self._last_id = entry_id
            job_id = fields.get("job", "")
            noted = expected.get(job_id)
            if noted is not None:
                expected[job_id] = (noted[0], noted[1], True)
            waiters = self._waiting.pop(job_id, None)
            if waiters:
                woken.append((job_id, waiters))
        if not self._waiting:
            self._idle_since = self._clock()
        return woken

    async def _wake(self, woken: list[tuple[str, list[_Waiter]]]) -> None:
        """Resolve the woken waiters' futures, with the records they asked for read in one round trip. They are
        resolved whatever happens to the read, cancellation included (then without records: they read their own)."""
        records: dict[tuple[str, tuple[str, ...]], Record] = {}
        try:
            wanted = list(dict.fromkeys((job_id, fields) for job_id, waiters in woken for future, fields in waiters
                                        if fields and not future.done()))
            if wanted and self._job_key is not None:
                replies = await pipelined(self._redis, [("HMGET", self._job_key(job_id), *fields)
                                                        for job_id, fields in wanted])
                failed = next((reply for reply in replies if isinstance(reply, Exception)), None)
                if failed is not None:
                    raise failed
                self.record_reads += 1
                self.records += len(wanted)
                for (job_id, fields), values in zip(wanted, replies, strict=True):
                    records[job_id, fields] = record_of(fields, values)
        except Exception as exc:  # the waiters read their own: a wake is never lost to a failed read
            log.warning("waiters reader: reading the records of woken jobs failed (%s); they read their own",
                        type(exc).__name__)
        finally:
            for job_id, waiters in woken:
                for future, fields in waiters:
                    if not future.done():
                        future.set_result(records.get((job_id, fields)))
                        self.wakes += 1

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
