"""G9 against a real Valkey: every script run twice with the same arguments answers the same and changes nothing
(also through a real lost reply, which makes redis-py resend); a holder that lost its delivery changes nothing by
finishing, retrying or releasing it; the per-tenant quota; the latency counter."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue import output
from inferq.queue.jobs import JobRequest, JobStatus, Priority, new_job_id
from inferq.queue.keys import GROUP
from inferq.queue.protocol import Delivery, Lease, Outcome, Queue, QueueFull, TenantQuotaFull, now_ms
from inferq.queue.waitslots import WaitsFull, WaitSlots
from inferq.redis.scripting import NAMES, Code, all_scripts
from inferq.webhooks.tenant_secrets import rotate_secret, tenant_secret
from tests.integration.protocol.resend import DelayingProxy, Resending, difference, snapshot, without_refusals
from tests.support.queued import queued, read_all

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
RESENT = ["standalone-resent", "cluster-resent"]
PLAIN = ["standalone", "cluster"]
ERROR = {"type": "server_error", "message": "503"}
RESULT = {"status_code": 200, "body": {}}


def req(**kw: Any) -> JobRequest:
    return JobRequest(body=dict(CHAT), **kw)


# ---------------------------------------------------------------- every script, every path, resent


@pytest.mark.parametrize("q", RESENT, indirect=True)
async def test_every_script_on_each_of_its_paths_answers_the_same_and_changes_nothing_when_resent(q: Queue) -> None:
    """One life cycle through every script and most of their answers, each call run twice (conftest's resent
    mode checks each copy). Ends with every job terminal: the counters must agree with a single run."""
    assert isinstance(q.scripts, Resending)
    q.settings = q.settings.replace(tenant_max_depth=5)
    done, _ = await q.enqueue("t", req(idempotency_key="k"))                       # enqueue: created
    assert (await q.enqueue("t", req(idempotency_key="k")))[1]                      # enqueue: replay
    await q.enqueue("t", req(ttl_s=1), now=now_ms() - 5000)
    assert await q.expire_due() == 1                                                # expire
    await q.enqueue("t", req(ttl_s=1), now=now_ms() - 5000)                         # (expires at start)
    with pytest.raises(TenantQuotaFull):                                            # enqueue: tenant full
        for _ in range(4):
            await q.enqueue("t", req())
    deliveries, skipped = await read_all(q, "w1", 5)                                # start: run / expired
    assert [s.status for s in skipped] == ["expired"]
    by_id = {d.job.id: d for d in deliveries}
    first, second, third, fourth = (by_id.pop(done.id), *by_id.values())
    assert await q.renew("w1", [first, second]) == [Lease.HELD, Lease.HELD]       # renew
    assert await output.watch(q, first.job.id, "t")                                 # watchoutput
    assert await q.renew("w1", [first]) == [Lease.WATCHED]                          # renew: watched
    said = await output.append(q, first.job.id, first.entry_id, first.lease, 0, "Hel", 1, ttl_s=60)
    assert said.code == 0                                                           # appendoutput
    said = await output.append(q, first.job.id, first.entry_id, first.lease, 9, "x", 2, ttl_s=60)
    assert said.code == Code.MISPLACED                                              # appendoutput: misplaced
    fenced = await output.fence(q, first.job.id, first.entry_id, first.lease, 60)
    assert fenced.kept.text == "Hel"                                                # fenceoutput
    said = await output.append(q, first.job.id, first.entry_id, first.lease, 3, "lo", 2, ttl_s=60,
                               fence=fenced.fence)
    assert said.code == 0                                                           # appendoutput: fenced
    said = await output.append(q, first.job.id, first.entry_id, first.lease, 5, "!", 3, ttl_s=60,
                               fence=fenced.fence)
    assert said.code == Code.FENCED                                                 # appendoutput: fenced, refused
    assert await q.finish(first, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN    # finish
    await output.close(q, [first.job.id])                                           # closeoutput
    assert await q.finish(first, JobStatus.FAILED, error=ERROR) is Outcome.DUPLICATE       # finish: duplicate
    assert await q.retry(second, delay_ms=60_000, error=ERROR) is Outcome.RETRY_SCHEDULED  # retry: delayed
    assert await q.promote(now=now_ms() + 61_000) == 1                              # promote
    assert await q.release(third) is Outcome.RELEASED                               # release
    (stolen,), _ = await q.reclaim("w2", 1)                                         # start: reclaimed
    assert stolen.job.id == fourth.job.id
    assert await q.finish(fourth, JobStatus.SUCCEEDED, result=RESULT) is Outcome.STALE    # stale owner
    await q.cancel("t", stolen.job.id)                                              # cancel: running
    assert await q.retry(stolen, delay_ms=0, error=ERROR) is Outcome.ENDED          # retry: cancelled
    for _ in range(3):                                                              # retry: dead-letter
        got, _ = await read_all(q, "w1", 10)
        for d in got:
            outcome = await q.retry(d, delay_ms=0, error=ERROR)
    assert outcome is Outcome.DEAD_LETTERED
    redriven = await q.redrive("t", d.job.id)                                       # redrive
    assert redriven.status is JobStatus.QUEUED
    await q.cancel("t", redriven.id)                                                # cancel: queued
    high, _ = await q.enqueue("t", req(priority=Priority.HIGH))
    low, _ = await q.enqueue("t", req(priority=Priority.LOW))
    (taken,), _ = await q.read_blocking("w1", 1, 100)                             # requeue: one read too many
    assert taken.job.id == high.id and taken.lane is Priority.HIGH
    assert await q.finish(taken, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
    await q.cancel("t", low.id)
    await q.observe()                                                               # observe (read only)
    skipped, count = await q.skip_webhookless_events(None)                          # skipevents: no count yet
    assert not skipped and await q.skip_webhookless_events(count) == (True, count)  # skipevents: skipped
    tenant = f"t-{q.keys.queue}"  # the secret is the tenant's, across queues: one of this test's own
    made = await tenant_secret(q, tenant)                                           # webhooksecret: made
    assert await tenant_secret(q, tenant) == made                                   # webhooksecret: kept
    rotated = await rotate_secret(q, tenant)                                        # webhooksecret: rotated
    assert rotated.previous == made.secret and rotated.secret != made.secret
    assert (await rotate_secret(q, tenant, 0)).previous is None                    # webhooksecret: none kept
    # before the rate limit: its bucket expires a second after it is taken, which a later snapshot would see
    slots = WaitSlots(q, limit=1, margin_s=5)
    token = await slots.take("t", 20)                                               # takewait: taken
    with pytest.raises(WaitsFull):                                                  # takewait: refused
        await slots.take("t", 20)
    assert token is not None
    await slots.give("t", token)                                                    # givewait
    assert await q.take_rate("t", 1.0, 1) == 0.0                                   # ratelimit: allowed
    assert 0 < await q.take_rate("t", 1.0, 1) <= 1.0                                # ratelimit: refused
    assert set(q.scripts.checked) == set(NAMES)
    stats = await q.stats()
    assert stats["unfinished"] == 0 and stats["enqueued"] == 8 and stats["duplicate_results"] == 1
    assert stats["stale_writes"] == 1 and stats["released"] == 1 and stats["redriven"] == 1
    for stream in q.keys.lane_streams:
        assert await q.redis.xlen(stream) == 0
    assert await q.redis.hgetall(q.keys.tenants) == {}


@pytest.mark.parametrize("q", PLAIN, indirect=True)
@pytest.mark.parametrize("idempotency_key", [None, "k1"])
async def test_an_enqueue_resent_after_its_job_ran_answers_created_with_its_first_entry(
    q: Queue, idempotency_key: str | None
) -> None:
    """A late copy (the job was taken and finished meanwhile) still finds its own job: the same {0, id, entry},
    never a second entry or job, never a replay of itself."""
    call = q._enqueue_call([("t", req(idempotency_key=idempotency_key), new_job_id(), now_ms())])
    [first] = await q.scripts(*call)
    (d,), _ = await q.read("w1", 1)
    await q.finish(d, JobStatus.SUCCEEDED, result=RESULT)
    [again] = await q.scripts(*call)
    assert int(first[0]) == 0 and again == first
    stats = await q.stats()
    assert stats["enqueued"] == 1 and stats["unfinished"] == 0 and await q.redis.xlen(q.keys.stream) == 0


@pytest.mark.parametrize("q", RESENT, indirect=True)
async def test_a_resent_cancel_or_redrive_answers_as_the_first_run_not_409(q: Queue) -> None:
    queued, _ = await q.enqueue("t", req())
    assert (await q.cancel("t", queued.id)).status is JobStatus.CANCELLED
    q.settings = q.settings.replace(max_attempts=1)
    dead, _ = await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)
    assert await q.retry(d, delay_ms=0, error=ERROR) is Outcome.DEAD_LETTERED
    assert (await q.redrive("t", dead.id)).status is JobStatus.QUEUED
    assert (await q.stats())["redriven"] == 1


# ---------------------------------------------------------------- a real lost reply: redis-py resends


async def _evalsha_calls(server: ValkeyProcess) -> int:
    direct = aioredis.Redis(host=server.host, port=server.port, decode_responses=True)
    try:
        return int((await direct.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0))
    finally:
        await direct.aclose()


async def test_a_reply_lost_in_a_network_blip_is_resent_and_the_first_submission_is_still_created_once(
    valkey: ValkeyProcess, queue_name: str
) -> None:
    """The server runs the first copy; its reply is held back past the client's timeout, redis-py resends on a
    new connection and the server runs the copy too. One job, one entry, counted once, answered 202 (not a
    replay); then a resent cancel answers 200 and a resent finish counts no duplicate."""
    async with DelayingProxy(valkey.host, valkey.port) as proxy:
        settings = Settings(redis_url=f"redis://127.0.0.1:{proxy.port}/0", queue=queue_name, redis_timeout_s=0.3)
        q = Queue.connect(settings)
        try:
            await q.ensure_groups()
            for script in all_scripts():  # loaded first, so the blip's first call is not a NOSCRIPT
                await q.redis.script_load(script.source)

            async def blip(write: Any) -> Any:
                calls = await _evalsha_calls(valkey)
                proxy.delay_open_connections(1.0)
                result = await write
                assert await _evalsha_calls(valkey) - calls == 2, "the script was not resent"
                return result

            job, replayed = await blip(q.enqueue("t", req(idempotency_key="once")))
            assert not replayed and await q.redis.xlen(q.keys.stream) == 1
            stats = await q.stats()
            assert stats["enqueued"] == 1 and stats["unfinished"] == 1
            assert (await blip(q.cancel("t", job.id))).status is JobStatus.CANCELLED
            await q.enqueue("t", req())
            (d,), _ = await q.read("w1", 1)
            assert await blip(q.finish(d, JobStatus.SUCCEEDED, result=RESULT)) is Outcome.WRITTEN
            stats = await q.stats()
            assert stats["duplicate_results"] == 0 and stats["unfinished"] == 0 and stats["succeeded"] == 1
        finally:
            await q.close()


# ---------------------------------------------------------------- owner checks


async def _stale_writes_change_nothing(q: Queue, stale: Delivery) -> None:
    before = await snapshot(q)
    assert await q.finish(stale, JobStatus.SUCCEEDED, result=RESULT) is Outcome.STALE
    assert await q.finish(stale, JobStatus.FAILED, error=ERROR) is Outcome.STALE
    assert await q.retry(stale, delay_ms=0, error=ERROR) is Outcome.STALE
    assert await q.release(stale) is Outcome.STALE
    assert await q.renew("w1", [stale]) == [Lease.LOST]
    after = await snapshot(q)
    assert without_refusals(after, q) == without_refusals(before, q), difference(before, after)
    assert (await q.stats())["stale_writes"] == 4


async def test_a_holder_whose_entry_was_reclaimed_by_another_consumer_changes_nothing(q: Queue) -> None:
    q.settings = q.settings.replace(max_attempts=1)  # the stale retry would dead-letter the job: it must not
    job, _ = await q.enqueue("t", req())
    (old,), _ = await q.read("w1", 1)
    (new,), _ = await q.reclaim("w2", 1)
    assert new.entry_id == old.entry_id and new.lease != old.lease
    await _stale_writes_change_nothing(q, old)
    owners = {p["message_id"]: p["consumer"] for p in await q.redis.xpending_range(q.keys.stream, GROUP, "-", "+", 9)}
    assert owners == {new.entry_id: "w2"}  # the new holder's entry was not acknowledged
    assert await q.renew("w2", [new]) == [Lease.HELD]
    assert await q.finish(new, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
    stored = await q.get(job.id)
    assert stored and stored.status is JobStatus.SUCCEEDED and (await q.stats())["unfinished"] == 0


async def test_a_consumers_earlier_delivery_of_an_entry_it_took_again_changes_nothing(q: Queue) -> None:
    await q.enqueue("t", req())
    (earlier,), _ = await q.read("w1", 1)
    (later,), _ = await q.reclaim("w1", 1)  # the same consumer's own idle entry, delivered to it again
    assert later.entry_id == earlier.entry_id and later.lease != earlier.lease
    await _stale_writes_change_nothing(q, earlier)
    assert await q.release(later) is Outcome.RELEASED


async def test_a_stale_holder_cannot_take_back_an_entry_by_renewing_it(q: Queue) -> None:
    await q.enqueue("t", req())
    (old,), _ = await q.read("w1", 1)
    await q.reclaim("w2", 1)
    assert await q.renew("w1", [old]) == [Lease.LOST]
    [pending] = await q.redis.xpending_range(q.keys.stream, GROUP, "-", "+", 9)
    assert pending["consumer"] == "w2"


# ---------------------------------------------------------------- per-tenant quota


async def test_one_tenant_at_its_quota_is_refused_while_others_are_accepted(q: Queue) -> None:
    q.settings = q.settings.replace(tenant_max_depth=2)
    a1, _ = await q.enqueue("a", req(idempotency_key="a1"))
    await q.enqueue("a", req())
    with pytest.raises(TenantQuotaFull) as info:
        await q.enqueue("a", req())
    assert isinstance(info.value, QueueFull) and info.value.unfinished == 2  # the gateway's 429 handler applies
    assert (await q.stats())["unfinished"] == 2 and await q.redis.hgetall(q.keys.tenants) == {"a": "2"}
    assert (await q.enqueue("a", req(idempotency_key="a1")))[1]  # a replay is still answered
    await q.enqueue("b", req())
    assert await q.redis.hgetall(q.keys.tenants) == {"a": "2", "b": "1"}
    await q.cancel("a", a1.id)
    await q.enqueue("a", req())
    assert (await q.stats())["unfinished"] == 3 and len(await queued(q)) == 3


async def test_the_tenant_count_follows_every_terminal_transition_and_redrive(q: Queue) -> None:
    q.settings = q.settings.replace(max_attempts=1)
    await q.enqueue("a", req())
    await q.enqueue("a", req(ttl_s=1), now=now_ms() - 5000)
    await q.enqueue("a", req())
    assert await q.redis.hget(q.keys.tenants, "a") == "3"
    assert await q.expire_due() == 1
    ok, failed = (await read_all(q, "w1", 2))[0]
    await q.finish(ok, JobStatus.SUCCEEDED, result=RESULT)
    assert await q.retry(failed, delay_ms=0, error=ERROR) is Outcome.DEAD_LETTERED
    assert await q.redis.hgetall(q.keys.tenants) == {}  # a tenant with no open job leaves the hash
    await q.redrive("a", failed.job.id)
    assert await q.redis.hgetall(q.keys.tenants) == {"a": "1"}


# ---------------------------------------------------------------- latency counter


async def test_each_terminal_transition_adds_its_latency_to_latency_ms_total(q: Queue) -> None:
    created = now_ms() - 10_000
    await q.enqueue("t", req(), now=created)
    cancelled, _ = await q.enqueue("t", req(), now=created)
    (d,), _ = await q.read("w1", 1)
    await q.finish(d, JobStatus.SUCCEEDED, result=RESULT, now=created + 1234)
    await q.cancel("t", cancelled.id, now=created + 766)
    assert (await q.stats())["latency_ms_total"] == 2000


async def test_a_finish_resent_over_a_record_an_older_version_settled_answers_written(q: Queue) -> None:
    # start and finish answer a plain 0 now (cheaper for the server than {0}); a job an older version finished
    # keeps "token|[0]" as the answer its resent copy replays, and that still reads as written, counting nothing
    job, _ = await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)
    assert await q.finish(d, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
    token, answer = (await q.redis.hget(q.keys.job(job.id), "settled")).split("|")
    assert answer == "0"
    await q.redis.hset(q.keys.job(job.id), "settled", f"{token}|[0]")
    before = await q.stats()
    assert await q.finish(d, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
    assert await q.stats() == before
