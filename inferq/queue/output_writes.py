"""The writes of a job's output stream (:mod:`inferq.queue.output`): a worker's appends, the fence a later attempt puts
before it continues, the close once the job has ended, and a reader's mark that the job is watched.

An attempt writes its first delta owner-checked (``appendoutput.lua`` reads the record: the holder of the delivery,
placed by byte position); its answer is the entry's id. Every later delta is **fenced**: it asks for the id after
that one (:attr:`Delta.fence`), which the stream gives only while the writer's last entry is still its last. That
write costs Valkey one ``XADD`` and its ``SPUBLISH``, no read of the record (about half the owner-checked write,
``make bench ARGS="--only ST"``). A delivery that continues after kept output fences the stream first
(:func:`fence`, ``fenceoutput.lua``), so a writer of an earlier delivery can add nothing after what it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inferq.redis.scripting import Code

CLOSED_LINGER_MS = 60_000
"""How long a closed stream (its end entry only) stays, for the readers blocked on it to wake."""


@dataclass(frozen=True)
class Fence:
    """What a writer's next fenced delta asks for: the stream id right after its last entry, and the stream's
    length once the delta is added (nothing before it lost)."""

    id: str
    length: int

    @classmethod
    def after(cls, entry_id: str, length: int) -> Fence:
        """The fence of the write after entry ``entry_id``, the stream then ``length`` entries long."""
        ms, seq = entry_id.split("-")
        return cls(f"{ms}-{int(seq) + 1}", length + 1)


@dataclass(frozen=True)
class Appended:
    """What an append answered: its code (0 or a :class:`~inferq.redis.scripting.Code`), the bytes the stream
    keeps, whether cancellation was requested, and the entry written with the stream's length then ('' when none:
    the writer's next delta is then owner-checked)."""

    code: int
    kept: int
    cancel: bool
    entry: str = field(default="", compare=False)
    length: int = field(default=0, compare=False)

    @property
    def fence(self) -> Fence | None:
        """What the writer's next delta asks for: the id after the entry written."""
        return Fence.after(self.entry, self.length) if self.entry else None


@dataclass(frozen=True)
class Delta:
    """One delta to append: whose (the job, and the delivery's entry and lease), where, what, the stream's expiry
    (``ttl_s``, given by an owner-checked write), and what it asks for (``fence``; None: owner-checked)."""

    job_id: str
    entry_id: str
    lease: str
    position: int
    text: str
    tokens: int
    ttl_s: int
    fence: Fence | None = None


@dataclass(frozen=True)
class Kept:
    """The output earlier attempts kept: its text, its bytes, and its tokens as the backends counted them."""

    text: str = ""
    tokens: int = 0

    @property
    def size(self) -> int:
        return len(self.text.encode())


@dataclass(frozen=True)
class Fenced:
    """What :func:`fence` answered: its code, the output kept before the fence, what the delivery's first delta asks
    for (None when refused), and whether cancellation was requested."""

    code: int
    kept: Kept
    fence: Fence | None
    cancel: bool = False


def append_call(queue: Any, items: Sequence[Delta]) -> tuple[str, list[str], list[Any]]:
    """The ``appendoutput`` script call of the deltas ``items`` (:data:`~inferq.queue.core.SCRIPT_BATCH` at
    most)."""
    keys: list[str] = []
    args: list[Any] = [queue.settings.output_max_bytes]
    for d in items:
        if d.fence is not None:
            keys.append(queue.keys.out(d.job_id))
            args += ["f", d.fence.id, d.fence.length, d.position, d.text, d.tokens]
        else:
            keys += [queue.keys.job(d.job_id), queue.keys.out(d.job_id)]
            # an owner-checked write (an attempt's first, or a resend that may make the stream again) gives the
            # stream its expiry
            args += ["c", d.entry_id, d.lease, d.position, d.text, d.tokens, d.ttl_s]
    return ("appendoutput", keys, args)


async def append_many(queue: Any, items: Sequence[Delta]) -> list[Appended]:
    """Append the deltas ``items`` in one round trip, one script call per
    :data:`~inferq.queue.core.SCRIPT_BATCH` of them; one answer each, in order (see ``appendoutput.lua``). A fenced
    delta past ``INFERQ_OUTPUT_MAX_BYTES`` is answered ``OUTPUT_FULL`` here, unsent (the script leaves that check
    of a fenced delta to its writer)."""
    from inferq.queue.core import chunks

    limit = queue.settings.output_max_bytes
    full = {i for i, d in enumerate(items) if d.fence is not None and d.position + len(d.text.encode()) > limit}
    sent = [d for i, d in enumerate(items) if i not in full]
    parts = list(chunks(sent))
    replies = await queue.scripts.many([append_call(queue, part) for part in parts]) if parts else []
    answers = iter([_answer(d, r) for part, reply in zip(parts, replies, strict=True)
                    for d, r in zip(part, [0] * len(part) if reply == 0 else reply, strict=True)])
    return [Appended(Code.OUTPUT_FULL, d.position, False) if i in full else next(answers)
            for i, d in enumerate(items)]


