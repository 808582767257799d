"""inferq.redis.coalescing.Coalescer: what one turn submits is flushed together; each submitter gets its own answer or
the flush's exception."""

from __future__ import annotations

import asyncio

import pytest

from inferq.redis.coalescing import Coalescer


async def test_what_one_turn_submits_is_one_flush_and_each_gets_its_own_answer() -> None:
    flushed: list[list[int]] = []

    async def flush(items: list[int]) -> list[int]:
        flushed.append(items)
        return [i * 10 for i in items]

    coalescer: Coalescer[int, int] = Coalescer(flush)
    assert await asyncio.gather(*(coalescer.submit(i) for i in range(5))) == [0, 10, 20, 30, 40]
    assert flushed == [[0, 1, 2, 3, 4]]


async def test_a_failed_flush_fails_each_of_its_submitters_and_a_cancelled_one_leaves_the_rest() -> None:
    async def flush(items: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        if 0 in items:
            raise ConnectionError("down")
        return items

    coalescer: Coalescer[int, int] = Coalescer(flush)
    failed = [coalescer.put(0), coalescer.put(1)]
    for future in failed:
        with pytest.raises(ConnectionError):
            await future
    kept, dropped = coalescer.put(2), asyncio.ensure_future(coalescer.submit(3))
    await asyncio.sleep(0)
    dropped.cancel()
    assert await kept == 2
    with pytest.raises(asyncio.CancelledError):
        await dropped
    await coalescer.wait_idle()
