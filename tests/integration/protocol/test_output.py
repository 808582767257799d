"""A job's output stream (inferq/queue/output.py, appendoutput.lua, closeoutput.lua) against a real Valkey, standalone
and in cluster mode, each also with every script call resent (conftest.py): owner-checked appends placed by their
position, the kept output a later attempt continues after, and readers that follow it and end on the final text."""

from __future__ import annotations

import asyncio

from inferq.queue import output
from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.output import Cursor, OutputReader
from inferq.queue.protocol import Delivery, Queue
from inferq.redis.scripting import Code
from tests.support.blocked import blocked_in
from tests.support.waiting import eventually_async

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


async def running(q: Queue, consumer: str = "w1") -> Delivery:
    await q.enqueue("t", JobRequest(body=dict(CHAT)))
    [delivery], _ = await q.read(consumer, 1)
    return delivery


async def put(q: Queue, d: Delivery, position: int, text: str, tokens: int = 1) -> output.Appended:
    return await output.append(q, d.job.id, d.entry_id, d.lease, position, text, tokens, ttl_s=600)


def result(text: str) -> dict[str, object]:
    return {"status_code": 200, "body": {"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}}


async def test_appends_are_placed_by_position_and_a_reader_follows_them(q: Queue) -> None:
    d = await running(q)
    assert await put(q, d, 0, "Hel", 1) == output.Appended(0, 3, False)
    assert await put(q, d, 3, "lo ✓", 2) == output.Appended(0, 9, False)  # bytes, not characters
    assert (await q.get(d.job.id)).has_output  # type: ignore[union-attr]
    reader = OutputReader(q, d.job.id, "t")
    page = await reader.read(Cursor())
    assert [x["delta"] for x in page.deltas] == ["Hel", "lo ✓"] and [x["index"] for x in page.deltas] == [0, 1]
    assert not page.done and page.to_api()["status"] == "running"
    assert (await reader.read(page.cursor)).deltas == []
    assert await put(q, d, 9, "!", 3) == output.Appended(0, 10, False)
    again = await reader.read(page.cursor)
    assert again.deltas == [{"index": 2, "delta": "!"}]
    assert await output.kept(q, d.job.id) == output.Kept("Hello ✓!", 3)


async def test_an_append_resent_or_late_adds_nothing_and_one_out_of_place_says_where_to_send_from(q: Queue) -> None:
    d = await running(q)
    await put(q, d, 0, "abc")
    assert await put(q, d, 0, "abc") == output.Appended(0, 3, False)  # a resend: already there
    assert await put(q, d, 0, "ab") == output.Appended(0, 3, False)
    assert await put(q, d, 5, "xyz") == output.Appended(Code.MISPLACED, 3, False)  # a gap: nothing written
    assert await put(q, d, 2, "cde") == output.Appended(Code.MISPLACED, 3, False)  # an overlap: nothing written
    assert len(await q.redis.xrange(q.keys.out(d.job.id))) == 1


async def test_only_the_holder_of_a_running_delivery_may_append(q: Queue) -> None:
    d = await running(q)
    await put(q, d, 0, "one ")
    stale = Delivery(d.entry_id, d.job, lease="not-the-lease", lane=d.lane)
    assert (await put(q, stale, 4, "two")).code == Code.STALE_OWNER
    # reclaimed by another worker (claim_idle_ms=0): the first holder's appends write nothing more
    [taken], _ = await q.reclaim("w2", 1)
    assert (await put(q, d, 4, "two")).code == Code.STALE_OWNER
    assert await put(q, taken, 4, "two") == output.Appended(0, 7, False)
    assert await q.finish(taken, JobStatus.SUCCEEDED, result=result("one two")) is not None
    assert (await put(q, taken, 7, "!")).code == Code.TERMINAL
    assert (await output.append(q, "job_none", "1-1", "x", 0, "a", 1, ttl_s=60)).code == Code.NOT_FOUND


async def test_an_append_answers_a_cancellation_request(q: Queue) -> None:
    d = await running(q)
    await q.cancel("t", d.job.id)
    assert await put(q, d, 0, "a") == output.Appended(0, 1, True)


async def test_the_stream_holds_at_most_its_bytes(q: Queue) -> None:
    d = await running(q)
    small = q.settings.replace(output_max_bytes=1024)
    q.settings = small
    assert (await put(q, d, 0, "x" * 1000)).code == 0
    assert await put(q, d, 1000, "y" * 100) == output.Appended(Code.OUTPUT_FULL, 1000, False)


async def test_a_closed_stream_ends_in_one_entry_and_the_reader_takes_the_rest_from_the_result(q: Queue) -> None:
    d = await running(q)
    await put(q, d, 0, "Hello")
    reader = OutputReader(q, d.job.id, "t")
    seen = await reader.read(Cursor())
    await q.finish(d, JobStatus.SUCCEEDED, result=result("Hello world"))
    await output.close(q, [d.job.id])
    entries = await q.redis.xrange(q.keys.out(d.job.id))
    assert [fields for _, fields in entries] == [{"end": "succeeded"}]
    assert 0 < await q.redis.pttl(q.keys.out(d.job.id)) <= output.CLOSED_LINGER_MS
    assert not (await q.get(d.job.id)).has_output  # type: ignore[union-attr]
    last = await reader.read(seen.cursor)
    assert last.done and last.deltas == [{"index": 1, "delta": " world"}]
    fresh = await reader.read(Cursor())  # a reader that comes after the end gets the whole text
    assert fresh.done and fresh.deltas == [{"index": 0, "delta": "Hello world"}]
    assert (await reader.read(last.cursor)).deltas == []


async def test_a_job_that_goes_on_keeps_its_output_for_the_next_attempt(q: Queue) -> None:
    d = await running(q)
    await put(q, d, 0, "Hel", 1)
    await put(q, d, 3, "lo", 2)
    await q.release(d)
    await output.close(q, [d.job.id])  # not ended: nothing closed
    [again], _ = await q.read("w2", 1)
    assert again.job.has_output
    kept = await output.kept(q, again.job.id)
    assert kept == output.Kept("Hello", 2) and kept.size == 5
    assert (await put(q, again, kept.size, " world", 3)).code == 0
    page = await OutputReader(q, d.job.id, "t").read(Cursor())
    assert "".join(x["delta"] for x in page.deltas) == "Hello world"


async def test_a_waiting_reader_wakes_on_the_first_delta_and_on_the_end(q: Queue) -> None:
    d = await running(q)
    reader = OutputReader(q, d.job.id, "t", slice_s=5.0)
    before = await blocked_in(q.redis, "xread")

    async def blocked() -> bool:
        return await blocked_in(q.redis, "xread") > before

    waiting = asyncio.create_task(reader.read(Cursor(), wait_s=10.0))
    await eventually_async(blocked, what="the reader blocked on the job's output")
    assert not waiting.done()  # nothing came early
    await put(q, d, 0, "Hi")
    page = await asyncio.wait_for(waiting, 3.0)  # well inside the slice: woken by the append
    assert page.deltas == [{"index": 0, "delta": "Hi"}] and not page.done
    ending = asyncio.create_task(reader.read(page.cursor, wait_s=10.0))
    await q.finish(d, JobStatus.SUCCEEDED, result=result("Hi there"))
    await output.close(q, [d.job.id])  # the end entry wakes it
    last = await asyncio.wait_for(ending, 3.0)
    assert last.done and last.deltas == [{"index": 1, "delta": " there"}]


async def test_a_reader_learns_the_end_of_a_job_whose_stream_nobody_closed(q: Queue) -> None:
    await q.enqueue("t", JobRequest(body=dict(CHAT)))
    [d], _ = await q.read("w1", 1)
    await q.cancel("t", d.job.id)
    await q.finish(d, JobStatus.CANCELLED, error={"type": "cancelled", "message": "x"})
    page = await OutputReader(q, d.job.id, "t", slice_s=0.1).read(Cursor(), wait_s=5.0)
    assert page.done and page.deltas == [] and page.to_api()["status"] == "cancelled"


async def test_follow_yields_pages_as_output_arrives_until_done(q: Queue) -> None:
    d = await running(q)
    reader = OutputReader(q, d.job.id, "t", slice_s=5.0)
    pages = reader.follow(Cursor())
    first = await pages.__anext__()
    assert first.deltas == [] and not first.done
    nxt = asyncio.create_task(pages.__anext__())
    await put(q, d, 0, "a")
    assert (await asyncio.wait_for(nxt, 3.0)).deltas == [{"index": 0, "delta": "a"}]
    await q.finish(d, JobStatus.SUCCEEDED, result=result("ab"))
    await output.close(q, [d.job.id])
    last = await asyncio.wait_for(pages.__anext__(), 3.0)
    assert last.done and last.deltas == [{"index": 1, "delta": "b"}]


async def test_another_tenants_job_is_unknown_to_a_reader(q: Queue) -> None:
    d = await running(q)
    assert (await OutputReader(q, d.job.id, "other").read(Cursor())).job is None
    assert (await OutputReader(q, "job_unknown", "t").read(Cursor())).job is None


async def test_an_entry_past_the_readers_offset_is_passed_over_until_the_bytes_come_again(q: Queue) -> None:
    # what a failover that lost appends leaves: the writer is told where the stream ends and sends from there
    d = await running(q)
    await put(q, d, 0, "abc")
    reader = OutputReader(q, d.job.id, "t")
    seen = await reader.read(Cursor())
    key = q.keys.out(d.job.id)
    await q.redis.xadd(key, {"p": "6", "t": "ghi", "k": "3"})  # as if "def" had been lost
    skipped = await reader.read(seen.cursor)
    assert skipped.deltas == [] and skipped.cursor.offset == 3
    await q.redis.xadd(key, {"p": "3", "t": "defghi", "k": "3"})
    assert (await reader.read(skipped.cursor)).deltas == [{"index": 1, "delta": "defghi"}]


def test_a_cursor_round_trips_and_anything_else_is_refused() -> None:
    cursor = Cursor("1764400000000-3", 12, 4)
    assert Cursor.parse(str(cursor)) == cursor
    assert Cursor.parse(None) == Cursor()
    for bad in ("", "abc", "1-2.3", "1-2.-3.4", "1-2.3.4.5", "x-2.3.4"):
        assert Cursor.parse(bad) is None


def test_the_first_choice_text_of_chat_and_completions() -> None:
    assert output.first_choice_text(result("x")["body"]) == "x"
    assert output.first_choice_text({"choices": [{"index": 1, "text": "b"}, {"index": 0, "text": "a"}]}) == "a"
    assert output.first_choice_text({"choices": [{"index": 0, "message": {"content": None}}]}) is None
    assert output.first_choice_text("text") is None


async def test_a_fenced_append_asks_for_the_id_after_the_writers_last_and_reads_nothing_else(q: Queue) -> None:
    d = await running(q)
    first = await put(q, d, 0, "Hel", 1)
    assert first == output.Appended(0, 3, False) and first.fence is not None
    second = await output.append(q, d.job.id, "", "", 3, "lo", 2, ttl_s=600, fence=first.fence)
    assert second == output.Appended(0, 5, False)
    assert first.fence is not None and second.entry == first.fence.id
    third = await output.append(q, d.job.id, "", "", 5, "!", 3, ttl_s=600, fence=second.fence)
    assert third.code == 0
    ids = [entry_id for entry_id, _ in await q.redis.xrange(q.keys.out(d.job.id))]
    assert ids == [first.entry, second.entry, third.entry]
    assert await output.kept(q, d.job.id) == output.Kept("Hello!", 3)


async def test_a_later_delivery_fences_the_stream_and_an_earlier_writer_adds_nothing_after_it(q: Queue) -> None:
    d = await running(q)
    said = await put(q, d, 0, "Hel", 1)
    said = await output.append(q, d.job.id, "", "", 3, "lo", 2, ttl_s=600, fence=said.fence)
    await q.release(d)
    [again], _ = await q.read("w2", 1)
    # the earlier writer, its lease gone, still writes once before the fence: the fence's read includes it
    late = await output.append(q, d.job.id, "", "", 5, " ", 3, ttl_s=600, fence=said.fence)
    assert late.code == 0
    fenced = await output.fence(q, again.job.id, again.entry_id, again.lease, 600)
    assert fenced.code == 0 and fenced.kept == output.Kept("Hello ", 3)
    # after the fence: neither of its ways adds anything
    assert (await output.append(q, d.job.id, "", "", 6, "stale", 4, ttl_s=600, fence=late.fence)
            ).code == Code.FENCED
    assert (await put(q, d, 6, "stale", 4)).code == Code.STALE_OWNER
    assert (await output.fence(q, d.job.id, d.entry_id, d.lease, 600)).code == Code.STALE_OWNER
    ours = await output.append(q, again.job.id, "", "", 6, "world", 5, ttl_s=600, fence=fenced.fence)
    assert ours.code == 0
    assert await output.kept(q, d.job.id) == output.Kept("Hello world", 5)


async def test_a_fenced_append_after_lost_entries_adds_nothing_and_the_writer_resends_owner_checked(q: Queue
                                                                                                    ) -> None:
    d = await running(q)
    said = await put(q, d, 0, "abc", 1)
    said = await output.append(q, d.job.id, "", "", 3, "def", 2, ttl_s=600, fence=said.fence)
    # what a failover that lost the last append leaves: the stream as it was before it, its last id included
    before = [(entry_id, fields) for entry_id, fields in await q.redis.xrange(q.keys.out(d.job.id))
              if entry_id != said.entry]
    await q.redis.delete(q.keys.out(d.job.id))
    for entry_id, fields in before:
        await q.redis.xadd(q.keys.out(d.job.id), fields, id=entry_id)
    lost = await output.append(q, d.job.id, "", "", 6, "ghi", 3, ttl_s=600, fence=said.fence)
    assert lost.code == Code.FENCED and await q.redis.xrange(q.keys.out(d.job.id)) == before
    assert await put(q, d, 6, "ghi", 3) == output.Appended(Code.MISPLACED, 3, False)
    assert (await put(q, d, 3, "defghi", 3)).code == 0
    assert await output.kept(q, d.job.id) == output.Kept("abcdefghi", 3)


async def test_a_fenced_append_to_a_closed_or_gone_stream_adds_nothing(q: Queue) -> None:
    d = await running(q)
    said = await put(q, d, 0, "abc", 1)
    await q.finish(d, JobStatus.SUCCEEDED, result=result("abc"))
    await output.close(q, [d.job.id])
    closed = await q.redis.xrange(q.keys.out(d.job.id))
    assert (await output.append(q, d.job.id, "", "", 3, "x", 2, ttl_s=600, fence=said.fence)
            ).code == Code.FENCED
    assert await q.redis.xrange(q.keys.out(d.job.id)) == closed
    await q.redis.delete(q.keys.out(d.job.id))
    assert (await output.append(q, d.job.id, "", "", 3, "x", 2, ttl_s=600, fence=said.fence)
            ).code == Code.FENCED
    assert not await q.redis.exists(q.keys.out(d.job.id))  # NOMKSTREAM: a gone stream is not made again


async def test_a_fenced_append_past_the_most_bytes_is_answered_full_unsent(q: Queue) -> None:
    q.settings = q.settings.replace(output_max_bytes=5)
    d = await running(q)
    said = await put(q, d, 0, "abc", 1)
    full = await output.append(q, d.job.id, "", "", 3, "def", 2, ttl_s=600, fence=said.fence)
    assert full == output.Appended(Code.OUTPUT_FULL, 3, False)
    assert await output.kept(q, d.job.id) == output.Kept("abc", 1)


async def test_a_redriven_job_starts_its_output_again(q: Queue) -> None:
    d = await running(q)
    said = await put(q, d, 0, "first run", 1)
    assert said.code == 0
    error = {"type": "server_error", "message": "boom"}
    assert (await q.retry(d, delay_ms=0, error=error, dead_letter="max_attempts")).value == "dead_lettered"
    await q.redrive("t", d.job.id)  # the stream was never closed: its worker wrote, then the job was dead-lettered
    assert not await q.redis.exists(q.keys.out(d.job.id))
    [again], _ = await q.read("w2", 1)
    assert not again.job.has_output  # nothing kept to continue after: its first write starts the stream afresh
    first = await put(q, again, 0, "second", 1)
    assert first.code == 0 and first.length == 1
    assert await output.kept(q, d.job.id) == output.Kept("second", 1)


async def test_a_fence_is_written_as_the_delivery_start_is_when_replicas_must_acknowledge(q: Queue) -> None:
    d = await running(q)
    await put(q, d, 0, "kept", 1)
    await q.release(d)
    [again], _ = await q.read("w2", 1)
    calls: list[int] = []
    real = q.scripts.replicated

    async def counted(calls_: list[tuple[str, list[str], list[object]]], replicas: int, timeout_ms: int
                      ) -> list[object]:
        calls.append(replicas)
        return await real(calls_, 0, timeout_ms)  # no replica here: WAIT 0 answers at once

    q.settings = q.settings.replace(redis_wait_replicas=1)
    q.scripts.replicated = counted  # type: ignore[method-assign]
    fenced = await output.fence(q, again.job.id, again.entry_id, again.lease, 600)
    assert fenced.code == 0 and fenced.kept.text == "kept" and calls == [1]