def _answer(d: Delta, reply: Any) -> Appended:
    if isinstance(reply, list):  # owner-checked
        entry = reply[3]
        return Appended(int(reply[0]), int(reply[1]), bool(int(reply[2])), entry, int(reply[4]) if entry else 0)
    if int(reply) == 0 and d.fence is not None:  # fenced, written: the id it asked for
        return Appended(0, d.position + len(d.text.encode()), False, d.fence.id, d.fence.length)
    return Appended(int(reply), 0, False)


async def append(queue: Any, job_id: str, entry_id: str, lease: str, position: int, text: str, tokens: int, *,
                 ttl_s: int, fence: Fence | None = None) -> Appended:
    """Append ``text`` at byte ``position`` of the job's output, as the holder of delivery ``entry_id`` with
    ``lease`` (``fence``: the id it asks for instead); see ``appendoutput.lua``."""
    [appended] = await append_many(queue, [Delta(job_id, entry_id, lease, position, text, tokens, ttl_s,
                                                 fence)])
    return appended


async def fence(queue: Any, job_id: str, entry_id: str, lease: str, ttl_s: int) -> Fenced:
    """Fence the job's output stream for the delivery ``entry_id`` holding ``lease`` and read the output kept
    before the fence (``fenceoutput.lua``): what a later attempt continues after."""
    # replicated (INFERQ_REDIS_WAIT_REPLICAS): a failover that kept the delivery's start must keep its fence too, or
    # a writer of an earlier delivery could write again where the fence was
    [reply] = await queue._write([("fenceoutput", [queue.keys.job(job_id), queue.keys.out(job_id)],
                                   [entry_id, lease, ttl_s])], replicated=True)
    code = int(reply[0])
    if code != 0:
        return Fenced(code, Kept(), None)
    entries = pairs(reply[3])
    return Fenced(0, kept_of(entries), Fence.after(reply[1], len(entries) + 1), bool(int(reply[2])))


def close_call(queue: Any, job_ids: Sequence[str]) -> tuple[str, list[str], list[Any]]:
    keys = [key for job_id in job_ids for key in (queue.keys.job(job_id), queue.keys.out(job_id))]
    return ("closeoutput", keys, [CLOSED_LINGER_MS])


async def close(queue: Any, job_ids: Sequence[str]) -> None:
    """Close the output streams of jobs that have ended (one round trip, one script call per
    :data:`~inferq.queue.core.SCRIPT_BATCH` of them); a job that goes on keeps its output."""
    from inferq.queue.core import chunks

    if job_ids:
        await queue.scripts.many([close_call(queue, part) for part in chunks(job_ids)])


async def watch(queue: Any, job_id: str, tenant: str) -> bool:
    """Mark a running or queued job of ``tenant`` as watched (``watchoutput.lua``): its worker writes its output as it
    is made from now on. False when the job is unknown, another tenant's or has ended."""
    return bool(await queue.scripts("watchoutput", [queue.keys.job(job_id)], [tenant]))


async def kept(queue: Any, job_id: str) -> Kept:
    """The output kept for ``job_id`` by its earlier attempts: the stream's text from its start, as far as it is
    contiguous."""
    return kept_of(await queue.redis.xrange(queue.keys.out(job_id), "-", "+"))


def kept_of(entries: Sequence[tuple[str, dict[str, str]]]) -> Kept:
    """The kept output that ``entries`` (a stream's, from its start) spell, as far as it is contiguous."""
    text, tokens, offset = [], 0, 0
    for _, fields in entries:
        delta = entry_delta(fields)
        if delta is None:
            continue
        at, said, counted = delta
        raw = said.encode()
        if at > offset or at + len(raw) <= offset:
            continue  # a gap (nothing to continue after it) or bytes already had
        text.append(raw[offset - at:].decode())
        offset = at + len(raw)
        tokens = counted
    return Kept("".join(text), tokens)


def entry_delta(fields: dict[str, str]) -> tuple[int, str, int] | None:
    """An entry's (position, text, tokens); None for the end entry, a fence (or anything else)."""
    at, said = fields.get("p"), fields.get("t")
    if at is None or said is None:
        return None
    return int(at), said, int(fields.get("k") or 0)



def pairs(entries: Any) -> list[tuple[str, dict[str, str]]]:
    """Stream entries as ``[(id, fields)]``: an ``XRANGE`` through :func:`~inferq.redis.connection.pipelined`, or a
    script's, answers each entry's fields as a flat field/value list."""
    out = []
    for entry_id, fields in entries or ():
        if isinstance(fields, list):
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        out.append((entry_id, fields))
    return out
