"""bench.protocost (part of K): the protocol's Valkey cost per transition on an idle server, beside the floor's
commands. Checked for what it measures, not for how fast anything is."""

from __future__ import annotations

from bench import protocost
from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue


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
    contract = cost["contract_usec_per_job"]
    assert set(contract) == set(usec) and all(contract[k]["median"] > 0 for k in contract)
    assert cost["contract_ratio_to_floor"] > 0
    # the lower bound wrote its own counters and removed what it made: the queue's counters are the real jobs'
    assert stats["enqueued"] == 200 and stats["succeeded"] == 200 and stats["unfinished"] == 0
    assert not [key async for key in q.redis.scan_iter(match=f"{q.keys.prefix}contract*")]
    assert protocost.render(cost).startswith("protocol cost on an idle Valkey: ")
    assert "no script (a lower bound)" in protocost.render(cost)


async def test_a_command_a_script_calls_is_counted_once_with_its_script(valkey: ValkeyProcess, queue_name: str) -> None:
    # commandstats lists the XADDs a script makes under xadd as well as inside the script's own time: a phase that
    # added both would count them twice
    q = Queue.connect(Settings(redis_url=valkey.url, queue=queue_name, max_queue_depth=0))
    key = f"{queue_name}:probe"
    try:
        async def work() -> None:
            await q.redis.eval("for i = 1, 200 do redis.call('XADD', KEYS[1], '*', 'f', 'v') end", 1, key)

        phase = await protocost._phase(q, work)
        stats = await q.redis.info("commandstats")
        sent = await protocost._phase(q, lambda: q.redis.xadd(key, {"f": "v"}), frozenset({"xadd"}))
    finally:
        await q.redis.delete(key)
        await q.close()
    assert stats["cmdstat_xadd"]["calls"] == 200
    assert phase == float(stats["cmdstat_eval"]["usec"])
    assert sent > 0  # a command the client sends itself is counted when named
