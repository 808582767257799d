"""A tenant's long-poll slots (``INFERQ_TENANT_MAX_WAITS``, inferq/queue/waitslots.py) on a real Valkey, standalone
and cluster, each script call also resent: at most ``limit`` held at once per tenant, given back when a wait ends,
lapsing on their own when their holder never gives them back (a Lambda sandbox that died), and a wait of 0 takes
none."""

from __future__ import annotations

import pytest

from inferq.queue.protocol import Queue
from inferq.queue.waitslots import WaitsFull, WaitSlots


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def test_a_tenant_holds_at_most_its_limit_and_another_tenant_is_not_counted(q: Queue, clock: Clock) -> None:
    slots = WaitSlots(q, limit=3, margin_s=5, clock=clock)
    held = [await slots.take("a", 20) for _ in range(3)]
    assert all(held)
    with pytest.raises(WaitsFull) as refused:
        await slots.take("a", 20)
    # the first slot lapses 25 s from now; its wait ends 5 s before that at the latest
    assert refused.value.limit == 3 and refused.value.retry_after_s == 20 and refused.value.retry_after == "20"
    assert await slots.take("b", 20)  # another tenant's slots are its own
    token = held[0]
    assert token is not None
    await slots.give("a", token)
    assert await slots.take("a", 20)  # given back: free again
    assert await q.redis.zcard(q.keys.waits("a")) == 3


async def test_a_slot_its_holder_never_gave_back_lapses_after_its_wait_and_the_margin(q: Queue, clock: Clock) -> None:
    slots = WaitSlots(q, limit=1, margin_s=5, clock=clock)
    assert await slots.take("a", 20)  # a sandbox that dies mid-wait: never given back
    clock.now += 24.9
    with pytest.raises(WaitsFull) as refused:
        await slots.take("a", 1)
    assert refused.value.retry_after == "1"
    clock.now += 0.2  # 25.1 s on: the wait (20 s) and the margin (5 s) are over
    assert await slots.take("a", 1)
    # the set lives as long as its last slot
    ttl_ms = await q.redis.pttl(q.keys.waits("a"))
    assert ttl_ms > 0


async def test_a_wait_of_zero_or_no_limit_takes_no_slot(q: Queue, clock: Clock) -> None:
    assert await WaitSlots(q, limit=1, margin_s=5, clock=clock).take("a", 0) is None
    assert await WaitSlots(q, limit=0, margin_s=5, clock=clock).take("a", 20) is None
    assert not await q.redis.exists(q.keys.waits("a"))


async def test_hold_gives_the_slot_back_however_the_body_ends(q: Queue, clock: Clock) -> None:
    slots = WaitSlots(q, limit=1, margin_s=5, clock=clock)
    with pytest.raises(RuntimeError):
        async with slots.hold("a", 20):
            assert await q.redis.zcard(q.keys.waits("a")) == 1
            raise RuntimeError("the wait failed")
    assert await q.redis.zcard(q.keys.waits("a")) == 0
    async with slots.hold("a", 20):
        with pytest.raises(WaitsFull):
            async with slots.hold("a", 20):
                pass
    assert await q.redis.zcard(q.keys.waits("a")) == 0
