"""bench.protocost (part of K): the protocol's Valkey cost per transition on an idle server, beside the floor's
commands. Checked for what it measures, not for how fast anything is."""

from __future__ import annotations

from bench import protocost
from emulator.valkey import ValkeyProcess
from inferq.queue import Queue
from inferq.settings import Settings


async def test_it_measures_every_transition_and_the_floor_and_leaves_every_job_finished(
    valkey: ValkeyProcess, queue_name: str
) -> None:
    q = Queue.connect(Settings(redis_url=valkey.url, queue=queue_name, max_queue_depth=0))
    await q.ensure_groups()
    try:
        cost = await protocost.measure(q, 200, 1)
        stats = await q.stats()
    finally:
        await q.close()
    usec = cost["usec_per_job"]
    assert set(usec) == {"enqueue", "start", "finish", "read", "total"}
    assert all(usec[k]["median"] > 0 for k in usec)
    assert abs(usec["total"]["median"] - sum(usec[k]["median"] for k in ("enqueue", "start", "finish", "read"))) < 0.5
    assert cost["floor_usec_per_job"]["median"] > 0 and cost["ratio_to_floor"] > 0
    assert stats["enqueued"] == 200 and stats["succeeded"] == 200 and stats["unfinished"] == 0
    assert protocost.render(cost).startswith("protocol cost on an idle Valkey: ")
