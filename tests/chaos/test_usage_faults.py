"""Usage sums equal the terminal jobs, exactly, under faults: random interleavings of every transition across three
consumers, two tenants, two models and the three lanes, with every kind of fault the metering must ride out --

- resends: any script call may run twice with the same arguments (``Resending``: the copy must answer the same and
  change nothing, usage included);
- reclaims: leases expire at once (claim-idle 0), so a reclaim steals a live delivery, whose holder may still
  finish, retry or release it (a stale write: refused, counted nowhere);
- duplicate results: a delivery whose job already ended writes another result (refused, counted nowhere);
- failovers: the replica is promoted while the old primary takes one more write that never reaches it (the write
  asynchronous replication loses), then the clients follow the endpoint to the new primary;
- cancels, expiries, retries (and dead letters), releases and redrives between them.

After every step, on whatever server is the primary now, each job record holds exactly the run and GPU time of the
attempts whose retry or release was accepted, and the usage buckets (every row: jobs by status, prompt and
completion tokens, run ms, GPU ms) equal what the job records say ended: each terminal job once
by its status, with the run and GPU time its record holds from the attempts that did not end it, plus, when a
finish ended it, that finishing attempt's (each attempt's figures derive from its lease, so the records tell them)
and, for a success, its tokens, which are also its result's ``usage``; plus what redriven jobs' earlier endings
counted. Nothing is read from what the test believes it did: a write lost in a failover is simply not there.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from emulator.valkey import ValkeyProcess, wait_in_sync
from inferq.config.settings import Settings
from inferq.queue.jobs import LANES, JobRequest, JobStatus, Priority
from inferq.queue.protocol import (
    Delivery,
    JobNotFound,
    JobTerminal,
    NotDeadLettered,
    Outcome,
    Queue,
    QueueError,
    now_ms,
)
from inferq.usage.report import parse
from inferq.usage.spend import Spend
from tests.integration.protocol.resend import Resending

from .support import Endpoint

CONSUMERS = ("c1", "c2", "c3")
TENANTS = ("t1", "t2")
MODELS = ("m1", "m2")
EXAMPLES = int(os.environ.get("INFERQ_USAGE_EXAMPLES", "40"))
Row = tuple[str, str, str]  # tenant, lane, model
SEEN: Counter[str] = Counter()
"""What the examples did, over the whole run: the test proves the faults happened."""


def spend_of(lease: str, status: JobStatus | None = None) -> Spend:
    """What the attempt of the delivery with ``lease`` spent: a function of the lease, so the job's record (which
    keeps the lease of the delivery that finished it) tells what its finish reported. Tokens with a success only."""
    h = hashlib.sha256(lease.encode()).digest()
    run = 1 + int.from_bytes(h[:2], "big") % 900
    gpu = 1 + int.from_bytes(h[2:4], "big") % run
    tokens = (int.from_bytes(h[4:6], "big") % 80, int.from_bytes(h[6:8], "big") % 300)
    return Spend(run, gpu, *tokens) if status is JobStatus.SUCCEEDED else Spend(run, gpu)


class Pair:
    """A primary and a replica behind one endpoint; :meth:`fail_over` swaps them, losing what the old primary takes
    after the replica was promoted."""

    def __init__(self, root: Path) -> None:
        self.primary = ValkeyProcess(root / "a", appendfsync=None).start()
        self.replica = ValkeyProcess(root / "b", appendfsync=None).start()
        for server in (self.primary, self.replica):  # a demoted primary resyncs at once, not after 5 s
            server.config_set("repl-diskless-sync-delay", "0")
        self.replica.replicate(self.primary)
        wait_in_sync(self.replica, self.primary)
        self.endpoint = Endpoint(self.primary)

    def close(self) -> None:
        self.endpoint.close()
        self.replica.stop()
        self.primary.stop()


class UsageMachine(RuleBasedStateMachine):
    pair: Pair  # set by the test below

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        config = Settings(redis_url=self.pair.endpoint.url, queue="uf" + uuid.uuid4().hex[:10], claim_idle_ms=0,
                          max_attempts=2, max_deliveries=3, max_queue_depth=0, redis_timeout_s=2.0,
                          engine_strikes=0)  # the cool-off (G11) would refuse a poisoning tenant: tested in test_holds
        self.q = Queue.connect(config)
        self.resend = Resending(self.q, always=False)
        self.q.scripts = self.resend
        self.run(self.q.ensure_groups())
        self.jobs: list[str] = []
        self.held: dict[str, list[Delivery]] = {c: [] for c in CONSUMERS}
        self.done: list[Delivery] = []  # deliveries that wrote, for late duplicates
        self.retired: Counter[tuple[Row, str]] = Counter()  # what redriven jobs' earlier endings counted
        self.kept: Counter[tuple[str, str]] = Counter()
        """(job, run|gpu): what the job's record must hold from the attempts retry and release accepted (since its
        last redrive): the record is checked against it, so a write that added time it should not is caught."""
        self.clock = now_ms()

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    def teardown(self) -> None:
        keys = self.run(self.q.redis.keys(self.q.keys.prefix + "*"))
        if keys:
            self.run(self.q.redis.delete(*keys))
        SEEN["resent calls"] += sum(self.resend.checked.values())
        self.run(self.q.close())
        self.loop.close()

    def _pop(self, index: int) -> Delivery | None:
        holders = [c for c in CONSUMERS if self.held[c]]
        if not holders:
            return None
        held = self.held[holders[index % len(holders)]]
        return held.pop(index % len(held))

    def holding(self) -> bool:
        return any(self.held.values())

    # ------------------------------------------------------------ rules

    @initialize()
    def some_jobs(self) -> None:
        """Every example starts with work of both tenants, both models and every lane, some of it taken."""
        for i in range(6):
            self.enqueue(TENANTS[i % 2], LANES[i % 3], MODELS[i // 3], False)
        self.read(CONSUMERS[0], 3)

    @rule(tenant=st.sampled_from(TENANTS), lane=st.sampled_from(LANES), model=st.sampled_from(MODELS),
          expired=st.booleans())
    def enqueue(self, tenant: str, lane: Priority, model: str, expired: bool) -> None:
        request = JobRequest(body={"model": model, "prompt": "x"}, priority=lane, ttl_s=1 if expired else None)
        job, _ = self.run(self.q.enqueue(tenant, request, now=now_ms() - (5000 if expired else 0)))
        self.jobs.append(job.id)

    @rule(consumer=st.sampled_from(CONSUMERS), count=st.integers(1, 3))
    def read(self, consumer: str, count: int) -> None:
        self.held[consumer].extend(self.run(self.q.read(consumer, count))[0])

    @rule(consumer=st.sampled_from(CONSUMERS), count=st.integers(1, 3))
    def reclaim(self, consumer: str, count: int) -> None:
        self.held[consumer].extend(self.run(self.q.reclaim(consumer, count))[0])

    @precondition(holding)
    @rule(index=st.integers(0, 5), status=st.sampled_from([JobStatus.SUCCEEDED, JobStatus.FAILED,
                                                           JobStatus.CANCELLED]))
    def finish(self, index: int, status: JobStatus) -> None:
        if d := self._pop(index):
            self._finish(d, status)

    def _finish(self, d: Delivery, status: JobStatus) -> None:
        spend = spend_of(d.lease, status)
        ok = status is JobStatus.SUCCEEDED
        usage = {"prompt_tokens": spend.prompt_tokens, "completion_tokens": spend.completion_tokens}
        outcome = self.run(self.q.finish(d, status, result={"status_code": 200, "body": {"usage": usage}} if ok
                                         else None, error=None if ok else {"type": "x", "message": status.value},
                                         spend=spend))
        SEEN[f"finish {outcome.value}"] += 1
        self.done.append(d)

    @precondition(holding)
    @rule(indices=st.lists(st.integers(0, 5), min_size=1, max_size=3), late=st.integers(0, 50))
    def finish_together(self, indices: list[int], late: int) -> None:
        """Several finishes in one call, as a worker coalesces them, with a late result of an earlier delivery among
        them: the call writes one row per tenant, lane and model and takes back what it does not end."""
        items: list[Any] = []
        # one write per job in a call, as a worker's coalesced finishes are (a job's record keeps one refusal memo:
        # two refused writes about one job in one call could not both be replayed)
        jobs: set[str] = set()
        for index in indices:
            if (d := self._pop(index)) and d.job.id not in jobs:
                jobs.add(d.job.id)
                usage = spend_of(d.lease, JobStatus.SUCCEEDED)
                items.append((d, JobStatus.SUCCEEDED, {"status_code": 200, "body": {"usage": {
                    "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}}}, None, usage))
        late_one = self.done[late % len(self.done)] if self.done else None
        if late_one is not None and late_one.job.id not in jobs:
            items.append((late_one, JobStatus.FAILED, None, {"type": "late", "message": "together"},
                          spend_of(late_one.lease, JobStatus.FAILED)))
        if not items:
            return
        for (d, *_), outcome in zip(items, self.run(self.q.finish_many(items)), strict=True):
            SEEN[f"finish together {outcome.value}"] += 1
            self.done.append(d)

    @precondition(lambda self: self.done)
    @rule(index=st.integers(0, 50))
    def duplicate_result(self, index: int) -> None:
        """A late result of a delivery that wrote already: another write than its own (a resend would replay). Its
        first write may have been lost in a failover: then this one is the holder's, and ends the job."""
        d = self.done[index % len(self.done)]
        outcome = self.run(self.q.finish(d, JobStatus.FAILED, error={"type": "late", "message": "again"},
                                         spend=spend_of(d.lease, JobStatus.FAILED)))
        SEEN[f"late result {outcome.value}"] += 1

    @precondition(holding)
    @rule(index=st.integers(0, 5), delay=st.sampled_from([0, 0, 5_000]), poison=st.booleans())
    def retry(self, index: int, delay: int, poison: bool) -> None:
        """A retryable failure, or the model server dying under the job (poison: dead-lettered at once)."""
        if d := self._pop(index):
            outcome = self.run(self.q.retry(d, delay_ms=delay, error={"type": "timeout", "message": "t"},
                                            now=self.clock, spend=spend_of(d.lease),
                                            dead_letter="engine_died" if poison else None))
            SEEN[f"retry {outcome.value}"] += 1
            if outcome in (Outcome.RETRY_SCHEDULED, Outcome.DEAD_LETTERED, Outcome.ENDED):
                self._kept(d)
            self.done.append(d)

    @precondition(holding)
    @rule(index=st.integers(0, 5))
    def release(self, index: int) -> None:
        if d := self._pop(index):
            outcome = self.run(self.q.release(d, spend=spend_of(d.lease)))
            SEEN[f"release {outcome.value}"] += 1
            if outcome is Outcome.RELEASED:
                self._kept(d)

    def _kept(self, d: Delivery) -> None:
        spend = spend_of(d.lease)
        self.kept.update({(d.job.id, "run"): spend.run_ms, (d.job.id, "gpu"): spend.gpu_ms})

    @rule(consumer=st.sampled_from(CONSUMERS))
    def crash(self, consumer: str) -> None:
        self.held[consumer].clear()

    @precondition(lambda self: self.jobs)
    @rule(index=st.integers(0, 50), tenant=st.sampled_from(TENANTS))
    def cancel(self, index: int, tenant: str) -> None:
        try:
            self.run(self.q.cancel(tenant, self.jobs[index % len(self.jobs)]))
        except (JobNotFound, JobTerminal):
            pass

    @rule()
    def expire(self) -> None:
        self.run(self.q.expire_due())

    @precondition(lambda self: self.jobs)
    @rule(index=st.integers(0, 50))
    def redrive(self, index: int) -> None:
        job_id = self.jobs[index % len(self.jobs)]
        record = self.run(self.q.redis.hgetall(self.q.keys.job(job_id)))
        if record.get("dead_lettered") != "1":
            return
        counted = contribution(record)
        try:
            self.run(self.q.redrive(record["tenant"], job_id))
        except (NotDeadLettered, QueueError):
            return
        self.retired.update(counted)
        self.kept.pop((job_id, "run"), None)
        self.kept.pop((job_id, "gpu"), None)
        SEEN["redriven"] += 1

    @rule(calls=st.integers(1, 3))
    def resend_the_next_calls(self, calls: int) -> None:
        self.resend.arm(calls)

    @rule()
    def promote_due_retries(self) -> None:
        self.clock += 10_000
        self.run(self.q.promote(now=self.clock))

    @precondition(holding)
    @rule(index=st.integers(0, 5), status=st.sampled_from([JobStatus.SUCCEEDED, JobStatus.FAILED]))
    def fail_over(self, index: int, status: JobStatus) -> None:
        """The replica, in sync, is promoted; the old primary takes one more finish (its clients do not know yet),
        which the new primary never gets; the endpoint moves, the old primary becomes a replica of the new."""
        pair = self.pair
        wait_in_sync(pair.replica, pair.primary)
        pair.replica.promote()
        SEEN["failovers"] += 1
        if d := self._pop(index):
            self._finish(d, status)  # written on the old primary only: lost
            SEEN["lost writes"] += 1
        pair.endpoint.switch(pair.replica)
        pair.primary.replicate(pair.replica)
        pair.primary, pair.replica = pair.replica, pair.primary
        self.run(self.q.redis.connection_pool.disconnect())  # every client reconnects, to the new primary
        wait_in_sync(pair.replica, pair.primary)

    # ------------------------------------------------------------ the invariant

    @invariant()
    def usage_equals_the_terminal_jobs(self) -> None:
        records = self.run(self._records())
        expected: Counter[tuple[Row, str]] = Counter(self.retired)
        results: Counter[tuple[str, str]] = Counter()
        for record in records:
            kept = (int(record.get("run_ms") or 0), int(record.get("gpu_ms") or 0))
            assert kept == (self.kept[(record["id"], "run")], self.kept[(record["id"], "gpu")]), record["id"]
            expected.update(contribution(record))
            if record.get("status") == "succeeded":
                usage = json.loads(record["result"])["body"]["usage"]
                results[(record["tenant"], "prompt")] += usage["prompt_tokens"]
                results[(record["tenant"], "completion")] += usage["completion_tokens"]
        counted = self.run(self._usage())
        ended = sum(n for (_, what), n in counted.items() if what in ("succeeded", "failed", "cancelled", "expired"))
        SEEN["jobs counted"] = max(SEEN["jobs counted"], ended)
        assert counted == +expected, f"usage {dict(counted)} != the terminal jobs {dict(+expected)}"
        # the tokens counted are the results' usage, tenant by tenant
        for tenant in TENANTS:
            prompt = sum(n for (row, what), n in counted.items() if row[0] == tenant and what == "prompt")
            completion = sum(n for (row, what), n in counted.items() if row[0] == tenant and what == "completion")
            retired_prompt = sum(n for (row, what), n in self.retired.items() if row[0] == tenant and what == "prompt")
            retired_completion = sum(n for (row, what), n in self.retired.items()
                                     if row[0] == tenant and what == "completion")
            assert prompt - retired_prompt == results[(tenant, "prompt")]
            assert completion - retired_completion == results[(tenant, "completion")]

    async def _records(self) -> list[dict[str, str]]:
        pipe = self.q.redis.pipeline(transaction=False)
        for job_id in self.jobs:
            pipe.hgetall(self.q.keys.job(job_id))
        return [r for r in await pipe.execute() if r]

    async def _usage(self) -> Counter[tuple[Row, str]]:
        out: Counter[tuple[Row, str]] = Counter()
        names = ("succeeded", "failed", "cancelled", "expired", "prompt", "completion", "run", "gpu")
        for key in await self.q.redis.keys(self.q.keys.prefix + "usage:*"):
            if key.startswith(self.q.keys.prefix + "usage:month:") or key == self.q.keys.usage_exported:
                continue
            for name, value in (await self.q.redis.hgetall(key)).items():
                parsed = parse(name, value)
                if parsed is not None:
                    tenant, lane, model, numbers = parsed
                    out.update({((tenant, lane, model), what): n for what, n in zip(names, numbers, strict=True)})
        return +out


