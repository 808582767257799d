"""Fair share inside each lane (G10) against a real Valkey, standalone and in cluster mode, and each again with every
script call resent (conftest.py): tenants with jobs waiting are taken in turn, in proportion to their weights,
counted in work; a tenant's job submitted behind another tenant's backlog starts after a few takes, never after the
backlog; sending one job at a time, or fewer bigger ones, gains nothing; retries, releases and redrives take their
tenant's turn; cancelled and expired jobs leave the turns cleanly; lanes keep their order; no job waits behind an
empty stream; the scaler's view counts the waiting jobs, per tenant for operators. The property test at the end
draws tenants, weights, job sizes, bursts, reads, reclaims and resends at random and holds the shares to the
bound of start-time fair queuing.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.fairshare import FAIR_BUFFER, estimated_work
from inferq.queue.jobs import JobRequest, JobStatus, Priority
from inferq.queue.protocol import Delivery, Outcome, Queue, now_ms
from tests.integration.protocol.resend import Resending
from tests.support.queued import queued, read_all

PLAIN = ["standalone", "cluster"]
RESULT = {"status_code": 200, "body": {}}
ERROR = {"type": "server_error", "message": "503"}


def req(max_tokens: int = 16, lane: Priority = Priority.NORMAL, **kw: Any) -> JobRequest:
    return JobRequest(body={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens},
                      priority=lane, **kw)


async def take_one(q: Queue, consumer: str = "w1") -> Delivery:
    """One worker slot freed: read one entry, finish it, answer the delivery."""
    (d,), _ = await q.read(consumer, 1)
    assert await q.finish(d, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
    return d


# ---------------------------------------------------------------- in turn, by weight, in work


async def test_a_job_submitted_behind_another_tenants_backlog_starts_after_a_few_takes_not_after_the_backlog(
    q: Queue
) -> None:
    backlog = [(await q.enqueue("heavy", req()))[0].id for _ in range(120)]  # one submit at a time, as a gateway
    light, _ = await q.enqueue("light", req())
    order = [(await take_one(q)).job.id for _ in range(4)]
    assert light.id in order[:FAIR_BUFFER + 2], order  # the entry already in the stream, then about one per tenant
    rest = [(await take_one(q)).job.id for _ in range(len(backlog) - 3)]
    assert [j for j in order + rest if j != light.id] == backlog  # the heavy tenant's jobs keep their order


async def test_first_come_first_served_without_fair_share(q: Queue) -> None:
    q.settings = q.settings.replace(fair_share=False)
    backlog = [(await q.enqueue("heavy", req()))[0].id for _ in range(20)]
    light, _ = await q.enqueue("light", req())
    taken, _ = await read_all(q, "w1", 21)
    assert [d.job.id for d in taken] == [*backlog, light.id]
    assert await q.redis.exists(q.keys.fair_jobs(Priority.NORMAL)) == 0


@pytest.mark.parametrize("q", PLAIN, indirect=True)
async def test_tenants_with_jobs_waiting_share_the_takes_by_weight(q: Queue) -> None:
    q.settings = q.settings.replace(tenant_weights={"one": 1.0, "two": 2.0, "four": 4.0}, max_queue_depth=0)
    for tenant in ("one", "two", "four"):
        await q.enqueue_many(tenant, [req() for _ in range(60)])
    taken = Counter([(await take_one(q)).job.tenant for _ in range(70)])
    assert abs(taken["one"] - 10) <= 2 and abs(taken["two"] - 20) <= 2 and abs(taken["four"] - 40) <= 2, taken


@pytest.mark.parametrize("q", PLAIN, indirect=True)
async def test_fewer_bigger_jobs_gain_nothing(q: Queue) -> None:
    """Counted in work (prompt estimate + max_tokens): a tenant whose jobs are four times bigger gets a quarter of the
    jobs, the same work."""
    q.settings = q.settings.replace(max_queue_depth=0)
    await q.enqueue_many("small", [req(max_tokens=100) for _ in range(60)])
    await q.enqueue_many("big", [req(max_tokens=400) for _ in range(20)])
    small, big = estimated_work(req(max_tokens=100).body), estimated_work(req(max_tokens=400).body)
    work = Counter()
    for _ in range(40):
        d = await take_one(q)
        work[d.job.tenant] += small if d.job.tenant == "small" else big
    assert abs(work["small"] - work["big"]) <= big + small, work


async def test_a_tenant_sending_one_job_at_a_time_gets_its_turn_and_no_more(q: Queue) -> None:
    """A tenant that submits its next job only once its last is taken keeps the finish tag of what it was admitted:
    it alternates with a backlogged tenant, never overtakes it."""
    await q.enqueue_many("heavy", [req() for _ in range(40)])
    await q.enqueue("drip", req())
    taken = []
    for _ in range(20):
        d = await take_one(q)
        taken.append(d.job.tenant)
        if d.job.tenant == "drip":
            await q.enqueue("drip", req())
    assert 8 <= taken.count("drip") <= 11, taken


async def test_a_tenant_whose_waiting_jobs_all_end_unserved_starts_again_at_the_virtual_time(q: Queue) -> None:
    """Cancelled (or expired) while waiting, a job's cost goes back to its tenant: cancelling a backlog and
    submitting again does not put the new job behind another tenant's backlog."""
    mine = [(await q.enqueue("fickle", req()))[0].id for _ in range(30)]
    await q.enqueue_many("steady", [req() for _ in range(30)])
    for job_id in mine[1:]:
        await q.cancel("fickle", job_id)
    again, _ = await q.enqueue("fickle", req())
    order = [(await take_one(q)).job.id for _ in range(4)]
    assert again.id in order, order


