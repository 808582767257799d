"""``Batches.list`` pages a tenant's batches exactly once, newest first, on real Valkey: many batches created in the
same millisecond, records expiring between pages (an ``after`` among them), random page sizes."""

from __future__ import annotations

import random

import pytest

from inferq.batches.records import Batches, BatchNotFound
from inferq.queue.protocol import Queue


@pytest.mark.parametrize("seed", range(6))
async def test_every_batch_is_on_exactly_one_page_while_records_expire_between_pages(
    queue: Queue, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    batches = Batches(queue)
    made: list[str] = []
    for at in (1_800_000_000.001, 1_800_000_000.002, 1_800_000_000.003):  # 3 milliseconds, 12 batches in each
        monkeypatch.setattr("inferq.batches.records.time.time", lambda at=at: at)
        made += [(await batches.create("t", "file-x", "/v1/chat/completions", "24h", None)).id for _ in range(12)]
    monkeypatch.undo()
    await batches.create("other", "file-x", "/v1/chat/completions", "24h", None)  # another tenant's: never listed
    expired: set[str] = set()
    seen: list[str] = []
    after: str | None = None
    while True:
        page, has_more = await batches.list("t", after=after, limit=rng.randint(1, 7))
        seen += [b.id for b in page]
        if not has_more:
            break
        after = page[-1].id
        # records expire between pages, the one named by `after` among them now and then
        unseen = [i for i in made if i not in seen and i not in expired]
        gone = set(rng.sample(unseen, min(len(unseen), rng.randint(0, 2))))
        if rng.random() < 0.3:
            gone.add(after)
        for batch_id in gone:
            await queue.redis.delete(queue.keys.batch(batch_id))
        expired |= gone
    assert len(seen) == len(set(seen)), "a batch listed twice"
    assert set(made) - expired - set(seen) == set(), "a batch never listed"
    # newest first: by creation millisecond, then by id, both descending
    order = {batch_id: (index // 12, batch_id) for index, batch_id in enumerate(made)}
    assert seen == sorted(seen, key=lambda i: order[i], reverse=True)
    with pytest.raises(BatchNotFound):
        await batches.list("t", after="batch_nosuchbatchnosuchbatchnosu", limit=5)
