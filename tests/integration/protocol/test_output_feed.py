"""Following a job's output through the process's sharded pub/sub feed (inferq/queue/output_feed.py) against a real
Valkey, standalone and in cluster mode, each also with every script call resent: the deltas come as published, the
stream is read again only when something may have been missed, and a channel goes when its last follower leaves."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError, TryAgainError

from inferq.config.settings import Settings
from inferq.queue import output
from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.output import Cursor, OutputReader
from inferq.queue.output_feed import parse, unread
from inferq.queue.protocol import Delivery, Queue
from tests.support.waiting import eventually_async

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


async def running(q: Queue) -> Delivery:
    await q.enqueue("t", JobRequest(body=dict(CHAT)))
    [delivery], _ = await q.read("w1", 1)
    return delivery


async def put(q: Queue, d: Delivery, position: int, text: str) -> None:
    appended = await output.append(q, d.job.id, d.entry_id, d.lease, position, text, position + 1, ttl_s=600)
    assert appended.code == 0


def result(text: str) -> dict[str, object]:
    return {"status_code": 200, "body": {"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}}


class CountedReads:
    """Counts the follower's reads of the stream itself (OutputReader._range)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = OutputReader._range

        async def counted(reader: OutputReader, cursor: Cursor) -> Any:
            self.calls += 1
            return await real(reader, cursor)

        monkeypatch.setattr(OutputReader, "_range", counted)


async def subscribers(q: Queue, channel: str) -> int:
    """Subscribers of ``channel`` on the (one) server, asked on a plain connection (redis-py's cluster client
    misreads PUBSUB SHARDNUMSUB's answer)."""
    url = urlsplit(q.settings.redis_url)
    plain = Redis(host=url.hostname or "127.0.0.1", port=url.port or 6379, decode_responses=True)
    try:
        reply = await plain.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    finally:
        await plain.aclose()
    return int(reply[1])


