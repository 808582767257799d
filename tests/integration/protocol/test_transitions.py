"""Every transition script and error code, against a real Valkey: standalone and in cluster mode (one node owning
all slots), which proves each script touches one hash slot only; and each of those again with every script call
resent (conftest.py), which proves G9 on every path these tests take."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
import redis.exceptions
from redis.asyncio import Redis

from inferq.queue.core import SCRIPT_BATCH
from inferq.queue.jobs import JobRequest, JobStatus, Priority
from inferq.queue.keys import GROUP
from inferq.queue.protocol import (
    IdempotencyConflict,
    JobNotFound,
    JobTerminal,
    Lease,
    NotDeadLettered,
    Outcome,
    Queue,
    QueueFull,
    TenantQuotaFull,
    now_ms,
)
from inferq.redis.scripting import Code, all_scripts, load
from tests.integration.protocol.resend import Resending
from tests.support.blocked import blocked_in
from tests.support.queued import queued, read_all
from tests.support.waiting import eventually_async

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def req(**kw: object) -> JobRequest:
    return JobRequest(body=dict(CHAT), **kw)  # type: ignore[arg-type]


async def live_entries(q: Queue, job_id: str) -> list[str]:
    return [e for e, f in await q.redis.xrange(q.keys.stream) if f["job"] == job_id]


# ---------------------------------------------------------------- loading


def test_every_script_declares_its_keys_and_loads() -> None:
    names = {s.name for s in all_scripts()}
    assert names == {"enqueue", "start", "finish", "retry", "release", "renew", "cancel", "promote", "redrive",
                     "expire", "observe", "requeue", "skipevents", "webhooksecret", "ratelimit", "takewait",
                     "givewait", "admit", "appendoutput", "closeoutput", "watchoutput", "fenceoutput"}
    assert load("enqueue").min_keys == 7 and load("enqueue").max_keys is None
    assert load("renew").max_keys is None


async def test_a_call_with_the_wrong_key_count_is_refused_before_reaching_redis(q: Queue) -> None:
    with pytest.raises(TypeError, match="takes 13"):
        await q.scripts("retry", [q.keys.stream], [])
    with pytest.raises(TypeError, match="takes 5 or more"):
        await q.scripts("finish", [q.keys.stats], [])


async def test_scripts_are_reloaded_after_the_server_forgets_them(q: Queue) -> None:
    await q.redis.script_flush()
    job, _ = await q.enqueue("t", req())
    assert (await q.get(job.id)) is not None


async def test_a_batch_of_starts_reads_each_record_after_its_start_even_when_the_server_forgot_the_script(
    q: Queue,
) -> None:
    # start.lua answers {0}; the record comes from the HGETALL piped right after it, so it shows the delivery
    for _ in range(3):
        await q.enqueue("t", req())
    await q.redis.script_flush()
    deliveries, skipped = await read_all(q, "w1", 3)
    assert len(deliveries) == 3 and not skipped
    for d in deliveries:
        assert d.job.status is JobStatus.RUNNING and d.job.deliveries == 1 and d.job.entry == d.entry_id
        assert d.job.started_at is not None and d.job.body == CHAT
        assert await q.redis.hmget(q.keys.job(d.job.id), ["lease", "worker"]) == [d.lease, "w1"]


# ---------------------------------------------------------------- enqueue


async def test_enqueue_writes_record_entry_and_counters_in_one_step(q: Queue) -> None:
    job, replayed = await q.enqueue("t", req(metadata={"a": "b"}, timeout_s=5, ttl_s=60))
    assert not replayed and job.status is JobStatus.QUEUED and job.id.startswith("job_")
    stored = await q.get(job.id)
    assert stored is not None and stored.metadata == {"a": "b"} and stored.timeout_s == 5
    assert await live_entries(q, job.id) == [stored.entry]
    assert (await q.stats())["unfinished"] == 1


async def test_same_idempotency_key_and_request_replays_the_same_job(q: Queue) -> None:
    first, _ = await q.enqueue("t", req(idempotency_key="k1"))
    again, replayed = await q.enqueue("t", req(idempotency_key="k1"))
    assert replayed and again.id == first.id
    assert len(await live_entries(q, first.id)) == 1
    [idem_key] = await q.redis.keys(q.keys.prefix + "idem:t:*")
    assert await q.redis.get(idem_key) == first.id  # the key holds the job id (docs/data-model.md)


async def test_same_idempotency_key_with_another_request_is_a_conflict(q: Queue) -> None:
    first, _ = await q.enqueue("t", req(idempotency_key="k1"))
    with pytest.raises(IdempotencyConflict) as info:
        await q.enqueue("t", JobRequest(body={"prompt": "other"}, idempotency_key="k1"))
    assert info.value.job_id == first.id


async def test_the_request_digest_is_kept_only_for_a_job_with_an_idempotency_key(q: Queue) -> None:
    """The digest is what a retry under the same key is checked against (docs/data-model.md); a job without a key
    has nothing to be checked against, and the submit skips hashing its request."""
    keyed, _ = await q.enqueue("t", req(idempotency_key="k1"))
    plain, _ = await q.enqueue("t", req())
    assert await q.redis.hget(q.keys.job(keyed.id), "digest") == req(idempotency_key="k1").digest()
    assert await q.redis.hget(q.keys.job(plain.id), "digest") == ""


async def test_idempotency_keys_are_per_tenant(q: Queue) -> None:
    a, _ = await q.enqueue("a", req(idempotency_key="k"))
    b, replayed = await q.enqueue("b", req(idempotency_key="k"))
    assert not replayed and a.id != b.id


async def test_concurrent_identical_submits_make_exactly_one_job_and_one_entry(q: Queue) -> None:
    results = await asyncio.gather(*(q.enqueue("t", req(idempotency_key="same")) for _ in range(20)))
    assert len({job.id for job, _ in results}) == 1
    assert sum(1 for _, replayed in results if not replayed) == 1
    assert await q.redis.xlen(q.keys.stream) == 1


async def test_depth_limit_rejects_past_max_unfinished(q: Queue) -> None:
    q.settings = q.settings.replace(max_queue_depth=2)
    await q.enqueue("t", req())
    await q.enqueue("t", req())
    with pytest.raises(QueueFull) as info:
        await q.enqueue("t", req())
    assert info.value.unfinished == 2
    assert len(await queued(q)) == 2
    # the refused job left no count behind (the script takes the counts first and gives them back)
    stats = await q.stats()
    assert stats["unfinished"] == 2 and stats["enqueued"] == 2
    assert await q.redis.hgetall(q.keys.tenants) == {"t": "2"}


async def test_each_submit_is_one_enqueue_call_accepted_or_refused_as_the_limits_say(q: Queue) -> None:
    """Submits one after the other (a Lambda sandbox's requests) are a script call each: accepted, an idempotent
    replay, a tenant's quota, the queue's depth, and the counters they share add up."""
    q.settings = q.settings.replace(max_queue_depth=5, tenant_max_depth=3)
    await q.enqueue("b", req())
    earlier, _ = await q.enqueue("a", req(idempotency_key="k0"))
    before = await commandstats_calls(q, "evalsha")
    submits = [("a", req()), ("a", req(idempotency_key="k0")), ("a", req(idempotency_key="k1")),
               ("a", req(idempotency_key="k1")), ("a", req()), ("b", req(ttl_s=60)), ("b", req())]
    answers: list[object] = []
    for tenant, request in submits:
        try:
            answers.append(await q.enqueue(tenant, request))
        except QueueFull as exc:
            answers.append(exc)
    per_call = 2 if isinstance(q.scripts, Resending) else 1
    assert await commandstats_calls(q, "evalsha") - before == len(submits) * per_call

    accepted, replay0, keyed, replay1, over_quota, with_ttl, over_depth = answers
    assert isinstance(accepted, tuple) and accepted[1] is False
    assert isinstance(replay0, tuple) and replay0[1] is True and replay0[0].id == earlier.id
    assert isinstance(keyed, tuple) and keyed[1] is False
    assert isinstance(replay1, tuple) and replay1[1] is True and replay1[0].id == keyed[0].id
    assert isinstance(over_quota, TenantQuotaFull) and over_quota.unfinished == 3
    assert isinstance(with_ttl, tuple) and with_ttl[1] is False
    assert isinstance(over_depth, QueueFull) and not isinstance(over_depth, TenantQuotaFull)
    assert over_depth.unfinished == 5

    stats = await q.stats()
    assert stats["unfinished"] == 5 and stats["enqueued"] == 5
    assert await q.redis.hgetall(q.keys.tenants) == {"a": "3", "b": "2"}
    assert len(await queued(q)) == 5
    assert await q.redis.zrange(q.keys.expiry, 0, -1) == [with_ttl[0].id]
    for job, _ in (accepted, keyed, with_ttl):
        stored = await q.get(job.id)
        assert stored is not None and stored.status is JobStatus.QUEUED
        assert int(stored.created_at * 1000) == int(job.created_at * 1000)
        assert (await queued(q)).count(job.id) == 1


async def test_a_submit_whose_arguments_cannot_be_encoded_fails_alone_and_the_concurrent_others_are_accepted(
    q: Queue,
) -> None:
    """A submit that carries what Redis cannot be sent (a lone surrogate, as ``json.loads`` makes of ``"\\ud800"``)
    fails that submitter only: the others sent at the same time are accepted."""
    bad = [req(webhook_url="https://hooks.example/\ud800"), req(metadata={"k": "v"}, idempotency_key="\udc00")]
    for spoiler in bad:
        submits = [req(), req(), spoiler, req(idempotency_key="fine"), req()]
        answers = await asyncio.gather(*(q.enqueue("t", r) for r in submits), return_exceptions=True)
        assert isinstance(answers[2], (UnicodeEncodeError, redis.exceptions.DataError)), answers[2]
        for answer in answers[:2] + answers[3:]:
            assert isinstance(answer, tuple), answer
            stored = await q.get(answer[0].id)
            assert stored is not None and stored.status is JobStatus.QUEUED
    stats = await q.stats()
    assert stats["unfinished"] == 7 and stats["enqueued"] == 7  # 4 + 4, less the replay of "fine"


async def test_a_refused_batch_gives_back_every_count_it_took(q: Queue) -> None:
    """The script takes the counters for the whole batch first: a batch refused whole, or replayed whole, leaves
    them as they were, and a tenant with no open job is not left in the hash."""
    q.settings = q.settings.replace(max_queue_depth=1)
    kept, _ = await q.enqueue("a", req(idempotency_key="k"))
    answers = await asyncio.gather(*(q.enqueue("b", req()) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(a, QueueFull) and a.unfinished == 1 for a in answers)
    assert (await q.enqueue("a", req(idempotency_key="k")))[0].id == kept.id
    stats = await q.stats()
    assert stats["unfinished"] == 1 and stats["enqueued"] == 1
    assert await q.redis.hgetall(q.keys.tenants) == {"a": "1"}


async def test_many_jobs_are_split_over_enqueue_calls_and_each_accepted(q: Queue) -> None:
    n = SCRIPT_BATCH * 2 + 3
    await q.enqueue("warm", req())  # the script is loaded on the server (a first EVALSHA answers NOSCRIPT)
    before = await commandstats_calls(q, "evalsha")
    accepted = await q.enqueue_many("t", [req(metadata={"i": str(i)}) for i in range(n)])
    assert await commandstats_calls(q, "evalsha") - before == 3 * (2 if isinstance(q.scripts, Resending) else 1)
    assert [replayed for _, replayed in accepted] == [False] * n and len({j.id for j, _ in accepted}) == n
    assert (await queued(q))[1:] == [j.id for j, _ in accepted]
    stored = [await q.get(j.id) for j, _ in accepted]
    assert [job.metadata if job else None for job in stored] == [{"i": str(i)} for i in range(n)]
    stats = await q.stats()
    assert stats["unfinished"] == n + 1 and stats["enqueued"] == n + 1
    assert await q.redis.hgetall(q.keys.tenants) == {"t": str(n), "warm": "1"}


# ---------------------------------------------------------------- start / finish


async def test_read_starts_the_job_and_returns_its_request(q: Queue) -> None:
    job, _ = await q.enqueue("t", req(traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01"))
    deliveries, skipped = await q.read("w1", 10)
    assert not skipped and len(deliveries) == 1
    d = deliveries[0]
    assert d.job.id == job.id and d.job.status is JobStatus.RUNNING and d.job.body == CHAT
    assert d.job.traceparent and d.job.deliveries == 1 and d.job.started_at


async def test_finish_is_first_writer_wins_and_counts_duplicates(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)
    assert await q.finish(d, JobStatus.SUCCEEDED, result={"status_code": 200, "body": {"x": 1}}) is Outcome.WRITTEN
    assert await q.finish(d, JobStatus.FAILED, error={"type": "x", "message": "late"}) is Outcome.DUPLICATE
    stored = await q.get(job.id)
    assert stored and stored.status is JobStatus.SUCCEEDED and stored.result == {"status_code": 200, "body": {"x": 1}}
    stats = await q.stats()
    assert stats["duplicate_results"] == 1 and stats["unfinished"] == 0 and stats["succeeded"] == 1
    assert await q.redis.xlen(q.keys.stream) == 0  # acknowledged entries are deleted
    assert 0 < await q.redis.ttl(q.keys.job(job.id)) <= q.settings.result_ttl_s
    events = await q.redis.xrange(q.keys.events)
    assert [(f["job"], f["status"]) for _, f in events] == [(job.id, "succeeded")]


async def test_one_finish_call_settles_a_batch_each_job_as_by_a_call_of_its_own(q: Queue) -> None:
    """A worker's finishes that are ready together are one script call: each job gets the answer a call of its own
    would have given (written, a duplicate, a stale holder's refusal) and the counters they share are written once,
    adding up to what one call per job would have written; sent again, the batch answers the same, changes
    nothing."""
    jobs = [(await q.enqueue(tenant, req()))[0] for tenant in ("a", "a", "b", "a", "b")]
    deliveries, _ = await read_all(q, "w1", 5)
    d1, d2, d3, d4, d5 = sorted(deliveries, key=lambda d: [j.id for j in jobs].index(d.job.id))
    ok = {"status_code": 200, "body": {}}
    assert await q.finish(d3, JobStatus.SUCCEEDED, result=ok) is Outcome.WRITTEN  # d3 ends twice
    stale = dataclasses.replace(d4, lease="not-this-deliverys")  # a holder that lost the delivery
    batch = [(d1, JobStatus.SUCCEEDED, ok, None), (d2, JobStatus.FAILED, None, {"type": "x", "message": "m"}),
             (d3, JobStatus.FAILED, None, {"type": "x", "message": "late"}), (stale, JobStatus.SUCCEEDED, ok, None),
             (d5, JobStatus.CANCELLED, None, {"type": "cancelled", "message": "m"})]
    answers = [Outcome.WRITTEN, Outcome.WRITTEN, Outcome.DUPLICATE, Outcome.STALE, Outcome.WRITTEN]
    assert await q.finish_many(batch) == answers

    stats = await q.stats()
    assert (stats["unfinished"], stats["succeeded"], stats["failed"], stats["cancelled"]) == (1, 2, 1, 1)
    assert stats["duplicate_results"] == 1 and stats["stale_writes"] == 1
    assert await q.redis.hgetall(q.keys.tenants) == {"a": "1"}  # b's jobs all ended: b left the hash
    records = [await q.redis.hgetall(q.keys.job(j.id)) for j in jobs]
    ended = [r for r in records if r["status"] != "running"]
    assert [r["status"] for r in records] == ["succeeded", "failed", "succeeded", "running", "cancelled"]
    assert stats["latency_ms_total"] == sum(int(r["finished_at"]) - int(r["created_at"]) for r in ended)
    events = await q.redis.xrange(q.keys.events)
    assert [f["job"] for _, f in events] == [jobs[2].id, jobs[0].id, jobs[1].id, jobs[4].id]
    assert [await q.redis.lrange(q.keys.done(j.id), 0, -1) for j in jobs] == [
        ["succeeded"], ["failed"], ["succeeded"], [], ["cancelled"]]
    assert [e for e, _ in await q.redis.xrange(q.keys.stream)] == [d4.entry_id]

    assert await q.finish_many(batch) == answers  # the worker's own retry of the write: a resend of each job's
    assert await q.stats() == stats
    assert await q.redis.xlen(q.keys.events) == 4
    assert await q.finish(d4, JobStatus.SUCCEEDED, result=ok) is Outcome.WRITTEN  # its holder still can


async def test_a_batch_larger_than_one_call_takes_is_split_and_settled_whole(q: Queue) -> None:
    n = SCRIPT_BATCH * 2 + 3
    for _ in range(n):
        await q.enqueue("t", req())
    deliveries: list = []
    while len(deliveries) < n:
        deliveries += (await q.read("w1", n))[0]
    before = await commandstats_calls(q, "evalsha")
    assert await q.finish_many([(d, JobStatus.SUCCEEDED, {"status_code": 200, "body": {}}, None)
                                for d in deliveries]) == [Outcome.WRITTEN] * n
    calls = await commandstats_calls(q, "evalsha") - before
    assert calls == 3 * (2 if isinstance(q.scripts, Resending) else 1)
    stats = await q.stats()
    assert stats["unfinished"] == 0 and stats["succeeded"] == n and await q.redis.hgetall(q.keys.tenants) == {}


async def commandstats_calls(q: Queue, command: str) -> int:
    """How many times the queue's server (its one node, in cluster mode) has run ``command``."""
    node = Redis.from_url(q.settings.redis_url.split("?", 1)[0])  # a plain connection answers for its node alone
    try:
        info = await node.info("commandstats")
    finally:
        await node.aclose()
    return int(info.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_result_is_stored_and_read_back_exactly_whatever_json_holds(q: Queue) -> None:
    """A model server's JSON as ``json.loads`` reads it: a lone surrogate (which UTF-8 cannot carry raw), integers
    beyond 64 bits, non-ASCII; the body as submitted, likewise. Each is stored and read back as it was."""
    body = {"model": "m", "seed": 2**64 + 1, "messages": [{"role": "user", "content": "é ☃"}]}
    job, _ = await q.enqueue("t", JobRequest(body=body))
    (d,), _ = await q.read("w1", 1)
    assert d.job.body == body and type(d.job.body["seed"]) is int
    answer = json.loads('{"text": "\\ud83d broken", "n": 123456789012345678901234567890, "u": "日本"}')
    result = {"status_code": 200, "body": answer}
    assert await q.finish(d, JobStatus.SUCCEEDED, result=result) is Outcome.WRITTEN
    stored = await q.get(job.id)
    assert stored is not None and stored.result == result and type(stored.result["body"]["n"]) is int


async def test_a_terminal_job_redelivered_is_acknowledged_without_running(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    await q.read("w1", 1)
    # simulate the crash window: the job ended, but its entry is still pending (another writer finished it)
    await q.redis.hset(q.keys.job(job.id), "status", "succeeded")
    deliveries, skipped = await q.reclaim("w2", 10)
    assert deliveries == [] and skipped[0].status == "succeeded"
    assert await q.redis.xlen(q.keys.stream) == 0


async def test_start_dead_letters_past_max_deliveries(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    for consumer in ("w1", "w2"):
        deliveries, _ = await (q.read(consumer, 1) if consumer == "w1" else q.reclaim(consumer, 1))
        assert len(deliveries) == 1  # delivered, then "crashed" (never finished)
    deliveries, skipped = await q.reclaim("w3", 1)
    assert deliveries == [] and skipped[0].status == "failed"
    stored = await q.get(job.id)
    assert stored and stored.dead_lettered and stored.error and stored.error["type"] == "max_deliveries"
    assert await q.redis.xlen(q.keys.dlq) == 1 and await q.redis.xlen(q.keys.stream) == 0


async def test_a_job_past_its_ttl_expires_without_any_worker(q: Queue) -> None:
    """The sweep (scaler, workers) and a read both expire it: it leaves the unfinished count at once."""
    swept, _ = await q.enqueue("t", req(ttl_s=1), now=now_ms() - 5000)
    read, _ = await q.enqueue("t", req(ttl_s=1), now=now_ms() - 5000)
    kept, _ = await q.enqueue("t", req(ttl_s=600))
    assert (await q.get(read.id, "t")).status is JobStatus.EXPIRED  # type: ignore[union-attr]
    assert await q.expire_due() == 1
    stored = await q.get(swept.id)
    assert stored and stored.status is JobStatus.EXPIRED and stored.error and stored.error["type"] == "expired"
    assert await live_entries(q, swept.id) == [] and await q.redis.zcard(q.keys.expiry) == 1
    assert (await q.stats())["unfinished"] == 1 and (await q.get(kept.id)).status is JobStatus.QUEUED  # type: ignore[union-attr]
    assert await q.wait(swept.id, "t", 1) is not None  # the wakeup was pushed: no wait


async def test_a_started_job_can_no_longer_expire(q: Queue) -> None:
    job, _ = await q.enqueue("t", req(ttl_s=1))
    (d,), _ = await q.read("w1", 1)
    await q.release(d)
    assert await q.redis.zcard(q.keys.expiry) == 0
    assert await q.expire_due(now=now_ms() + 10_000) == 0
    (d2,), _ = await q.read("w1", 1)
    assert d2.job.id == job.id


async def test_one_start_call_begins_a_whole_read_each_entry_as_by_a_call_of_its_own(q: Queue) -> None:
    """The entries of one read are begun by one script call: each is answered as a call of its own would have
    been (run it, a job gone, a job expired before any attempt), and each delivery carries its job's record. (First
    come, first served: the four jobs are in the stream for one read to take, as fair share would not leave them.)"""
    q.settings = q.settings.replace(fair_share=False)
    await q.enqueue("t", req())
    (warm,), _ = await q.read("w1", 1)  # the script is loaded on the server (a first EVALSHA answers NOSCRIPT)
    await q.finish(warm, JobStatus.SUCCEEDED, result={"status_code": 200, "body": {}})
    first, _ = await q.enqueue("t", req(metadata={"n": "1"}))
    gone, _ = await q.enqueue("t", req())
    late, _ = await q.enqueue("t", req(ttl_s=1), now=now_ms() - 5000)
    last, _ = await q.enqueue("t", req(metadata={"n": "4"}))
    await q.redis.delete(q.keys.job(gone.id))
    before = await commandstats_calls(q, "evalsha")
    deliveries, skipped = await q.read("w1", 10)
    assert await commandstats_calls(q, "evalsha") - before == (2 if isinstance(q.scripts, Resending) else 1)
    assert [(d.job.id, d.job.metadata, d.job.status, d.job.deliveries) for d in deliveries] == [
        (first.id, {"n": "1"}, JobStatus.RUNNING, 1), (last.id, {"n": "4"}, JobStatus.RUNNING, 1)]
    assert len({d.lease for d in deliveries}) == 2
    assert [(k.job_id, k.code, k.status) for k in skipped] == [
        (gone.id, Code.NOT_FOUND, None), (late.id, Code.ENDED, "expired")]
    assert [e for e, _ in await q.redis.xrange(q.keys.stream)] == [d.entry_id for d in deliveries]
    stats = await q.stats()
    assert stats["expired"] == 1 and stats["unfinished"] == 3  # the record deleted under it is not counted here
    for d in deliveries:
        assert await q.finish(d, JobStatus.SUCCEEDED, result={"status_code": 200, "body": {}}) is Outcome.WRITTEN


async def test_every_counter_is_readable_from_the_start(q: Queue) -> None:
    stats = await q.stats()
    assert stats["duplicate_results"] == 0 and stats["reclaimed"] == 0 and stats["unfinished"] == 0


async def test_start_expires_a_job_whose_ttl_passed_before_any_attempt(q: Queue) -> None:
    job, _ = await q.enqueue("t", req(ttl_s=1), now=now_ms() - 5000)
    deliveries, skipped = await q.read("w1", 1)
    assert deliveries == [] and skipped[0].status == "expired"
    stored = await q.get(job.id)
    assert stored and stored.status is JobStatus.EXPIRED and (await q.stats())["unfinished"] == 0


# ---------------------------------------------------------------- retry


async def test_retry_acks_and_re_adds_atomically(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)
    assert await q.retry(d, delay_ms=0, error={"type": "timeout", "message": "t"}) is Outcome.RETRY_SCHEDULED
    entries = await live_entries(q, job.id)
    assert len(entries) == 1 and entries[0] != d.entry_id
    assert (await q.redis.xpending(q.keys.stream, GROUP))["pending"] == 0
    (d2,), _ = await q.read("w1", 1)
    assert d2.attempt == 2 and d2.job.deliveries == 1


async def test_retry_with_backoff_waits_in_the_delayed_set_until_promoted(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)
    await q.retry(d, delay_ms=60_000, error={"type": "timeout", "message": "t"})
    assert await live_entries(q, job.id) == []
    assert await q.redis.zscore(q.keys.delayed, job.id)
    assert await q.promote() == 0  # not due yet
    assert await q.promote(now=now_ms() + 61_000) == 1
    assert await q.promote(now=now_ms() + 61_000) == 0  # promoting twice adds nothing
    assert len(await live_entries(q, job.id)) == 1


async def test_retry_past_max_attempts_fails_and_dead_letters(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    for _ in range(3):
        (d,), _ = await q.read("w1", 1)
        outcome = await q.retry(d, delay_ms=0, error={"type": "server_error", "message": "503"})
    assert outcome is Outcome.DEAD_LETTERED
    stored = await q.get(job.id)
    assert stored and stored.status is JobStatus.FAILED and stored.dead_lettered and stored.attempts == 3
    assert stored.error == {"type": "server_error", "message": "503"}
    assert [j.id for j in await q.dead_letters("t")] == [job.id]
    assert await q.dead_letters("other-tenant") == []


async def test_stale_retry_from_a_worker_that_lost_its_lease_adds_nothing(q: Queue) -> None:
    """The crash window the original design left open: w1's lease expired, w2 reclaimed and retried the job;
    w1's late retry must not add a second live entry."""
    job, _ = await q.enqueue("t", req())
    (d1,), _ = await q.read("w1", 1)
    (d2,), _ = await q.reclaim("w2", 1)
    assert d2.entry_id == d1.entry_id
    assert await q.retry(d2, delay_ms=0, error={"type": "e", "message": "m"}) is Outcome.RETRY_SCHEDULED
    assert await q.retry(d1, delay_ms=0, error={"type": "e", "message": "m"}) is Outcome.STALE
    assert len(await live_entries(q, job.id)) == 1


async def test_a_late_success_from_a_stale_holder_changes_nothing(q: Queue) -> None:
    """Owner check (G9): w1 lost the delivery to w2, whose retry queued the next attempt; w1's late success is
    refused and counted, and the newer attempt stays in charge."""
    job, _ = await q.enqueue("t", req())
    (d1,), _ = await q.read("w1", 1)
    (d2,), _ = await q.reclaim("w2", 1)
    await q.retry(d2, delay_ms=0, error={"type": "e", "message": "m"})
    newer = await live_entries(q, job.id)
    assert await q.finish(d1, JobStatus.SUCCEEDED, result={"status_code": 200, "body": {}}) is Outcome.STALE
    assert await live_entries(q, job.id) == newer and len(newer) == 1
    stored = await q.get(job.id)
    assert stored and stored.status is JobStatus.QUEUED and stored.attempts == 2
    stats = await q.stats()
    assert stats["unfinished"] == 1 and stats["stale_writes"] == 1 and stats["duplicate_results"] == 0


# ---------------------------------------------------------------- release / renew


async def test_release_gives_the_job_back_without_spending_an_attempt(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)
    assert await q.release(d) is Outcome.RELEASED
    (d2,), _ = await q.read("w2", 1)
    assert d2.job.id == job.id and d2.attempt == 1 and d2.job.deliveries == 1
    # the same release again is a resend (G9): it answers as the first did and changes nothing
    assert await q.release(d) is Outcome.RELEASED
    assert await live_entries(q, job.id) == [d2.entry_id] and (await q.stats())["released"] == 1
    assert await q.finish(d, JobStatus.FAILED, error={"type": "x", "message": "late"}) is Outcome.STALE


async def test_renew_keeps_own_leases_and_reports_lost_ones(q: Queue) -> None:
    await q.enqueue("t", req())
    await q.enqueue("t", req())
    held = (await read_all(q, "w1", 2))[0]
    # idle for a day as far as the server knows (XCLAIM IDLE to the same consumer, JUSTID: not a delivery)
    await q.redis.xclaim(q.keys.stream, GROUP, "w1", 0, [d.entry_id for d in held], idle=DAY_MS, justid=True)
    assert await q.renew("w1", held) == [Lease.HELD, Lease.HELD]
    pending = await q.redis.xpending_range(q.keys.stream, GROUP, "-", "+", 10)
    assert all(p["time_since_delivered"] < DAY_MS // 2 for p in pending)  # renewed: idle from the renewal
    assert all(p["times_delivered"] == 1 for p in pending)  # renewal is not a delivery
    (stolen,), _ = await q.reclaim("w2", 1)
    leases = await q.renew("w1", held)
    assert sorted(leases) == [Lease.HELD, Lease.LOST]
    owners = {p["message_id"]: p["consumer"] for p in await q.redis.xpending_range(q.keys.stream, GROUP, "-", "+", 10)}
    assert owners[stolen.entry_id] == "w2"  # renewal never steals back


async def test_renew_reports_cancellation_and_terminal_jobs(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    held = (await q.read("w1", 1))[0]
    await q.cancel("t", job.id)
    assert await q.renew("w1", held) == [Lease.CANCEL_REQUESTED]
    assert await q.finish(held[0], JobStatus.CANCELLED, error={"type": "cancelled", "message": "c"}) is Outcome.WRITTEN
    assert await q.renew("w1", held) == [Lease.TERMINAL]


# ---------------------------------------------------------------- cancel / redrive


async def test_cancel_of_a_queued_job_is_immediate_and_removes_its_entry(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    cancelled = await q.cancel("t", job.id)
    assert cancelled.status is JobStatus.CANCELLED and cancelled.error
    assert await q.redis.xlen(q.keys.stream) == 0 and (await q.stats())["unfinished"] == 0
    with pytest.raises(JobTerminal):
        await q.cancel("t", job.id)


async def test_cancel_of_a_delayed_job_removes_it_from_the_delayed_set(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)
    await q.retry(d, delay_ms=60_000, error={"type": "e", "message": "m"})
    await q.cancel("t", job.id)
    assert await q.redis.zcard(q.keys.delayed) == 0
    assert await q.promote(now=now_ms() + 120_000) == 0


async def test_cancel_of_another_tenants_job_is_not_found(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    with pytest.raises(JobNotFound):
        await q.cancel("intruder", job.id)
    with pytest.raises(JobNotFound):
        await q.cancel("t", "job_doesnotexist")


async def test_a_cancel_requested_job_whose_worker_died_ends_cancelled_on_reclaim(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    await q.read("w1", 1)
    await q.cancel("t", job.id)
    deliveries, skipped = await q.reclaim("w2", 1)
    assert deliveries == [] and skipped[0].status == "cancelled"
    stored = await q.get(job.id)
    assert stored and stored.status is JobStatus.CANCELLED


async def test_redrive_re_enqueues_a_dead_lettered_job_with_attempts_reset(q: Queue) -> None:
    job, _ = await q.enqueue("t", req())
    for _ in range(3):
        (d,), _ = await q.read("w1", 1)
        await q.retry(d, delay_ms=0, error={"type": "e", "message": "m"})
    with pytest.raises(JobNotFound):
        await q.redrive("intruder", job.id)
    again = await q.redrive("t", job.id)
    assert again.status is JobStatus.QUEUED and again.attempts == 1 and not again.dead_lettered
    assert again.error is None and await q.redis.ttl(q.keys.job(job.id)) == -1
    assert await q.dead_letters("t") == [] and (await q.stats())["unfinished"] == 1
    (d,), _ = await q.read("w1", 1)
    assert d.job.id == job.id
    with pytest.raises(NotDeadLettered):
        await q.redrive("t", job.id)


# ---------------------------------------------------------------- observe / wait


async def test_observe_reads_lag_pending_delayed_and_workers(q: Queue) -> None:
    for _ in range(5):
        await q.enqueue("t", req())
    (d, *_), _ = await read_all(q, "w1", 2)
    await q.retry(d, delay_ms=60_000, error={"type": "e", "message": "m"})
    await q.heartbeat("w1", 1)
    await q.heartbeat("w-old", 3, now=now_ms() - 10 * 60_000)  # stale heartbeat: ignored
    obs = await q.observe()
    assert (obs.lag, obs.pending, obs.delayed, obs.unfinished) == (3, 1, 1, 5)
    assert (obs.workers, obs.busy_workers, obs.in_flight) == (1, 1, 1)
    assert obs.oldest_entry_ms > 0 and obs.backlog == 5


async def test_observe_of_a_queue_that_was_never_used_is_empty(q: Queue) -> None:
    fresh = Queue(q.redis, q.settings.replace(queue=q.settings.queue + "x"))
    obs = await fresh.observe()
    assert (obs.lag, obs.pending, obs.delayed, obs.unfinished, obs.workers) == (0, 0, 0, 0, 0)
    assert obs.desired is None


async def test_observe_of_a_stream_without_its_group_counts_everything_as_lag(q: Queue) -> None:
    other = Queue(q.redis, q.settings.replace(queue=q.settings.queue + "g"))
    await other.redis.xadd(other.keys.stream, {"job": "x", "attempt": "1"})
    obs = await other.observe()
    assert obs.group_missing and obs.lag == 1 and obs.pending == 0


DAY_MS = 86_400_000


async def waits_blocked(q: Queue, job_id: str, count: int, shared: bool) -> None:
    """Until ``count`` waits of the job block: registered with the shared reader, or each in its own ``BLMOVE``."""

    async def blocked() -> bool:
        if shared:
            return q.waiters.waiting(job_id) >= count
        return await blocked_in(q.redis, "blmove") >= count

    await eventually_async(blocked, what=f"{count} waits of {job_id} blocked")


@pytest.mark.parametrize("shared", [False, True], ids=["own-wakeup-list", "shared-reader"])
async def test_wait_returns_as_soon_as_the_job_is_terminal(q: Queue, shared: bool) -> None:
    job, _ = await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)

    # every waiter wakes, not only the first
    waiters = [asyncio.create_task(q.wait(job.id, "t", 20, shared=shared)) for _ in range(3)]
    await waits_blocked(q, job.id, 3, shared)
    assert not any(w.done() for w in waiters)  # the job runs: they wait
    await q.finish(d, JobStatus.SUCCEEDED, result={"status_code": 200, "body": {}})
    # woken by the finish, long before the waits' 20 s deadline (a guard: it fails the test if they were not)
    results = await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert all(r and r.status is JobStatus.SUCCEEDED for r in results)
    assert (await q.wait(job.id, "other", 1, shared=shared)) is None


@pytest.mark.parametrize("shared", [False, True], ids=["own-wakeup-list", "shared-reader"])
async def test_hundreds_of_concurrent_waits_do_not_exhaust_the_connection_pool(q: Queue, shared: bool) -> None:
    job, _ = await q.enqueue("t", req())
    waits = [asyncio.create_task(q.wait(job.id, "t", 30, shared=shared)) for _ in range(300)]
    await waits_blocked(q, job.id, 300, shared)
    assert await q.get(job.id, "t") is not None  # other calls still get a connection while 300 block
    (d,), _ = await q.read("w1", 1)
    await q.finish(d, JobStatus.SUCCEEDED, result={"status_code": 200, "body": {}})
    results = await asyncio.gather(*waits)
    assert all(r and r.status is JobStatus.SUCCEEDED for r in results)


@pytest.mark.parametrize("shared", [False, True], ids=["own-wakeup-list", "shared-reader"])
async def test_wait_times_out_with_the_job_as_it_is(q: Queue, shared: bool) -> None:
    job, _ = await q.enqueue("t", req())
    result = await q.wait(job.id, "t", 0.3, shared=shared)
    assert result and result.status is JobStatus.QUEUED


async def test_a_read_without_the_body_gives_the_same_job_object_in_every_state(q: Queue) -> None:
    """The gateway reads jobs without their request body (the job object has none): every field the API shows
    must still come back, whatever the job's state."""
    running, _ = await q.enqueue("t", req())
    finished, _ = await q.enqueue("t", req(priority=Priority.LOW))
    failed, _ = await q.enqueue("t", req())
    deliveries = {}
    while len(deliveries) < 3:
        got, _ = await q.read("w1", 3)
        deliveries.update({d.job.id: d for d in got})
    queued, _ = await q.enqueue("t", req(metadata={"k": "v"}, webhook_url="https://example.com/hook", ttl_s=600,
                                         timeout_s=30, priority=Priority.HIGH,
                                         traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01"))
    await q.finish(deliveries[finished.id], JobStatus.SUCCEEDED, result={"status_code": 200, "body": {"x": [1]}})
    await q.finish(deliveries[failed.id], JobStatus.FAILED, error={"type": "model_error", "message": "m"})
    await q.cancel("t", running.id)  # running: cancellation requested
    states = set()
    for job_id in (queued.id, running.id, finished.id, failed.id):
        whole, light = await q.get(job_id, "t"), await q.get(job_id, "t", with_body=False)
        assert whole and light and light.body == {}
        assert bool(whole.body) is not whole.status.terminal  # an ended job's body is dropped
        states.add(whole.status)
        assert light.to_api() == whole.to_api()
        assert light == dataclasses.replace(whole, body={})
    assert states == {JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED}
    assert await q.get(queued.id, "other", with_body=False) is None
    assert await q.get("job_missing", "t", with_body=False) is None


async def test_job_object_matches_the_api_contract(q: Queue) -> None:
    job, _ = await q.enqueue("t", req(metadata={"k": "v"}))
    api = job.to_api()
    assert set(api) == {"id", "object", "status", "url", "attempts", "created_at", "started_at", "finished_at",
                        "result", "error", "dead_lettered", "metadata", "priority"}
    assert api["object"] == "job" and api["metadata"] == {"k": "v"} and api["priority"] == "normal"
    json.dumps(api)