async def test_a_release_and_a_redrive_take_their_tenants_turn(q: Queue) -> None:
    q.settings = q.settings.replace(max_attempts=1)
    own, _ = await q.enqueue("light", req())
    (d,), _ = await q.read("w1", 1)
    await q.enqueue_many("heavy", [req() for _ in range(30)])
    assert await q.release(d) is Outcome.RELEASED  # given back while the heavy tenant's jobs wait: its turn kept
    found = [(await q.read("w1", 1))[0][0] for _ in range(3)]
    [again] = [x for x in found if x.job.id == own.id]
    assert await q.retry(again, delay_ms=0, error=ERROR) is Outcome.DEAD_LETTERED
    for x in found:
        if x is not again:
            assert await q.finish(x, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
    await q.redrive("light", own.id)  # queued again in its tenant's turn, not behind the backlog
    assert own.id in [(await take_one(q)).job.id for _ in range(3)]


async def test_a_retry_waits_behind_its_tenants_turn_not_behind_the_backlog(q: Queue) -> None:
    q.settings = q.settings.replace(max_attempts=3)
    job, _ = await q.enqueue("light", req())
    (d,), _ = await q.read("w1", 1)
    await q.enqueue_many("heavy", [req() for _ in range(30)])
    assert await q.retry(d, delay_ms=0, error=ERROR) is Outcome.RETRY_SCHEDULED
    assert job.id in [(await take_one(q)).job.id for _ in range(4)]
    delayed, _ = await q.enqueue("light", req())
    (d,), _ = await q.read("w1", 1)
    while d.job.id != delayed.id:
        await q.finish(d, JobStatus.SUCCEEDED, result=RESULT)
        (d,), _ = await q.read("w1", 1)
    assert await q.retry(d, delay_ms=1, error=ERROR) is Outcome.RETRY_SCHEDULED
    await asyncio.sleep(0.01)  # past the backoff
    assert await q.promote() == 1  # due: into its tenant's turn
    assert delayed.id in [(await take_one(q)).job.id for _ in range(4)]


# ---------------------------------------------------------------- lanes, the stream, the scaler's view


async def test_a_lane_whose_jobs_wait_is_read_full_before_a_lower_lane(q: Queue) -> None:
    await q.enqueue_many("t", [req(lane=Priority.HIGH) for _ in range(10)])
    await q.enqueue_many("t", [req(lane=Priority.LOW) for _ in range(10)])
    await read_all(q, "w1", 1)  # the first read finds the entry placed before any waited; its start refills
    got, _ = await q.read("w1", 4)
    assert [d.lane for d in got] == [Priority.HIGH] * 4


async def test_a_drained_consumers_blocking_read_answers_at_once_when_jobs_wait(q: Queue) -> None:
    assert (await q.read("w1", 4, block_ms=10)) == ([], [])  # every lane drained: the next read blocks first
    await q.enqueue_many("t", [req() for _ in range(6)])
    got, _ = await asyncio.wait_for(q.read("w1", 4, block_ms=5000), 2)  # not the 5 s: the stream holds entries
    more, _ = await asyncio.wait_for(q.read("w1", 4, block_ms=5000), 2)
    assert len(got) + len(more) >= 4


async def test_no_job_waits_behind_an_empty_stream_longer_than_a_sweep(q: Queue) -> None:
    await q.enqueue_many("t", [req() for _ in range(5)])
    # a worker that died between its read and its start: the stream's one entry is pending, none is left to read
    await q.redis.xreadgroup("workers", "dead", {q.keys.stream: ">"}, count=10)
    assert await q.read("w1", 1) == ([], [])
    await q.promote()  # the maintenance sweep (workers' and scaler's)
    (d,), _ = await q.read("w1", 1)
    assert d.job.tenant == "t"


async def test_cancelled_and_expired_jobs_leave_the_waiting_set_and_the_counts(q: Queue) -> None:
    await q.enqueue("t", req())
    waiting, _ = await q.enqueue("t", req())
    await q.enqueue("t", req(ttl_s=1), now=now_ms() - 5000)
    assert waiting.entry and waiting.entry.startswith("w:")
    await q.cancel("t", waiting.id)
    assert await q.expire_due() == 1
    assert len(await queued(q)) == 1 and await q.redis.zcard(q.keys.fair_jobs(Priority.NORMAL)) == 0
    stats = await q.stats()
    assert (stats["unfinished"], stats["cancelled"], stats["expired"]) == (1, 1, 1)


async def test_the_scalers_view_counts_jobs_waiting_for_admission_per_lane_and_per_tenant(q: Queue) -> None:
    await q.enqueue_many("a", [req() for _ in range(5)])
    await q.enqueue_many("b", [req(lane=Priority.LOW) for _ in range(3)])
    seen = await q.observe(by_tenant=True)
    assert seen.lag == 8 and seen.lag_by_lane == {Priority.HIGH: 0, Priority.NORMAL: 5, Priority.LOW: 3}
    assert seen.waiting_by_lane == {Priority.HIGH: 0, Priority.NORMAL: 4, Priority.LOW: 2}  # one entry each
    assert seen.waiting_by_tenant == {"a": {Priority.NORMAL: 4}, "b": {Priority.LOW: 2}}
    assert (await q.observe()).waiting_by_tenant == {}  # the scaler's ticks need only the totals


# ---------------------------------------------------------------- the property: shares follow weights


def _normalized(deliveries: Sequence[Delivery], weights: dict[str, float]) -> dict[str, float]:
    """Work taken per tenant, over its weight (the virtual time each advanced)."""
    out: dict[str, float] = dict.fromkeys(weights, 0.0)
    for d in deliveries:
        out[d.job.tenant] += estimated_work(d.job.body) / weights[d.job.tenant]
    return out


TENANTS = ("alpha", "bravo", "charlie", "delta")
tenant_plans = st.lists(st.tuples(st.sampled_from([1.0, 2.0, 3.0, 4.0]),            # weight
                                  st.lists(st.sampled_from([8, 64, 256]), min_size=1, max_size=3),  # job sizes
                                  st.integers(8, 20)),                                 # backlog
                        min_size=2, max_size=4)
steps = st.lists(st.tuples(st.sampled_from(["read", "read", "read", "steal", "crash", "resend"]),
                           st.integers(1, 4)), min_size=10, max_size=40)


@settings(max_examples=int(os.environ.get("INFERQ_FAIR_EXAMPLES", "15")), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(plans=tenant_plans, script=steps, order=st.randoms(use_true_random=False))
def test_each_tenants_share_of_takes_while_it_has_jobs_waiting_follows_its_weight(
    valkey: ValkeyProcess, plans: list[tuple[float, list[int], int]], script: list[tuple[str, int]], order: Any
) -> None:
    """Tenants with random weights and job sizes submit backlogs in a random interleaving; two consumers take in
    random counts, steal each other's entries (reclaim), die holding entries, and any script call may be resent.
    While every tenant still has jobs waiting, the work each was admitted over its weight stays within one job's
    cost of each other's -- start-time fair queuing's bound -- plus the entries already in the stream when jobs
    began to wait and one read's worth of admission ahead (the tolerance): for two tenants i and j,
    |W_i/w_i - W_j/w_j| <= c_i/w_i + c_j/w_j + (FAIR_BUFFER + 4) * max_k c_k/w_k, c the largest job of each."""
    asyncio.run(_shares(valkey, plans, script, order))


async def _shares(valkey: ValkeyProcess, plans: list[tuple[float, list[int], int]], script: list[tuple[str, int]],
                  order: Any) -> None:
    names = TENANTS[:len(plans)]
    weights = {t: w for t, (w, _, _) in zip(names, plans, strict=True)}
    q = Queue.connect(Settings(redis_url=valkey.url, queue="fs" + uuid.uuid4().hex[:10], claim_idle_ms=0,
                               max_queue_depth=0, tenant_weights=weights))
    resend = Resending(q, always=False)
    q.scripts = resend
    try:
        await q.ensure_groups()
        submits = [(t, size) for t, (_, sizes, n) in zip(names, plans, strict=True) for size in
                   (sizes * n)[:n]]
        order.shuffle(submits)
        for tenant, run in itertools.groupby(submits, key=lambda submit: submit[0]):  # a tenant's run: one call
            await q.enqueue_many(tenant, [req(max_tokens=size) for _, size in run])
        biggest = {t: max(estimated_work(req(max_tokens=s).body) for s in sizes) / weights[t]
                   for t, (_, sizes, _) in zip(names, plans, strict=True)}
        taken: list[Delivery] = []
        seen: set[str] = set()
        held: dict[str, list[Delivery]] = {"c1": [], "c2": []}
        left = Counter(tenant for tenant, _ in submits)
        for what, n in script:
            if min(left.values()) <= n:
                break  # the shares hold while every tenant has jobs waiting (this read cannot take them all)
            consumer = "c1" if n % 2 else "c2"
            if what == "read":
                got, _ = await q.read(consumer, n)
            elif what == "steal":
                got, _ = await q.reclaim(consumer, n)
            elif what == "crash":
                held[consumer].clear()  # its entries stay pending until stolen
                continue
            else:
                resend.arm(n)
                continue
            for d in got:
                if d.job.id not in seen:  # a reclaimed entry was taken before: counted once
                    seen.add(d.job.id)
                    taken.append(d)
                    left[d.job.tenant] -= 1
            held[consumer] += got
            for d in held[consumer][:-2] if len(held[consumer]) > 2 else []:  # finish all but two
                await q.finish(d, JobStatus.SUCCEEDED, result=RESULT)
            held[consumer] = held[consumer][-2:]
        served = _normalized(taken, weights)
        slack = (FAIR_BUFFER + 4) * max(biggest.values())
        for i in names:
            for j in names:
                assert served[i] - served[j] <= biggest[i] + biggest[j] + slack, (served, biggest, weights)
    finally:
        await q.redis.delete(*await q.redis.keys(q.keys.prefix + "*") or ["-"])
        await q.close()