async def test_deltas_come_as_published_without_reading_the_stream_again(
        q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    d = await running(q)
    reads = CountedReads(monkeypatch)
    pages = OutputReader(q, d.job.id, "t", slice_s=30.0).follow(Cursor())
    first = await pages.__anext__()
    assert first.deltas == [] and not first.done
    position = 0
    for i, text in enumerate(["Hel", "lo\nthere", " ✓"]):
        nxt = asyncio.create_task(pages.__anext__())
        await put(q, d, position, text)
        page = await asyncio.wait_for(nxt, 10.0)  # far inside the slice: handed over by the feed
        assert page.deltas == [{"index": i, "delta": text}]
        position += len(text.encode())
    assert reads.calls == 0
    assert q.output_feed.messages >= 3
    nxt = asyncio.create_task(pages.__anext__())
    await q.finish(d, JobStatus.SUCCEEDED, result=result("Hello\nthere ✓!"))
    await output.close(q, [d.job.id])  # its end entry is published too
    last = await asyncio.wait_for(nxt, 10.0)
    assert last.done and last.deltas == [{"index": 3, "delta": "!"}]
    assert reads.calls == 0


async def test_a_channel_is_shared_by_its_followers_and_goes_with_the_last(q: Queue) -> None:
    d = await running(q)
    channel = q.keys.out(d.job.id)
    one = OutputReader(q, d.job.id, "t", slice_s=30.0).follow(Cursor())
    two = OutputReader(q, d.job.id, "t", slice_s=30.0).follow(Cursor())
    await one.__anext__()
    await two.__anext__()
    assert q.output_feed.following() == 1 and await subscribers(q, channel) == 1
    waiting = [asyncio.create_task(one.__anext__()), asyncio.create_task(two.__anext__())]
    await put(q, d, 0, "ab")
    assert [(await asyncio.wait_for(w, 10.0)).deltas for w in waiting] == [[{"index": 0, "delta": "ab"}]] * 2
    await one.aclose()
    assert q.output_feed.following() == 1
    ending = asyncio.create_task(two.__anext__())
    await q.finish(d, JobStatus.SUCCEEDED, result=result("abc"))
    await output.close(q, [d.job.id])
    assert (await asyncio.wait_for(ending, 10.0)).done  # the done page leaves the feed before it is handed out
    assert q.output_feed.following() == 0
    await eventually_async(lambda: _none_subscribed(q, channel), what="the channel unsubscribed")
    await two.aclose()


async def _none_subscribed(q: Queue, channel: str) -> bool:
    return await subscribers(q, channel) == 0


async def test_a_follower_reads_the_stream_when_the_feed_lost_its_connection(
        q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    d = await running(q)
    reads = CountedReads(monkeypatch)
    pages = OutputReader(q, d.job.id, "t", slice_s=30.0).follow(Cursor())
    await pages.__anext__()
    nxt = asyncio.create_task(pages.__anext__())
    await put(q, d, 0, "a")
    assert (await asyncio.wait_for(nxt, 10.0)).deltas == [{"index": 0, "delta": "a"}]
    # the feed's connection dies; what is written while it is down is published to no one
    nxt = asyncio.create_task(pages.__anext__())
    await q.redis.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    await put(q, d, 1, "b")
    page = await asyncio.wait_for(nxt, 10.0)  # told of the loss, the follower reads the stream from its cursor
    assert page.deltas == [{"index": 1, "delta": "b"}]
    assert reads.calls >= 1
    nxt = asyncio.create_task(pages.__anext__())
    await eventually_async(lambda: _subscribed(q, d), what="the feed subscribed again")
    await put(q, d, 2, "c")
    assert (await asyncio.wait_for(nxt, 10.0)).deltas == [{"index": 2, "delta": "c"}]
    await pages.aclose()


async def _subscribed(q: Queue, d: Delivery) -> bool:
    return await subscribers(q, q.keys.out(d.job.id)) == 1


async def test_a_missed_delta_is_read_from_the_stream_and_one_read_already_is_passed_over(q: Queue) -> None:
    d = await running(q)
    reader = OutputReader(q, d.job.id, "t")
    await put(q, d, 0, "abc")
    first = await reader.read(Cursor())
    entries = await q.redis.xrange(q.keys.out(d.job.id))
    read_id = entries[-1][0]
    # a message for what the first read already had, then one that starts past it (its predecessor missed)
    assert unread(first.cursor.entry, first.cursor.offset, [(read_id, {"p": "0", "t": "abc", "k": "1"})]) == []
    later = f"{int(read_id.split('-')[0]) + 1}-0"
    assert unread(first.cursor.entry, first.cursor.offset, [(later, {"p": "5", "t": "fg", "k": "3"})]) is None
    assert unread(first.cursor.entry, first.cursor.offset, [(later, {"p": "3", "t": "de", "k": "2"})]) == [
        (later, {"p": "3", "t": "de", "k": "2"})]


def test_a_message_names_its_entry_and_anything_else_is_ignored() -> None:
    assert parse("5-1\n3\n2\nline one\nline two") == ("5-1", {"p": "3", "k": "2", "t": "line one\nline two"})
    assert parse("7-0\nend\nsucceeded") == ("7-0", {"end": "succeeded"})
    assert parse("garbage") is None
    assert parse("5-1\nx\n2\ntext") is None


async def test_a_cache_that_refuses_sharded_pub_sub_is_followed_by_blocked_reads(valkey: Any, queue_name: str) -> None:
    # a cache whose ACL (or engine) refuses SSUBSCRIBE: followers fall back to a blocked XREAD per page, as before
    writer = Queue.connect(Settings(redis_url=valkey.url, queue=queue_name))
    await writer.ensure_groups()
    admin = Redis(host=valkey.host, port=valkey.port, decode_responses=True)
    user = f"nofeed{queue_name}"
    await admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-ssubscribe")
    url = urlsplit(valkey.url)
    reader_queue = Queue.connect(Settings(redis_url=f"redis://{user}:pw@{url.hostname}:{url.port}", queue=queue_name))
    try:
        d = await running(writer)
        pages = OutputReader(reader_queue, d.job.id, "t", slice_s=30.0).follow(Cursor())
        assert (await pages.__anext__()).deltas == []
        assert reader_queue.output_feed.refused is not None
        with pytest.raises(ResponseError) as one:
            await reader_queue.output_feed.follow(reader_queue.keys.out("job_a"))
        with pytest.raises(ResponseError) as two:
            await reader_queue.output_feed.follow(reader_queue.keys.out("job_b"))
        assert one.value is not two.value  # a new one each time: a raised one keeps the frames it went through
        assert reader_queue.output_feed.following() == 0
        nxt = asyncio.create_task(pages.__anext__())
        await eventually_async(lambda: _blocked_reader(admin, user), what="the follower blocked in XREAD")
        await put(writer, d, 0, "hi")
        assert (await asyncio.wait_for(nxt, 10.0)).deltas == [{"index": 0, "delta": "hi"}]
        nxt = asyncio.create_task(pages.__anext__())
        await writer.finish(d, JobStatus.SUCCEEDED, result=result("hi!"))
        await output.close(writer, [d.job.id])
        last = await asyncio.wait_for(nxt, 10.0)
        assert last.done and last.deltas == [{"index": 1, "delta": "!"}]
        await pages.aclose()
    finally:
        await reader_queue.close()
        await writer.close()
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


async def _blocked_reader(admin: Redis, user: str) -> bool:
    clients = await admin.client_list()
    return any(c.get("user") == user and c.get("cmd") == "xread" and "b" in c.get("flags", "") for c in clients)


async def test_a_follower_cancelled_again_while_it_leaves_still_leaves(q: Queue) -> None:
    # a client gone mid-stream: Starlette cancels the response's task, and anyio again at each pause after that
    one, two = await running(q), await running(q)
    staying = OutputReader(q, one.job.id, "t", slice_s=30.0).follow(Cursor())
    leaving = OutputReader(q, two.job.id, "t", slice_s=30.0).follow(Cursor())
    await staying.__anext__()
    await leaving.__anext__()
    assert q.output_feed.following() == 2
    waiting = asyncio.create_task(leaving.__anext__())
    await asyncio.sleep(0)  # a yield: the task starts waiting for output
    for _ in range(3):
        waiting.cancel()
        await asyncio.sleep(0)
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    assert q.output_feed.following() == 1
    await eventually_async(lambda: _none_subscribed(q, q.keys.out(two.job.id)), what="the channel unsubscribed")
    nxt = asyncio.create_task(staying.__anext__())
    await put(q, one, 0, "still here")
    assert (await asyncio.wait_for(nxt, 10.0)).deltas == [{"index": 0, "delta": "still here"}]
    await staying.aclose()


async def test_a_cluster_busy_for_a_moment_does_not_turn_the_feed_off(
        q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    d = await running(q)
    feed = q.output_feed
    pages = OutputReader(q, d.job.id, "t", slice_s=30.0).follow(Cursor())
    await pages.__anext__()
    real = feed._next
    failures = [TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot")]

    async def once() -> Any:
        if failures:
            raise failures.pop()
        return await real()

    monkeypatch.setattr(feed, "_next", once)
    nxt = asyncio.create_task(pages.__anext__())
    await eventually_async(lambda: not failures, what="the feed's read failed once")
    await put(q, d, 0, "a")
    assert (await asyncio.wait_for(nxt, 10.0)).deltas == [{"index": 0, "delta": "a"}]
    assert feed.refused is None
    before = feed.messages
    nxt = asyncio.create_task(pages.__anext__())
    await put(q, d, 1, "b")
    assert (await asyncio.wait_for(nxt, 10.0)).deltas == [{"index": 1, "delta": "b"}]
    assert feed.messages == before + 1  # handed over by the feed again
    await pages.aclose()


async def test_a_follower_slow_to_subscribe_reads_what_its_fresh_job_wrote_meanwhile(
        q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    # a cluster client waits for the feed's poll before it subscribes: the job may have written already
    d = await running(q)
    await put(q, d, 0, "early")
    monkeypatch.setattr(output, "CATCH_UP_AFTER_S", 0.0)  # every subscription "slow"
    pages = OutputReader(q, d.job.id, "t", slice_s=30.0).follow(Cursor(), fresh=d.job)
    first = await asyncio.wait_for(pages.__anext__(), 10.0)
    assert first.deltas == [{"index": 0, "delta": "early"}]
    nxt = asyncio.create_task(pages.__anext__())
    await put(q, d, 5, " on")
    assert (await asyncio.wait_for(nxt, 10.0)).deltas == [{"index": 1, "delta": " on"}]
    await pages.aclose()


async def test_a_follower_slow_to_subscribe_to_a_fresh_job_that_ended_meanwhile_gets_its_whole_text(
        q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    d = await running(q)
    await put(q, d, 0, "early")
    body = {"object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "early and late"}, "finish_reason": "stop"}]}
    await q.finish(d, JobStatus.SUCCEEDED, result={"status_code": 200, "body": body})
    await output.close(q, [d.job.id])
    monkeypatch.setattr(output, "CATCH_UP_AFTER_S", 0.0)  # every subscription "slow"
    pages = OutputReader(q, d.job.id, "t", slice_s=30.0).follow(Cursor(), fresh=d.job)
    first = await asyncio.wait_for(pages.__anext__(), 10.0)
    assert first.done and "".join(delta["delta"] for delta in first.deltas) == "early and late"
    await pages.aclose()
