"""Per-tenant bounds of a queue (G11, inferq/queue/holds.py) on a real Valkey, standalone and cluster, each script
call also resent: what a tenant's ended jobs leave behind is charged to it until the records expire, and past
``INFERQ_TENANT_MAX_RETAINED_BYTES`` its submits are refused until the charge goes; a tenant whose jobs killed the
engine ``INFERQ_ENGINE_STRIKES`` times within the window is refused for the cool-off; an engine_died dead letter is
an operator's to redrive. Time is the scripts' ``now``, moved by the test."""

from __future__ import annotations

from typing import Any

import pytest

from inferq.queue.holds import BUCKET_MS, RECORD_OVERHEAD_BYTES
from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.protocol import EngineCoolOff, JobNotFound, OperatorOnly, Outcome, Queue, RetainedQuotaFull
from tests.support.queued import read_all

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ENGINE_DIED = {"type": "engine_died", "message": "the model server died running it"}
HOUR = BUCKET_MS
T0 = 1_800_000_000_000 - 1_800_000_000_000 % HOUR + 60_000  # a minute into an hour
DAY_S = 86_400


def req(**kw: Any) -> JobRequest:
    return JobRequest(body=dict(CHAT), **kw)


async def held(q: Queue, tenant: str) -> dict[str, str]:
    return {k.split("|", 1)[1]: v for k, v in (await q.redis.hgetall(q.keys.bounds)).items()
            if k.startswith(tenant + "|")}


async def run_one(q: Queue, tenant: str, now: int, **finish: Any) -> str:
    job, _ = await q.enqueue(tenant, req(), now=now)
    (delivery,), _ = await q.read("w1", 1)
    assert await q.finish(delivery, finish.pop("status", JobStatus.SUCCEEDED), now=now, **finish) is Outcome.WRITTEN
    return job.id


async def test_an_ended_job_is_charged_to_its_tenant_until_the_hour_its_record_expires_in(q: Queue) -> None:
    result = {"status_code": 200, "body": {"choices": [{"message": {"content": "hello"}}]}}
    job_id = await run_one(q, "a", T0, result=result)
    charged = await held(q, "a")
    expiry_hour = (T0 + DAY_S * 1000) // HOUR
    kept = int(charged["kept"])
    assert charged == {"kept": str(kept), str(expiry_hour): str(kept), "from": str(expiry_hour)}
    # the fixed overhead, the result, and the settle memo (a few bytes)
    assert 0 <= kept - RECORD_OVERHEAD_BYTES - len(await q.redis.hget(q.keys.job(job_id), "result") or "") <= 32
    # a cancelled job's record is charged too (what it keeps: its metadata)
    queued, _ = await q.enqueue("a", req(metadata={"k": "v" * 100}), now=T0)
    await q.cancel("a", queued.id, now=T0)
    assert int((await held(q, "a"))["kept"]) > kept + RECORD_OVERHEAD_BYTES + 100
    assert await held(q, "b") == {}


