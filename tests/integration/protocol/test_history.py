"""The history sampler: one capped list per queue, at most one sample per SAMPLE_EVERY_S, oldest first when read."""

from __future__ import annotations

from inferq.queue import history
from inferq.queue.history import HISTORY_SAMPLES, SAMPLE_EVERY_S, read_history, record_sample
from inferq.queue.protocol import Queue


async def test_samples_closer_than_the_spacing_are_skipped(queue: Queue) -> None:
    seen = await queue.observe()
    assert await record_sample(queue, seen, desired=0, running=0, at=100.0)
    assert not await record_sample(queue, seen, desired=0, running=0, at=100.0 + SAMPLE_EVERY_S / 2)
    assert await record_sample(queue, seen, desired=0, running=0, at=100.0 + SAMPLE_EVERY_S)
    assert [s["at"] for s in await read_history(queue)] == [100.0, 100.0 + SAMPLE_EVERY_S]


async def test_the_list_is_capped(queue: Queue) -> None:
    seen = await queue.observe()
    for i in range(HISTORY_SAMPLES + 5):
        await record_sample(queue, seen, desired=None, running=None, at=1000.0 + i * SAMPLE_EVERY_S)
    assert await queue.redis.llen(queue.keys.history) == HISTORY_SAMPLES
    samples = await read_history(queue)
    assert samples[0]["at"] == 1000.0 + 5 * SAMPLE_EVERY_S  # the oldest five fell off
    assert samples[-1]["at"] == 1000.0 + (HISTORY_SAMPLES + 4) * SAMPLE_EVERY_S


async def test_every_counter_is_in_every_sample_zero_ones_included(queue: Queue) -> None:
    seen = await queue.observe()
    await record_sample(queue, seen, desired=None, running=None, at=10.0)
    await queue.redis.hset(queue.keys.stats, mapping={"succeeded": 1, "latency_ms_total": 250})
    await record_sample(queue, seen, desired=None, running=None, at=20.0)
    first, second = await read_history(queue)
    assert first["latency_ms_total"] == 0 and first["succeeded"] == 0
    assert second["latency_ms_total"] == 250 and second["succeeded"] == 1
    assert set(history.COUNTERS) <= set(second)


async def test_an_unreadable_head_does_not_stop_sampling(queue: Queue) -> None:
    await queue.redis.lpush(queue.keys.history, "not json")
    assert await record_sample(queue, await queue.observe(), desired=None, running=None, at=5.0)
    assert [s["at"] for s in await read_history(queue)] == [5.0]
