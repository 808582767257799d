"""The worker's side of a job's output (gpu_worker/output.py) against a real Valkey: nothing written while nobody
watches, the first piece at once and the rest batched once watched, at intervals that double up to their longest,
everything an attempt made written when it does not succeed, a cancellation learnt from an append, later batches
fenced, a refused or misplaced batch sent again from where the stream ends, and a later attempt that fences the
stream against the writer of an earlier one."""

from __future__ import annotations

import asyncio

from gpu_worker.output import OutputWriter
from inferq.queue import output
from inferq.queue.jobs import JobRequest
from inferq.queue.output import Cursor, Kept, OutputReader
from inferq.queue.protocol import Delivery, Queue
from tests.support.waiting import eventually_async

from .support import chat


async def started(queue: Queue, **request: object) -> Delivery:
    await queue.enqueue("acme", JobRequest(body=chat("hello"), **request))  # type: ignore[arg-type]
    [delivery], _ = await queue.read("w1", 1)
    return delivery


def writer(queue: Queue, d: Delivery, *, live: bool, kept: Kept = Kept(), flush_ms: int = 10_000,
           flush_tokens: int = 0, on_cancel: object = None, flush_max_ms: int = 0,
           fence: output.Fence | None = None) -> OutputWriter:
    return OutputWriter(queue, d, kept, live=live, flush_ms=flush_ms, flush_tokens=flush_tokens, ttl_s=600,
                        on_cancel=on_cancel, flush_max_ms=flush_max_ms, fence=fence)  # type: ignore[arg-type]


async def text_of(queue: Queue, job_id: str) -> str:
    page = await OutputReader(queue, job_id, None).read(Cursor())
    return "".join(d["delta"] for d in page.deltas)


async def test_a_job_nobody_watches_writes_nothing_until_an_attempt_fails(queue: Queue) -> None:
    d = await started(queue)
    assert not d.job.watched
    w = writer(queue, d, live=False)
    for piece in ("one", " two", " three"):
        w.write(piece)
    await asyncio.sleep(0.05)  # proves nothing was sent meanwhile
    assert w.writes == 0 and await queue.redis.exists(queue.keys.out(d.job.id)) == 0
    await w.settle(succeeded=False)
    assert w.writes == 1 and await output.kept(queue, d.job.id) == Kept("one two three", 3)
    done = writer(queue, d, live=False)
    done.write("x")
    await done.settle(succeeded=True)
    assert done.writes == 0


async def test_a_watched_job_writes_the_first_piece_at_once_and_batches_the_rest(queue: Queue) -> None:
    d = await started(queue, watch=True)
    assert d.job.watched
    w = writer(queue, d, live=True, flush_ms=200)
    w.write("Hel")
    await eventually_async(lambda: text_of(queue, d.job.id), what="the first piece")
    assert w.writes == 1
    for piece in ("lo", " wor", "ld"):
        w.write(piece)
    assert await eventually_async(lambda: _is(text_of(queue, d.job.id), "Hello world"), what="the batch")
    assert w.writes == 2  # the three pieces after the first went in one write
    await w.settle(succeeded=True)


async def _is(text: object, expected: str) -> bool:
    return await text == expected  # type: ignore[misc]


async def test_enough_waiting_tokens_write_before_the_interval_is_over(queue: Queue) -> None:
    d = await started(queue, watch=True)
    w = writer(queue, d, live=True, flush_ms=60_000, flush_tokens=3)
    w.write("a")
    await eventually_async(lambda: _is(text_of(queue, d.job.id), "a"), what="the first piece")
    for piece in ("b", "c", "d"):
        w.write(piece)
    await eventually_async(lambda: _is(text_of(queue, d.job.id), "abcd"), what="the tokens' batch")


async def test_a_job_watched_later_catches_up_at_once(queue: Queue) -> None:
    d = await started(queue)
    w = writer(queue, d, live=False, flush_ms=60_000)
    w.write("made ")
    w.write("before")
    w.go_live()
    await eventually_async(lambda: _is(text_of(queue, d.job.id), "made before"), what="the catch-up")
    await w.settle(succeeded=True)


async def test_a_later_attempt_continues_after_the_kept_output(queue: Queue) -> None:
    d = await started(queue)
    first = writer(queue, d, live=False)
    first.write("Hello")
    await first.settle(succeeded=False)
    await queue.release(d)
    [again], _ = await queue.read("w2", 1)
    assert again.job.has_output
    kept = await output.kept(queue, again.job.id)
    second = writer(queue, again, live=True, kept=kept)
    assert second.kept == "Hello" and second.kept_tokens == 1
    second.write(" world")
    await eventually_async(lambda: _is(text_of(queue, d.job.id), "Hello world"), what="the continuation")


async def test_an_append_that_learns_of_a_cancellation_aborts_the_job(queue: Queue) -> None:
    d = await started(queue, watch=True)
    await queue.cancel("acme", d.job.id)
    cancelled = asyncio.Event()
    w = writer(queue, d, live=True, on_cancel=cancelled.set)
    w.write("a")
    await asyncio.wait_for(cancelled.wait(), 5.0)


async def test_a_writer_that_lost_its_delivery_stops(queue: Queue) -> None:
    d = await started(queue, watch=True)
    w = writer(queue, d, live=True, flush_ms=0)
    await queue.release(d)
    w.write("a")
    await eventually_async(lambda: _wrote(w), what="the refused append")
    w.write("b")
    await asyncio.sleep(0.05)  # proves no second append was sent
    assert w.writes == 1 and await queue.redis.exists(queue.keys.out(d.job.id)) == 0