async def test_past_its_quota_a_tenants_submits_are_refused_until_the_charge_of_an_hour_is_given_back(
    q: Queue
) -> None:
    q.settings = q.settings.replace(tenant_max_retained_bytes=2 * RECORD_OVERHEAD_BYTES, result_ttl_s=3600)
    await run_one(q, "a", T0)
    await run_one(q, "a", T0 + 600_000)
    with pytest.raises(RetainedQuotaFull) as refused:
        await q.enqueue("a", req(), now=T0 + 1_200_000)
    # the records expire an hour after they ended, in the next hour: their charge goes when that hour is over
    given_back_at = (T0 // HOUR + 2) * HOUR
    assert refused.value.retry_after_s == (given_back_at - T0 - 1_200_000) / 1000
    assert (await q.enqueue("b", req(), now=T0 + 1_200_000))[0].id  # another tenant's quota is its own
    with pytest.raises(RetainedQuotaFull):
        await q.enqueue("a", req(), now=given_back_at - 1)
    job, _ = await q.enqueue("a", req(), now=given_back_at)
    assert job.status is JobStatus.QUEUED
    # every hour charged is over: nothing of the tenant's is left in the hash
    assert await held(q, "a") == {}


async def test_a_batch_lines_record_is_charged_until_its_batch_ends(q: Queue) -> None:
    job, _ = await q.enqueue("a", req(), now=T0)
    keep_until_s = (T0 + 3 * DAY_S * 1000) // 1000
    await q.redis.hset(q.keys.job(job.id), "keep_until", keep_until_s)
    (delivery,), _ = await q.read("w1", 1)
    await q.finish(delivery, JobStatus.SUCCEEDED, result={"status_code": 200, "body": {}}, now=T0)
    charged, hour = await held(q, "a"), str(keep_until_s * 1000 // HOUR)
    assert charged == {"kept": charged["kept"], "from": hour, hour: charged["kept"]}


async def engine_death(q: Queue, tenant: str, now: int) -> str:
    job, _ = await q.enqueue(tenant, req(), now=now)
    (delivery,), _ = await q.read("w1", 1)
    assert await q.retry(delivery, delay_ms=0, error=ENGINE_DIED, dead_letter="engine_died", now=now) \
        is Outcome.DEAD_LETTERED
    return job.id


async def test_a_tenant_whose_jobs_killed_the_engine_strikes_times_in_the_window_is_refused_for_the_cool_off(
    q: Queue
) -> None:
    q.settings = q.settings.replace(engine_strikes=3, engine_strike_window_s=600, engine_cooloff_s=900)
    await engine_death(q, "a", T0)
    await engine_death(q, "a", T0 + 700_000)  # the first is out of the window by now
    await engine_death(q, "a", T0 + 800_000)
    assert (await q.enqueue("a", req(), now=T0 + 800_000))[0].id  # two within the window: not yet
    await engine_death(q, "a", T0 + 900_000)
    with pytest.raises(EngineCoolOff) as refused:
        await q.enqueue("a", req(), now=T0 + 900_001)
    assert refused.value.retry_after_s == 899.999
    assert (await q.enqueue("b", req(), now=T0 + 900_001))[0].id  # another tenant is not cooling off
    with pytest.raises(EngineCoolOff):
        await q.enqueue("a", req(), now=T0 + 1_799_999)
    assert (await q.enqueue("a", req(), now=T0 + 1_800_000))[0].id  # the cool-off is over
    assert "cool" not in await held(q, "a") and "deaths" not in await held(q, "a")


async def test_a_job_that_is_retried_after_an_engine_death_is_no_strike_against_its_tenant(q: Queue) -> None:
    q.settings = q.settings.replace(engine_strikes=1)
    await q.enqueue("a", req(), now=T0)
    (delivery,), _ = await q.read("w1", 1)
    # the engine died while it shared the server with others: a strike on the job, retried, no blame yet
    assert await q.retry(delivery, delay_ms=0, error=ENGINE_DIED, dead_letter="engine_died", strikes=2, now=T0) \
        is Outcome.RETRY_SCHEDULED
    assert (await q.enqueue("a", req(), now=T0))[0].id
    assert "cool" not in await held(q, "a")


async def test_an_engine_died_dead_letter_is_an_operators_to_redrive(q: Queue) -> None:
    poison = await engine_death(q, "a", T0)
    before = await q.redis.hgetall(q.keys.job(poison))
    with pytest.raises(OperatorOnly):
        await q.redrive("a", poison)
    assert await q.redis.hgetall(q.keys.job(poison)) == before  # nothing changed
    with pytest.raises(JobNotFound):  # an operator of its own jobs only: another tenant's is unknown
        await q.redrive("ops", poison, operator=True)
    redriven = await q.redrive("ops", poison, operator=True, any_tenant=True)  # an operator named as such
    assert redriven.status is JobStatus.QUEUED and redriven.tenant == "a"
    # a dead letter of another cause is its tenant's to redrive, as before
    q.settings = q.settings.replace(max_attempts=1)
    plain, _ = await q.enqueue("a", req(), now=T0)
    deliveries, _ = await read_all(q, "w1", 10)  # the redriven job, then (fair share) the one behind it
    [delivery] = [d for d in deliveries if d.job.id == plain.id]
    await q.retry(delivery, delay_ms=0, error={"type": "server_error", "message": "503"}, now=T0)
    assert (await q.redrive("a", plain.id)).status is JobStatus.QUEUED
