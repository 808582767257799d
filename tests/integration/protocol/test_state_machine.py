"""Random interleavings of every transition across several simulated consumers and the three priority lanes,
against a real Valkey.

After every step: each job has exactly one status; ``unfinished`` equals the number of non-terminal jobs, and the
per-tenant counts agree; a non-terminal job has exactly one live place (stream entry, pending or not, its lane's jobs
waiting for admission -- fair share, G10 -- or the delayed set) and a terminal one none, so the streams are empty
when every job is terminal; every entry of a job is in its own lane's stream, and a delivery comes from its job's
lane; a terminal status never changes; and a terminal job is never handed to the model again. Reads are sometimes
blocking ones across the lanes, which give back what they take beyond their count.
Leases expire at once here (claim-idle 0), so every reclaim steals from a live consumer: the hardest case. The
consumer that lost an entry keeps its delivery and may still finish, retry or release it (a stale holder, G9):
each such write must be refused and change nothing. Any script call may be resent (run twice with the same
arguments, G9): the copy must answer the same and change nothing.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.jobs import LANES, JobRequest, JobStatus, Priority
from inferq.queue.keys import GROUP
from inferq.queue.protocol import (
    Delivery,
    IdempotencyConflict,
    JobNotFound,
    JobTerminal,
    Outcome,
    Queue,
    QueueFull,
    now_ms,
)
from tests.integration.protocol.resend import Resending, difference, snapshot, without_refusals

CONSUMERS = ("c1", "c2", "c3")
EXAMPLES = int(os.environ.get("INFERQ_STATEFUL_EXAMPLES", "1000"))


class QueueMachine(RuleBasedStateMachine):
    server: ValkeyProcess  # set by the test below

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        config = Settings(redis_url=self.server.url, queue="sm" + uuid.uuid4().hex[:10], claim_idle_ms=0,
                          max_attempts=2, max_deliveries=3, max_queue_depth=12, tenant_max_depth=8,
                          tenant_weights={"t1": 1.0, "t2": 2.5})
        self.q = Queue.connect(config)
        self.resend = Resending(self.q, always=False)
        self.q.scripts = self.resend
        self.run(self.q.ensure_groups())
        self.jobs: list[str] = []
        self.held: dict[str, list[Delivery]] = {c: [] for c in CONSUMERS}
        self.final: dict[str, str] = {}  # job -> terminal status once seen
        self.clock = now_ms()

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    def teardown(self) -> None:
        self.run(self.q.redis.delete(*(self.q.keys.job(j) for j in self.jobs), *self.q.keys.lane_streams,
                                     self.q.keys.delayed, self.q.keys.stats, self.q.keys.dlq, self.q.keys.events,
                                     self.q.keys.tenants))
        self.run(self.q.close())
        self.loop.close()

    def _take(self, consumer: str, deliveries: list[Delivery]) -> None:
        for d in deliveries:
            assert d.job.id not in self.final, f"terminal job {d.job.id} handed to the model again"
            assert d.lane is d.job.priority, f"{d.job.id} of lane {d.job.priority} delivered from {d.lane}"
        self.held[consumer].extend(deliveries)

    def _pop(self, index: int) -> Delivery | None:
        """Any held delivery, whichever consumer holds it (several may hold one entry after a reclaim)."""
        holders = [c for c in CONSUMERS if self.held[c]]
        if not holders:
            return None
        held = self.held[holders[index % len(holders)]]
        return held.pop(index % len(held))

    def holding(self) -> bool:
        return any(self.held.values())

    def _settle(self, d: Delivery, write: Any, written: tuple[Outcome, ...]) -> None:
        """Run a finish, retry or release of ``d``. If ``d`` no longer holds its job (the entry was reclaimed,
        or the job moved on), the write must be refused and change nothing but the stale-write count."""
        status, entry, lease = self.run(self.q.redis.hmget(self.q.keys.job(d.job.id), "status", "entry", "lease"))
        terminal = JobStatus(status).terminal
        stale = not terminal and (entry != d.entry_id or lease != d.lease)
        before = self.run(snapshot(self.q)) if stale else None
        outcome = self.run(write)
        if terminal:
            assert outcome is Outcome.DUPLICATE, f"a write to a terminal job answered {outcome}"
        elif stale:
            assert outcome is Outcome.STALE, f"a stale holder's write answered {outcome}"
            after = self.run(snapshot(self.q))
            assert without_refusals(after, self.q) == without_refusals(before, self.q), difference(before, after)
        else:
            assert outcome in written, f"the holder's write answered {outcome}"

    # ------------------------------------------------------------ rules

    @rule(idem=st.sampled_from([None, "a", "b"]), tenant=st.sampled_from(["t1", "t2"]), lane=st.sampled_from(LANES),
          work=st.sampled_from([1, 100, 4000]))
    def enqueue(self, idem: str | None, tenant: str, lane: Priority, work: int) -> None:
        request = JobRequest(body={"p": 1, "max_tokens": work}, idempotency_key=idem, priority=lane)
        try:
            job, replayed = self.run(self.q.enqueue(tenant, request))
        except (QueueFull, IdempotencyConflict):  # the same key with another lane is another request
            return
        if not replayed:
            self.jobs.append(job.id)

    @rule(consumer=st.sampled_from(CONSUMERS), count=st.integers(1, 3))
    def read(self, consumer: str, count: int) -> None:
        self._take(consumer, self.run(self.q.read(consumer, count))[0])

    def waiting(self) -> bool:
        """Some lane has entries never delivered: a blocking read answers at once (on empty lanes it would wait
        out the server's timer resolution, about 100 ms, for nothing)."""
        return any(self.run(self._lag(stream)) for stream in self.q.keys.lane_streams)

    async def _lag(self, stream: str) -> int:
        return int(await self.q.redis.xlen(stream)) - int((await self.q.redis.xpending(stream, GROUP))["pending"])

    @precondition(waiting)
    @rule(consumer=st.sampled_from(CONSUMERS), count=st.integers(1, 2))
    def read_blocking(self, consumer: str, count: int) -> None:
        got = self.run(self.q.read_blocking(consumer, count, 1))[0]
        assert len(got) <= count, f"a blocking read started {len(got)} of {count}"
        self._take(consumer, got)

    @rule(consumer=st.sampled_from(CONSUMERS), count=st.integers(1, 3))
    def reclaim(self, consumer: str, count: int) -> None:
        self._take(consumer, self.run(self.q.reclaim(consumer, count))[0])

    @precondition(holding)
    @rule(index=st.integers(0, 5), status=st.sampled_from([JobStatus.SUCCEEDED, JobStatus.FAILED]))
    def finish(self, index: int, status: JobStatus) -> None:
        if d := self._pop(index):
            ok = status is JobStatus.SUCCEEDED
            write = self.q.finish(d, status, result={"ok": True} if ok else None,
                                  error=None if ok else {"type": "x", "message": "y"})
            self._settle(d, write, (Outcome.WRITTEN,))

    @precondition(holding)
    @rule(index=st.integers(0, 5), delay=st.sampled_from([0, 0, 5_000]))
    def fail_and_retry(self, index: int, delay: int) -> None:
        if d := self._pop(index):
            self._settle(d, self.q.retry(d, delay_ms=delay, error={"type": "timeout", "message": "t"}, now=self.clock),
                         (Outcome.RETRY_SCHEDULED, Outcome.DEAD_LETTERED, Outcome.ENDED))

    @precondition(holding)
    @rule(index=st.integers(0, 5))
    def release(self, index: int) -> None:
        if d := self._pop(index):
            self._settle(d, self.q.release(d), (Outcome.RELEASED,))

    @rule(consumer=st.sampled_from(CONSUMERS))
    def crash(self, consumer: str) -> None:
        self.held[consumer].clear()  # its entries stay pending until someone reclaims them

    @rule(consumer=st.sampled_from(CONSUMERS))
    def renew(self, consumer: str) -> None:
        self.run(self.q.renew(consumer, self.held[consumer]))

    @precondition(lambda self: self.jobs)
    @rule(index=st.integers(0, 50), tenant=st.sampled_from(["t1", "t2"]))
    def cancel(self, index: int, tenant: str) -> None:
        try:
            self.run(self.q.cancel(tenant, self.jobs[index % len(self.jobs)]))
        except (JobNotFound, JobTerminal):
            pass

    @rule(calls=st.integers(1, 3))
    def resend_the_next_calls(self, calls: int) -> None:
        """The next script calls are each run twice with the same arguments (a timeout, a failover, redis-py's
        retry); Resending checks that each copy answers the same and changes nothing."""
        self.resend.arm(calls)

    @rule()
    def promote(self) -> None:
        self.clock += 10_000
        self.run(self.q.promote(now=self.clock))

    # ------------------------------------------------------------ invariants

    @invariant()
    def every_job_has_one_status_one_place_and_counters_agree(self) -> None:
        if not self.jobs:
            return
        records = self.run(self._records())
        lanes = {lane: Counter(f["job"] for _, f in self.run(self.q.redis.xrange(self.q.keys.stream_of(lane))))
                 for lane in LANES}
        entries = sum(lanes.values(), Counter())
        delayed = set(self.run(self.q.redis.zrange(self.q.keys.delayed, 0, -1)))
        members = {lane: set(self.run(self.q.redis.zrange(self.q.keys.fair_jobs(lane), 0, -1))) for lane in LANES}
        waiting = {lane: Counter(m.split("|", 2)[2] for m in members[lane]) for lane in LANES}
        open_jobs = 0
        for job_id, record in zip(self.jobs, records, strict=True):
            status = JobStatus(record["status"])
            lane = Priority(record["lane"])
            held = sum(waiting[other][job_id] for other in LANES)
            places = entries[job_id] + (job_id in delayed) + held
            assert entries[job_id] == lanes[lane][job_id], f"{job_id} of lane {lane} has entries in another lane"
            assert held == waiting[lane][job_id], f"{job_id} of lane {lane} waits for admission in another lane"
            if status.terminal:
                assert places == 0, f"terminal {job_id} still has {places} live places"
                previous = self.final.setdefault(job_id, status.value)
                assert previous == status.value, f"{job_id} went from {previous} to {status.value}"
            else:
                open_jobs += 1
                assert places == 1, f"{status.value} {job_id} has {places} live places"
                entry = record.get("entry") or ""
                if entry.startswith("w:"):  # waiting for admission, or admitted and not started (G10)
                    assert held or entries[job_id] == 1, f"{job_id} says it waits but is nowhere"
                    assert not held or entry[2:] in members[lane], f"{job_id} waits under another member"
                elif entry:
                    assert entries[job_id] == 1 and job_id not in delayed and not held
        unfinished = int(self.run(self.q.redis.hget(self.q.keys.stats, "unfinished")) or 0)
        assert unfinished == open_jobs
        per_tenant = Counter(r["tenant"] for r in records if not JobStatus(r["status"]).terminal)
        assert self.run(self.q.redis.hgetall(self.q.keys.tenants)) == {t: str(n) for t, n in per_tenant.items()}
        if open_jobs == 0:
            for stream in self.q.keys.lane_streams:
                assert self.run(self.q.redis.xlen(stream)) == 0

    @invariant()
    def waiting_jobs_are_the_records_that_say_so_each_at_or_after_its_lanes_virtual_time(self) -> None:
        """Fair share (G10): a member of a lane's waiting set is a queued job of that lane whose field entry names
        that member, at its current attempt; no waiting job starts before the lane's virtual time (admission takes
        the lowest start tag first)."""
        for lane in LANES:
            waiting = self.run(self.q.redis.zrange(self.q.keys.fair_jobs(lane), 0, -1, withscores=True))
            clock = float(self.run(self.q.redis.hget(self.q.keys.fair_tags(lane), ":clock")) or 0)
            for member, score in waiting:
                tenant, attempt, job_id = member.split("|", 2)
                record = self.run(self.q.redis.hgetall(self.q.keys.job(job_id)))
                assert record["status"] == "queued" and record["entry"] == f"w:{member}", (member, record)
                assert (record["tenant"], record["attempts"], record["lane"]) == (tenant, attempt, lane.value)
                assert -score >= clock, f"{member} starts at {-score}, before the lane's virtual time {clock}"

    async def _records(self) -> list[dict[str, str]]:
        pipe = self.q.redis.pipeline(transaction=False)
        for job_id in self.jobs:
            pipe.hgetall(self.q.keys.job(job_id))
        return list(await pipe.execute())


def test_random_interleavings_keep_every_invariant(valkey: ValkeyProcess) -> None:
    QueueMachine.server = valkey
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(QueueMachine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)))
