"""The worker's side of a job's output (gpu_worker/output.py) against a real Valkey: nothing written while nobody
watches, the first piece at once and the rest batched once watched, everything an attempt made written when it does
not succeed, a cancellation learnt from an append, and a misplaced batch sent again from where the stream ends."""

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
           flush_tokens: int = 0, on_cancel: object = None) -> OutputWriter:
    return OutputWriter(queue, d, kept, live=live, flush_ms=flush_ms, flush_tokens=flush_tokens, ttl_s=600,
                        on_cancel=on_cancel)  # type: ignore[arg-type]


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