async def _wrote(w: OutputWriter) -> bool:
    return w.writes > 0


async def test_a_misplaced_batch_is_sent_again_from_where_the_stream_ends(queue: Queue) -> None:
    d = await started(queue, watch=True)
    w = writer(queue, d, live=True, flush_ms=0)
    w.write("abc")
    await eventually_async(lambda: _is(text_of(queue, d.job.id), "abc"), what="the first piece")
    # what a failover that lost the append leaves: neither its entry nor the bytes kept it recorded
    await queue.redis.delete(queue.keys.out(d.job.id))
    await queue.redis.hdel(queue.keys.job(d.job.id), "out")
    w.write("def")
    await eventually_async(lambda: _is(text_of(queue, d.job.id), "abcdef"), what="the resend")


async def test_the_interval_doubles_after_each_write_up_to_its_longest(queue: Queue) -> None:
    d = await started(queue, watch=True)
    w = writer(queue, d, live=True, flush_ms=0, flush_max_ms=2500)
    w._written = 3
    assert w.interval_s == 0  # with no interval there is nothing to double: every delta at once
    w = writer(queue, d, live=True, flush_ms=500, flush_max_ms=2500)
    intervals = []
    for n in range(1, 7):
        w._written = n
        intervals.append(w.interval_s)
    assert intervals == [0.5, 1.0, 2.0, 2.5, 2.5, 2.5]
    steady = writer(queue, d, live=True, flush_ms=500, flush_max_ms=0)  # at or below the interval: it stays
    steady._written = 5
    assert steady.interval_s == 0.5


async def test_the_next_write_waits_for_the_doubled_interval_on_a_tick_of_the_first(queue: Queue) -> None:
    d = await started(queue, watch=True)
    w = writer(queue, d, live=True, flush_ms=1000, flush_max_ms=60_000)
    w.write("a")
    await eventually_async(lambda: _wrote(w), what="the first piece")
    for n in (1, 2, 3):
        w._written = n  # as after n writes
        w._last_flush = asyncio.get_running_loop().time()
        w.write("b")  # scheduled, not sent: the timer holds it
        assert w._timer is not None
        wait = w._timer.when() - w._last_flush
        assert w.interval_s - 1.0 < wait <= w.interval_s and w._timer.when() % 1.0 < 1e-6
        w._timer.cancel()
        w._timer = None
        w._unsent.clear()


async def test_later_batches_are_fenced_each_asking_for_the_id_after_the_last(queue: Queue) -> None:
    d = await started(queue, watch=True)
    w = writer(queue, d, live=True, flush_ms=0)
    await wrote_each(w, "one", " two", " three", " four")
    ids = [entry_id for entry_id, _ in await queue.redis.xrange(queue.keys.out(d.job.id))]
    ms = {entry_id.split("-")[0] for entry_id in ids}
    assert len(ids) == 4 and len(ms) == 1  # one owner-checked (its id by the server's clock), three fenced after it
    assert [int(entry_id.split("-")[1]) for entry_id in ids] == list(range(int(ids[0].split("-")[1]), 4 + int(
        ids[0].split("-")[1])))
    assert await text_of(queue, d.job.id) == "one two three four"


async def test_a_fenced_batch_refused_is_sent_again_owner_checked_from_where_the_stream_ends(queue: Queue) -> None:
    d = await started(queue, watch=True)
    w = writer(queue, d, live=True, flush_ms=0)
    await wrote_each(w, "abc", "def")  # the first owner-checked, the second fenced
    # what a failover that lost the last append leaves: the stream as before it, its last id included
    key = queue.keys.out(d.job.id)
    [kept, _lost] = await queue.redis.xrange(key)
    await queue.redis.delete(key)
    await queue.redis.xadd(key, kept[1], id=kept[0])
    w.write("ghi")
    await eventually_async(lambda: _is(text_of(queue, d.job.id), "abcdefghi"), what="the resend")


async def test_a_later_attempt_fences_the_stream_and_its_earlier_writer_writes_no_more(queue: Queue) -> None:
    from gpu_worker.output import output_for

    d = await started(queue, watch=True)
    first = writer(queue, d, live=True, flush_ms=0)
    await wrote_each(first, "Hello", ",")
    await queue.release(d)
    [again], _ = await queue.read("w2", 1)
    second = await output_for(queue, queue.settings, again, chat("hello"), 60.0, lambda: None)
    assert second is not None and second.kept == "Hello,"
    first.write(" stale")
    await eventually_async(lambda: _writes(first, 3), what="the stale writer's fenced write")
    await eventually_async(lambda: _writes(first, 4), what="its owner-checked resend, refused")
    second.write(" world")
    await eventually_async(lambda: _is(text_of(queue, d.job.id), "Hello, world"), what="the continuation")
    first.write(" more")  # a stopped writer schedules nothing: no write under way, none due
    assert first._task is None and first._timer is None
    assert first.writes == 4 and await text_of(queue, d.job.id) == "Hello, world"


async def _writes(w: OutputWriter, n: int) -> bool:
    return w.writes >= n


async def wrote_each(w: OutputWriter, *pieces: str) -> None:
    """Write each piece and wait until the writer has sent it (``flush_ms=0``: a write each)."""
    for piece in pieces:
        sent = w.writes + 1
        w.write(piece)
        await eventually_async(lambda sent=sent: _writes(w, sent), what=f"the write of {piece!r}")