def contribution(record: dict[str, str]) -> Counter[tuple[Row, str]]:
    """What a job's ending counts, read from its record alone (empty while it has not ended)."""
    status = record.get("status", "")
    if status not in ("succeeded", "failed", "cancelled", "expired"):
        return Counter()
    row = (record["tenant"], record.get("lane") or "normal", record.get("model", ""))
    out: Counter[tuple[Row, str]] = Counter({(row, status): 1})
    run, gpu = int(record.get("run_ms") or 0), int(record.get("gpu_ms") or 0)
    if (record.get("settled") or "").endswith("|0"):  # a finish ended it: its attempt's figures too
        spend = spend_of(record["lease"], JobStatus(status))
        run, gpu = run + spend.run_ms, gpu + spend.gpu_ms
        out[(row, "prompt")] += spend.prompt_tokens
        out[(row, "completion")] += spend.completion_tokens
    out[(row, "run")] += run
    out[(row, "gpu")] += gpu
    return +out


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    opened = Pair(tmp_path_factory.mktemp("usage-faults"))
    yield opened
    opened.close()


@pytest.mark.timeout(900)
def test_usage_sums_equal_the_terminal_jobs_exactly_under_resends_failovers_reclaims_and_duplicates(
    pair: Pair,
) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    UsageMachine.pair = pair
    SEEN.clear()
    run_state_machine_as_test(UsageMachine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=50, deadline=None, suppress_health_check=list(HealthCheck),
        derandomize=True))
    # the faults happened: resent script calls, failovers that lost a write, reclaims that made stale writes, late
    # results of ended jobs, dead letters and releases (the examples are derandomized: the same ones every run)
    kinds = Counter({what.rsplit(" ", 1)[-1]: n for what, n in SEEN.items()})
    for what in ("resent calls", "failovers", "lost writes"):
        assert SEEN[what] > 0, f"no {what} in {EXAMPLES} examples: {dict(SEEN)}"
    for outcome in ("stale", "duplicate", "dead_lettered", "released", "retry_scheduled"):
        assert kinds[outcome] > 0, f"no write answered {outcome} in {EXAMPLES} examples: {dict(SEEN)}"
    assert SEEN["jobs counted"] >= 5, dict(SEEN)

