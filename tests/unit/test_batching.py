"""inferq.redis.batching.Batcher: what one turn submits is flushed together; with overlap, flushes do not wait for each
other; each submitter gets its own answer or the flush's exception."""

from __future__ import annotations

import asyncio

import pytest

from inferq.redis.batching import Batcher


async def test_what_one_turn_submits_is_one_flush_and_each_gets_its_own_answer() -> None:
    flushed: list[list[int]] = []

    async def flush(items: list[int]) -> list[int]:
        flushed.append(items)
        return [i * 10 for i in items]

    for overlap in (False, True):
        flushed.clear()
        batcher: Batcher[int, int] = Batcher(flush, overlap=overlap)
        assert await asyncio.gather(*(batcher.submit(i) for i in range(5))) == [0, 10, 20, 30, 40]
        assert flushed == [[0, 1, 2, 3, 4]]


async def test_with_overlap_a_turns_flush_does_not_wait_for_the_one_before() -> None:
    release = asyncio.Event()
    started: list[list[str]] = []

    async def flush(items: list[str]) -> list[str]:
        started.append(items)
        await release.wait()
        return [item.upper() for item in items]

    for overlap, in_flight in ((True, [["a"], ["b", "c"]]), (False, [["a"]])):
        release.clear()
        started.clear()
        batcher: Batcher[str, str] = Batcher(flush, overlap=overlap)
        first = batcher.put("a")
        for _ in range(3):
            await asyncio.sleep(0)
        later = [batcher.put("b"), batcher.put("c")]
        for _ in range(3):
            await asyncio.sleep(0)
        assert started == in_flight and not batcher.idle
        release.set()
        assert await first == "A" and await asyncio.gather(*later) == ["B", "C"]
        await batcher.wait_idle()
        assert batcher.idle and started == [["a"], ["b", "c"]]


async def test_a_failed_flush_fails_each_of_its_submitters_and_a_cancelled_one_leaves_the_rest() -> None:
    async def flush(items: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        if 0 in items:
            raise ConnectionError("down")
        return items

    batcher: Batcher[int, int] = Batcher(flush, overlap=True)
    failed = [batcher.put(0), batcher.put(1)]
    for future in failed:
        with pytest.raises(ConnectionError):
            await future
    kept, dropped = batcher.put(2), asyncio.ensure_future(batcher.submit(3))
    await asyncio.sleep(0)
    dropped.cancel()
    assert await kept == 2
    with pytest.raises(asyncio.CancelledError):
        await dropped
    await batcher.wait_idle()


async def test_an_error_one_item_causes_fails_only_its_submitter_when_the_batcher_splits_on_it() -> None:
    """With ``split_on``, a flush that one item spoils (an argument that cannot be encoded) is flushed again item by
    item: that item's submitter gets the error, the others their answers. Other errors still reach everyone."""
    flushed: list[list[str]] = []

    async def flush(items: list[str]) -> list[str]:
        flushed.append(items)
        if "down" in items:
            raise ConnectionError("the server is gone")
        for item in items:
            item.encode()  # a lone surrogate cannot be
        return [item.upper() for item in items]

    for overlap in (False, True):
        flushed.clear()
        batcher: Batcher[str, str] = Batcher(flush, overlap=overlap, split_on=(UnicodeEncodeError,))
        answers = await asyncio.gather(*(batcher.submit(i) for i in ("a", "\ud800", "b")), return_exceptions=True)
        assert answers[0] == "A" and answers[2] == "B" and isinstance(answers[1], UnicodeEncodeError)
        assert flushed == [["a", "\ud800", "b"], ["a"], ["\ud800"], ["b"]]
        answers = await asyncio.gather(*(batcher.submit(i) for i in ("a", "down")), return_exceptions=True)
        assert all(isinstance(a, ConnectionError) for a in answers)
    plain: Batcher[str, str] = Batcher(flush)  # without split_on, as before: the flush's error is everyone's
    answers = await asyncio.gather(*(plain.submit(i) for i in ("a", "\ud800")), return_exceptions=True)
    assert all(isinstance(a, UnicodeEncodeError) for a in answers)
