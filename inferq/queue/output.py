"""A job's output as it is made: the per-job output stream ``inferq:{Q}:out:<id>`` (docs/data-model.md), its writes
and its reads.

The stream holds the text of the job's first choice (``message.content`` of a chat completion, ``text`` of a
completion) in deltas, one entry each: ``p`` (UTF-8 bytes of output before it), ``t`` (its text), ``k`` (tokens of
the output up to and including it). The deltas in order always spell the final text, across attempts: a later
attempt fences the stream and reads the output kept by the earlier ones (:func:`fence`) and continues after it,
so the kept output is a prefix of the final text.

- The worker that holds the job appends (:mod:`inferq.queue.output_writes`, ``appendoutput.lua``: its first delta
  owner-checked and placed by its position so a resent append adds nothing, each later one fenced by the id of the
  one before) and, once the job has ended, closes the stream (``closeoutput.lua``): the text entries go (the result
  has the whole text), an end entry wakes the readers, the stream lingers briefly.
- A reader (:class:`OutputReader`) follows the stream from a :class:`Cursor` and, once the job has ended, takes
  what it has not read from the final result: a reader never needs the stream to learn that a job ended, and the
  deltas it hands out always spell the final text, whatever was flushed, lost in a failover or trimmed.

The job record's ``out`` field says the stream holds output (an owner-checked append sets it to the bytes kept
then, closing removes it): a worker starting an attempt fences and reads the kept output only when it is there. Its
``watch`` field says that someone reads the output while the job runs (set at enqueue by the front door's
``stream: true``, or by a reader's first read: ``watchoutput.lua``): only then does the worker write the output as
it is made. A job nobody watches writes none while it runs (its result has the whole text), only what an attempt
that did not succeed made, for the next to continue.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from inferq.queue.jobs import RECORD_FIELDS_BUT_BODY, Job, JobStatus, record_of
from inferq.queue.output_feed import Followed, unread
from inferq.queue.output_writes import (  # noqa: F401 (the writes, named here as the stream's one module)
    CLOSED_LINGER_MS,
    Appended,
    Delta,
    Fence,
    Fenced,
    Kept,
    append,
    append_call,
    append_many,
    close,
    close_call,
    entry_delta,
    fence,
    kept,
    pairs,
    watch,
)
from inferq.redis.connection import pipelined

PAGE_ENTRIES = 1000
"""Entries one read answers at most."""
CATCH_UP_AFTER_S = 0.005
"""A follower of a job it has just queued reads the stream once when subscribing took longer than this."""

_CURSOR_RE = re.compile(r"^(\d{1,20}-\d{1,20})\.(\d{1,12})\.(\d{1,12})$")


@dataclass(frozen=True)
class Cursor:
    """Where a reader is: after stream entry ``entry``, having read ``offset`` bytes of the text in ``index``
    deltas. Opaque to clients (``GET /v1/jobs/{id}/stream``'s ``cursor``/``after``)."""

    entry: str = "0-0"
    offset: int = 0
    index: int = 0

    def __str__(self) -> str:
        return f"{self.entry}.{self.offset}.{self.index}"

    @property
    def after(self) -> str:
        """The ``XRANGE`` start of what comes after the cursor's entry."""
        return f"({self.entry}" if self.entry != "0-0" else "-"

    @classmethod
    def parse(cls, text: str | None) -> Cursor | None:
        """The cursor ``text`` names; a fresh one for None; None when ``text`` is no cursor."""
        if text is None:
            return cls()
        match = _CURSOR_RE.match(text)
        if match is None:
            return None
        return cls(match.group(1), int(match.group(2)), int(match.group(3)))


# ---------------------------------------------------------------------- reading (the gateway)


def first_choice_text(body: Any) -> str | None:
    """The text of the first choice of a chat completion (``message.content``) or a completion (``text``)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices:
        return None
    first = next((c for c in choices if isinstance(c, dict) and c.get("index") == 0), choices[0])
    if not isinstance(first, dict):
        return None
    message = first.get("message")
    text = message.get("content") if isinstance(message, dict) else first.get("text")
    return text if isinstance(text, str) else None


@dataclass
class Page:
    """What one read found: the deltas (``{"index", "delta"}``), the cursor to read on from, and the job as the read
    last saw it (None: unknown, or another tenant's). ``done`` once the job has ended and its text has been handed
    out whole."""

    job: Job | None
    cursor: Cursor
    deltas: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False

    def to_api(self) -> dict[str, Any]:
        assert self.job is not None
        return {"object": "list", "data": self.deltas, "cursor": str(self.cursor), "done": self.done,
                "status": self.job.status.value}


TextOf = Callable[[Job], Awaitable[str | None]]
"""The text of a succeeded job's first choice, from its result (which may be held in S3: the gateway's claims)."""


async def result_text(job: Job) -> str | None:
    """:data:`TextOf` for results held inline."""
    return first_choice_text((job.result or {}).get("body"))


class OutputReader:
    """One reader of one job's output, for one tenant (``tenant`` None: any)."""

    def __init__(self, queue: Any, job_id: str, tenant: str | None, *, text_of: TextOf = result_text,
                 slice_s: float | None = None) -> None:
        self.queue = queue
        self.job_id = job_id
        self.tenant = tenant
        self.text_of = text_of
        self._out = queue.keys.out(job_id)
        self._job_key = queue.keys.job(job_id)
        # a blocking read never outlasts the client's socket timeout; between slices the job is looked at again
        self.slice_s = slice_s or max(0.1, queue.settings.redis_timeout_s * 0.5)

    async def read(self, cursor: Cursor, wait_s: float = 0.0, *, fresh: Job | None = None) -> Page:
        """The deltas after ``cursor``; with ``wait_s``, as soon as there are some or the job ends, whichever is
        first (at most ``wait_s`` seconds). ``fresh``: the job as this process just queued it (no output yet, and
        watched if it is to be): the wait blocks at once, one round trip sooner (the time to first token)."""
        deadline = time.monotonic() + wait_s
        if fresh is not None and wait_s > 0:
            page = Page(fresh, cursor)
            ended = False
            full = False
        else:
            page, ended, full = await self._first(cursor)
            if page.job is None:
                return page
        while not page.deltas and not full and page.job is not None and not page.job.status.terminal:
            remaining = deadline - time.monotonic()
            if remaining <= 0.005:
                break
            got = await self._block(page.cursor, min(remaining, self.slice_s))
            ended = self._apply(page, got) or ended
            if ended or not got:  # the end entry, or a slice with nothing: is the job still running?
                page.job = await self._read_job()
                if page.job is None:
                    return page
        return await self._finish(page)

    async def _first(self, cursor: Cursor) -> tuple[Page, bool, bool]:
        """The first look: the entries after the cursor and the job, in one round trip; marks a job watched."""
        entries, values = await pipelined(self.queue.redis, [
            ("XRANGE", self._out, cursor.after, "+", "COUNT", PAGE_ENTRIES),
            ("HMGET", self._job_key, *RECORD_FIELDS_BUT_BODY),
        ])
        for reply in (entries, values):
            if isinstance(reply, Exception):
                raise reply
        page = Page(self._job_of(record_of(RECORD_FIELDS_BUT_BODY, values)), cursor)
        if page.job is None:
            return page, False, False
        if not page.job.watched and not page.job.status.terminal and self.tenant is not None:
            await watch(self.queue, self.job_id, self.tenant)  # its worker writes its output from now on
        return page, self._apply(page, pairs(entries)), len(entries) >= PAGE_ENTRIES

    async def follow(self, cursor: Cursor, wait_s: float | None = None, *, fresh: Job | None = None) -> Any:
        """Pages as the output arrives, until the job ends (the last page is ``done``) or ``wait_s`` passes (None:
        no limit). The deltas come through this process's :class:`~inferq.queue.output_feed.OutputFeed`, as the
        writer publishes them; the stream is read again only when one was missed, when the feed's connection was
        lost, or when a slice passes with nothing (then the job is read too). The first page may have no deltas
        (the job as it is). ``fresh``: the job as this process just queued it (no output yet, and watched if it
        is to be): the first page is that job, with no read, unless subscribing took longer than
        :data:`CATCH_UP_AFTER_S` (a cluster client waits for its reader's poll): then the job may have written
        already, and its stream (not its record: the job is as queued unless the stream ended) is read at once."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        feed = self.queue.output_feed
        followed: Followed | None = None
        subscribing = time.monotonic()
        try:
            followed = await feed.follow(self._out)  # before the first read: nothing published after it is missed
        except ResponseError:
            pass  # the cache refuses sharded pub/sub (logged once by the feed): a blocked XREAD per page, as before
        catch_up = followed is not None and time.monotonic() - subscribing > CATCH_UP_AFTER_S
        try:
            page = Page(fresh, cursor) if fresh is not None else await self.read(cursor)
            if fresh is not None and catch_up and self._apply(page, await self._range(cursor)):
                page.job = await self._read_job()  # it ended meanwhile
                page = await self._finish(page) if page.job is not None else page
            if followed is not None and (page.job is None or page.done):
                await feed.leave(followed)  # the last page: nothing more to follow, whenever the caller closes
            yield page
            if page.job is None or page.done:
                return
            while deadline is None or time.monotonic() < deadline:
                remaining = self.slice_s if deadline is None else min(self.slice_s, deadline - time.monotonic())
                if remaining <= 0.005:
                    return
                page = Page(page.job, page.cursor)
                entries, quiet = await self._next_entries(followed, page.cursor, remaining)
                ended = self._apply(page, entries)
                if ended or quiet:
                    page.job = await self._read_job()
                page = await self._finish(page) if page.job is not None else page
                last = page.job is None or page.done
                if last and followed is not None:
                    await feed.leave(followed)
                if page.deltas or last:
                    yield page
                if last:
                    return
        finally:
            if followed is not None:
                await feed.leave(followed)

    async def _next_entries(self, followed: Followed | None, cursor: Cursor, seconds: float
                            ) -> tuple[list[tuple[str, dict[str, str]]], bool]:
        """The entries after ``cursor`` as they come (up to ``seconds``), and whether none came (a quiet slice: the
        job is worth reading). From the feed; from the stream when a message may have been missed or none came (a
        slice with nothing, a lost connection); without a feed, by a blocked ``XREAD``."""
        if followed is None:
            entries = await self._block(cursor, seconds)
            return entries, not entries
        got = await followed.take(seconds)
        published = unread(cursor.entry, cursor.offset, got[0]) if got is not None and not got[1] else None
        return (await self._range(cursor) if published is None else published), got is None

    async def _range(self, cursor: Cursor) -> list[tuple[str, dict[str, str]]]:
        entries = await self.queue.redis.xrange(self._out, cursor.after, "+", count=PAGE_ENTRIES)
        return pairs(entries)

    # ------------------------------------------------------------------ parts

    def _job_of(self, record: dict[str, str]) -> Job | None:
        if not record or "status" not in record:
            return None
        job = Job.from_hash(record)
        return None if self.tenant is not None and job.tenant != self.tenant else job

    async def _read_job(self) -> Job | None:
        values = await self.queue.redis.hmget(self._job_key, RECORD_FIELDS_BUT_BODY)
        return self._job_of(record_of(RECORD_FIELDS_BUT_BODY, values))

    async def _block(self, cursor: Cursor, seconds: float) -> list[tuple[str, dict[str, str]]]:
        reply = await self.queue.redis.xread({self._out: cursor.entry}, count=PAGE_ENTRIES,
                                             block=max(1, int(seconds * 1000)))
        if not reply:
            return []
        # RESP2 answers [[stream, entries]], RESP3 {stream: [entries]}
        return list(reply[0][1]) if isinstance(reply, list) else list(next(iter(reply.values()))[0])

    def _apply(self, page: Page, entries: list[tuple[str, dict[str, str]]]) -> bool:
        """Hand out what ``entries`` add after the page's cursor, in order; whether the end entry was among them.
        An entry that starts past the cursor's offset (bytes the stream lost: a failover) is passed over: the
        writer sends those bytes again, and the final result has them all."""
        cursor = page.cursor
        entry, offset, index = cursor.entry, cursor.offset, cursor.index
        ended = False
        for entry_id, fields in entries:
            entry = entry_id
            delta = entry_delta(fields)
            if delta is None:
                ended = ended or "end" in fields
                continue
            at, said, _ = delta
            raw = said.encode()
            if at > offset or at + len(raw) <= offset:
                continue
            page.deltas.append({"index": index, "delta": raw[offset - at:].decode()})
            index += 1
            offset = at + len(raw)
        page.cursor = Cursor(entry, offset, index)
        return ended

    async def _finish(self, page: Page) -> Page:
        """A page of a job that has ended: what the reader has not read of the final text, and ``done``."""
        job = page.job
        if job is None or not job.status.terminal:
            return page
        page.done = True
        if job.status is not JobStatus.SUCCEEDED:
            return page
        text = await self.text_of(job)
        raw = (text or "").encode()
        cursor = page.cursor
        if len(raw) > cursor.offset:
            page.deltas.append({"index": cursor.index, "delta": raw[cursor.offset:].decode(errors="replace")})
            page.cursor = Cursor(cursor.entry, len(raw), cursor.index + 1)
        return page
