"""The consumer side of the queue, what a worker runs: read and reclaim entries, start them under a lease, then
finish, retry or release each delivery, renew the leases, and sweep what is due (retries to promote, jobs to
expire). A duplicate or stale completion is a normal event to count, so these return an :class:`Outcome`.

Each queue has three lanes (``high``, ``normal``, ``low``), each its own stream; a job's entries are always in its
lane's, so each write about a delivery goes to the stream its entry came from. Reads take the lanes in priority
order with a starvation bound (:mod:`inferq.queue.lanes`); reclaim, renewal and a stopped worker's clean-up cover all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from redis.exceptions import ResponseError

from inferq import fastjson
from inferq.config.settings import Settings
from inferq.queue.core import QueueCore, chunks, new_token, now_ms
from inferq.queue.jobs import LANES, Job, JobStatus, Priority
from inferq.queue.keys import GROUP
from inferq.redis.scripting import Code, reply_code
from inferq.usage.spend import NONE, Spend, UsageRows


class Outcome(str, Enum):
    """What a worker's transition did."""

    WRITTEN = "written"  # finish: terminal state recorded
    RETRY_SCHEDULED = "retry_scheduled"
    DEAD_LETTERED = "dead_lettered"
    RELEASED = "released"
    DUPLICATE = "duplicate"  # the job was already terminal: discarded and counted
    STALE = "stale"  # the entry was no longer the job's live entry
    NOT_FOUND = "not_found"
    ENDED = "ended"  # the job ended some other way here (e.g. cancellation requested)


class Lease(int, Enum):
    """Per-entry answer of a lease renewal."""

    HELD = 0
    CANCEL_REQUESTED = 1
    LOST = 2
    TERMINAL = 3
    WATCHED = 4  # held, and someone reads the job's output as it is made: write it (gpu_worker/output.py)


@dataclass(frozen=True)
class Delivery:
    """A job handed to this worker: run it, then finish, retry or release it by its entry and lease token.
    The lease token is this delivery's own (start.lua records it on the job): once the entry is reclaimed or
    started again, the token no longer matches and this delivery's writes change nothing."""

    entry_id: str
    job: Job
    reclaimed: bool = False
    lease: str = ""
    lane: Priority = Priority.NORMAL
    spent: tuple[str, int, int] = ("", 0, 0)
    """What the job's usage is counted under and what its earlier attempts spent, as its record said when this
    delivery began: (model, run ms, GPU ms; fields ``model``, ``run_ms``, ``gpu_ms``). Only this delivery's own
    retry or release changes them until it ends."""

    @property
    def attempt(self) -> int:
        return self.job.attempts

    @property
    def key(self) -> str:
        """The entry's identity across lanes: entry ids are per stream, so two lanes can hand out the same one."""
        return f"{self.lane.value}:{self.entry_id}"


@dataclass(frozen=True)
class Skipped:
    """An entry that start.lua settled without running the model (terminal, stale, expired, dead-lettered)."""

    entry_id: str
    job_id: str
    code: Code
    status: str | None = None


def settle_token(delivery: Delivery, *what: str) -> str:
    """The call token of a finish, retry or release: derived from the delivery's lease and what is written, so the
    worker's own retry of the same write after an error it saw (a timeout, ReplicationLag) is recognised as a
    resend too and answers as the first did; another write by the same delivery is a different call."""
    if not delivery.lease:
        return new_token()
    return hashlib.sha256("\0".join((delivery.lease, *what)).encode()).hexdigest()[:16]


Entry = tuple[Priority, str, dict[str, str]]
"""A stream entry read from a lane: (lane, entry id, fields)."""

Finish = tuple[Delivery, JobStatus, Any, Any] | tuple[Delivery, JobStatus, Any, Any, Spend | None]
"""One finish: the delivery, its terminal status, result, error and (optionally) what the attempt spent."""


class Consumer(QueueCore):
    def __init__(self, client: Any, settings: Settings) -> None:
        super().__init__(client, settings)
        self._drained: set[str] = set()
        """The consumers whose last read found every lane drained (see :meth:`read`)."""

    def _start_call(self, consumer: str, now: int, reclaimed: bool, live: Sequence[tuple[Priority, str, str, str]]
                    ) -> tuple:
        """The start script call that begins ``live`` (lane, entry id, job id, lease; :data:`SCRIPT_BATCH` at
        most)."""
        keys_of, settings = self.keys, self.settings
        usage_keys, usage_args = self.meter(now)
        keys = [keys_of.stats, keys_of.events, keys_of.dlq, keys_of.expiry, keys_of.tenants, keys_of.dlq_index,
                *usage_keys, keys_of.bounds]
        args: list[Any] = [consumer, now, settings.max_deliveries, settings.result_ttl_s, settings.events_maxlen,
                           "1" if reclaimed else "0", *usage_args]
        for lane, entry_id, job_id, lease in live:
            keys += [keys_of.stream_of(lane), keys_of.job(job_id), keys_of.done(job_id)]
            args += [entry_id, lease]
        return ("start", keys, args)

    async def _start_entries(
        self, consumer: str, entries: Sequence[Entry], reclaimed: bool
    ) -> tuple[list[Delivery], list[Skipped]]:
        if not entries:
            return [], []
        now = now_ms()
        live = [(lane, entry_id, fields.get("job", ""), new_token()) for lane, entry_id, fields in entries if fields]
        parts = chunks(live)
        # each call is followed by the reads of its jobs' records in the same round trip (start.lua answers 0)
        reads: list[Sequence[tuple[Any, ...]]] = [[("HGETALL", self.keys.job(j)) for _, _, j, _ in part]
                                                  for part in parts]
        calls = [self._start_call(consumer, now, reclaimed, part) for part in parts]
        answered = [(reply, record) for replies, records in await self.scripts.many_then(calls, reads)
                    for reply, record in zip(replies, records, strict=True)]
        deliveries: list[Delivery] = []
        skipped: list[Skipped] = []
        for (lane, entry_id, job_id, lease), (reply, record) in zip(live, answered, strict=True):
            code = reply_code(reply)
            if code == 0 and record:
                spent = (record.get("model", ""), int(record.get("run_ms") or 0), int(record.get("gpu_ms") or 0))
                deliveries.append(Delivery(entry_id, Job.from_hash(record), reclaimed, lease, lane, spent))
            elif code == 0:
                # started, then gone before its read (nothing deletes a running job's record): the entry stays
                # pending under this lease, and its next delivery finds no job and acknowledges it
                skipped.append(Skipped(entry_id, job_id, Code.NOT_FOUND))
            else:
                skipped.append(Skipped(entry_id, job_id, Code(code), reply[1] if len(reply) > 1 else None))
        return deliveries, skipped

    async def read(
        self, consumer: str, count: int, block_ms: int | None = None
    ) -> tuple[list[Delivery], list[Skipped]]:
        """Take up to ``count`` new entries for ``consumer`` and start them: lane by lane, higher lanes first with
        the starvation bound of :attr:`lane_share`, without blocking; only when every lane is empty and
        ``block_ms`` is given, :meth:`read_blocking`.

        When this consumer's last read found every lane drained, the blocking read comes first: it answers at once
        whatever came meanwhile, one round trip where the lane-by-lane reads take up to three before it. A worker
        that keeps the queue empty, as under a steady load, reads this way; the entries of several lanes it may find
        are the few that came since its last read."""
        if count <= 0:
            return [], []
        if block_ms is not None and consumer in self._drained:
            return await self.read_blocking(consumer, count, block_ms)
        entries = await self._take(consumer, count)
        if not entries and block_ms is not None:
            return await self.read_blocking(consumer, count, block_ms)
        return await self._start_entries(consumer, entries, reclaimed=False)

    async def read_blocking(self, consumer: str, count: int, block_ms: int) -> tuple[list[Delivery], list[Skipped]]:
        """One read that blocks across every lane for up to ``block_ms`` (below the client's socket timeout) and
        starts at most ``count`` entries, higher lanes first: COUNT applies per stream, so what it answers beyond
        ``count`` is given back unstarted to the end of its lane (``requeue``), spending no attempt."""
        entries = await self.read_lanes(consumer, count, block_ms)
        per_lane = [sum(1 for e in entries if e[0] is lane) for lane in LANES]
        self._note_drained(consumer, len(entries) <= count and max(per_lane) < count)
        if len(entries) > count:
            await self._give_back(entries[count:])
            entries = entries[:count]
        self.lane_share.record({lane: sum(1 for e in entries if e[0] is lane) for lane in LANES}, set())
        return await self._start_entries(consumer, entries, reclaimed=False)

    async def _take(self, consumer: str, count: int) -> list[Entry]:
        """Non-blocking reads, lane by lane, as :meth:`LaneShare.plan` orders them, until ``count`` are taken."""
        entries: list[Entry] = []
        taken = dict.fromkeys(LANES, 0)
        short: set[Priority] = set()
        for lane, wanted in self.lane_share.plan(count):
            free = count - len(entries)
            if free <= 0:
                break
            if wanted is None and lane in short:
                continue  # found empty by its owed read a moment ago
            ask = free if wanted is None else min(wanted, free)
            got = await self.read_group(self.keys.stream_of(lane), GROUP, consumer, ask)
            if len(got) < ask:
                short.add(lane)
            taken[lane] += len(got)
            entries += [(lane, entry_id, fields) for entry_id, fields in got]
        self.lane_share.record(taken, short)
        self._note_drained(consumer, short == set(LANES))
        return entries

    def _note_drained(self, consumer: str, drained: bool) -> None:
        if drained:
            self._drained.add(consumer)
        else:
            self._drained.discard(consumer)

    async def _give_back(self, entries: Sequence[Entry]) -> None:
        """Return entries read but never started to the end of their lane (``requeue``), spending nothing."""
        calls = [("requeue", [self.keys.stream_of(lane), self.keys.job(fields.get("job", ""))],
                  [entry_id, new_token()])
                 for lane, entry_id, fields in entries if fields]
        await self.scripts.many(calls)

    async def reclaim(self, consumer: str, count: int) -> tuple[list[Delivery], list[Skipped]]:
        """Take over up to ``count`` entries idle longer than ``INFERQ_CLAIM_IDLE_MS`` (their worker died or hung),
        higher lanes first."""
        entries: list[Entry] = []
        for lane in LANES:
            if len(entries) >= count:
                break
            try:
                reply = await self.redis.xautoclaim(
                    self.keys.stream_of(lane), GROUP, consumer, self.settings.claim_idle_ms,
                    self._reclaim_cursors[lane], count=count - len(entries),
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                await self.ensure_groups()
                continue
            self._reclaim_cursors[lane] = reply[0]
            entries += [(lane, entry_id, fields) for entry_id, fields in reply[1]]
        return await self._start_entries(consumer, entries, reclaimed=True)

    def _outcome(self, reply: Any, written: Outcome) -> Outcome:
        code = reply_code(reply)
        if code >= 0:
            return written
        return {
            Code.NOT_FOUND: Outcome.NOT_FOUND,
            Code.TERMINAL: Outcome.DUPLICATE,
            Code.STALE: Outcome.STALE,
            Code.STALE_OWNER: Outcome.STALE,
            Code.ENDED: Outcome.ENDED,
        }[Code(code)]

    def _spent(self, delivery: Delivery, spend: Spend | None) -> list[Any]:
        """The run and GPU ms of all the job's attempts, as retry and release record them; "" (unchanged) when
        this attempt spent nothing or metering is off."""
        if spend is None or self.settings.usage_retention_days <= 0 or not (spend.run_ms or spend.gpu_ms):
            return ["", ""]
        _, run_ms, gpu_ms = delivery.spent
        return [run_ms + spend.run_ms, gpu_ms + spend.gpu_ms]

    def _finish_call(self, items: Sequence[Finish], now: int) -> tuple:
        """The finish script call that writes ``items`` (:data:`SCRIPT_BATCH` at most)."""
        keys_of = self.keys
        usage_keys, usage_args = self.meter(now)
        keys = [keys_of.stats, keys_of.events, keys_of.tenants, *usage_keys, keys_of.bounds]
        rows = UsageRows(self.settings.usage_retention_days > 0)
        jobs: list[Any] = []
        for delivery, status, result, error, *spend in items:
            job_id = delivery.job.id
            result_json = fastjson.dumps(result).decode() if result is not None else ""
            error_json = fastjson.dumps(error).decode() if error is not None else ""
            keys += [keys_of.stream_of(delivery.lane), keys_of.job(job_id), keys_of.done(job_id)]
            jobs += [delivery.entry_id, status.value, result_json, error_json, delivery.lease,
                     settle_token(delivery, "finish", status.value, result_json, error_json),
                     *rows.add(delivery, status, (spend[0] if spend else None) or NONE)]
        args: list[Any] = [now, self.settings.result_ttl_s, self.settings.events_maxlen, *usage_args, *rows.args(),
                           *jobs]
        return ("finish", keys, args)

    async def finish(
        self, delivery: Delivery, status: JobStatus, *, result: Any = None, error: Any = None, now: int | None = None,
        spend: Spend | None = None,
    ) -> Outcome:
        """Write the terminal state once (first writer wins) and acknowledge the entry. A delivery this worker no
        longer holds changes nothing (Outcome.STALE). ``spend``: what this attempt spent (run and GPU time, tokens),
        counted in the tenant's usage with what its earlier attempts spent."""
        if status not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
            raise ValueError(f"a worker cannot finish a job as {status.value}")
        item: Finish = (delivery, status, result, error, spend or NONE)
        [[reply]] = await self._write([self._finish_call([item], now or now_ms())], replicated=True)
        return self._outcome(reply, Outcome.WRITTEN)

    async def finish_many(self, items: Sequence[Finish]) -> list[Outcome]:
        """Several finishes in one round trip and one script call per :data:`SCRIPT_BATCH` of them: each job is
        settled as by a call of its own, and the counters they share are written once per call."""
        if not items:
            return []
        now = now_ms()
        replies = await self._write([self._finish_call(part, now) for part in chunks(items)], replicated=True)
        return [self._outcome(reply, Outcome.WRITTEN) for call in replies for reply in call]

    async def retry(self, delivery: Delivery, *, delay_ms: int, error: Any, now: int | None = None,
                    dead_letter: str | None = None, strikes: int = 1, spend: Spend | None = None) -> Outcome:
        """Acknowledge this attempt and queue the next (or dead-letter past max attempts), atomically. With
        ``dead_letter`` (a reason, e.g. ``engine_died``) the attempt counts a strike on the job (field
        ``strikes``): at ``strikes`` of them the job is dead-lettered now whatever its attempts, a poison job
        never handed to another worker. ``spend``: this attempt's run and GPU time, added to the job's."""
        job_id = delivery.job.id
        now = now or now_ms()
        usage_keys, usage_args = self.meter(now)
        keys = [self.keys.stream_of(delivery.lane), self.keys.stats, self.keys.events, self.keys.delayed,
                self.keys.dlq, self.keys.tenants, self.keys.job(job_id), self.keys.done(job_id), self.keys.dlq_index,
                *usage_keys, self.keys.bounds]
        error_json = fastjson.dumps(error).decode()
        args = [delivery.entry_id, now, max(0, int(delay_ms)), self.settings.max_attempts,
                error_json, self.settings.result_ttl_s, self.settings.events_maxlen, delivery.lease,
                settle_token(delivery, "retry", error_json, dead_letter or "", str(strikes)), dead_letter or "",
                strikes, *self._spent(delivery, spend), *usage_args, self.settings.engine_strikes,
                self.settings.engine_strike_window_s * 1000, self.settings.engine_cooloff_s * 1000]
        # a retry may end the job (dead-lettered, or cancelled): with replicas to wait for, it waits like finish
        [reply] = await self._write([("retry", keys, args)], replicated=True)
        if reply_code(reply) == 2:
            return Outcome.DEAD_LETTERED
        return self._outcome(reply, Outcome.RETRY_SCHEDULED)

    async def release(self, delivery: Delivery, *, spend: Spend | None = None) -> Outcome:
        """Give the job back at once without spending an attempt (shutdown). ``spend``: the run and GPU time the
        attempt had, added to the job's."""
        keys = [self.keys.stream_of(delivery.lane), self.keys.stats, self.keys.job(delivery.job.id)]
        args = [delivery.entry_id, delivery.lease, settle_token(delivery, "release"), *self._spent(delivery, spend)]
        reply = await self.scripts("release", keys, args)
        return self._outcome(reply, Outcome.RELEASED)

    async def renew(self, consumer: str, deliveries: Sequence[Delivery]) -> list[Lease]:
        """Renew this worker's leases; learn which jobs were cancelled or lost. One call per lane, in one round
        trip; the answers come back in the order of ``deliveries``."""
        if not deliveries:
            return []
        by_lane: dict[Priority, list[int]] = {}
        for i, d in enumerate(deliveries):
            by_lane.setdefault(d.lane, []).append(i)
        calls = []
        for lane, indices in by_lane.items():
            held = [deliveries[i] for i in indices]
            keys = [self.keys.stream_of(lane), *(self.keys.job(d.job.id) for d in held)]
            calls.append(("renew", keys, [consumer, *(d.entry_id for d in held), *(d.lease for d in held)]))
        leases = [Lease.LOST] * len(deliveries)
        for indices, codes in zip(by_lane.values(), await self.scripts.many(calls), strict=True):
            for i, code in zip(indices, codes, strict=True):
                leases[i] = Lease(int(code))
        return leases

    async def expire_due(self, *, now: int | None = None, limit: int = 100) -> int:
        """Expire jobs whose ``ttl_s`` passed before an attempt started (sweeps by the scaler and the workers)."""
        now = now or now_ms()
        due = await self.redis.zrangebyscore(self.keys.expiry, "-inf", now, start=0, num=limit)
        return await self._expire_calls(due, now) if due else 0

    async def promote(self, *, now: int | None = None, limit: int = 100) -> int:
        """Move due retries from the delayed set into the stream of each one's lane."""
        now = now or now_ms()
        due = await self.redis.zrangebyscore(self.keys.delayed, "-inf", now, start=0, num=limit)
        if not due:
            return 0
        keys = [*self.keys.lane_streams, self.keys.delayed, *(self.keys.job(j) for j in due)]
        return int(await self.scripts("promote", keys, [now, new_token(), *due]))

    async def heartbeat(self, worker_id: str, in_flight: int, *, now: int | None = None) -> None:
        await self.redis.hset(self.keys.workers, worker_id, f"{now or now_ms()} {in_flight}")

    async def forget_worker(self, worker_id: str) -> None:
        """Remove a stopped worker's heartbeat, and its consumer of each lane where it holds nothing: deleting a
        consumer drops its pending entries, which would strand them."""
        await self.redis.hdel(self.keys.workers, worker_id)
        for stream in self.keys.lane_streams:
            try:
                held = await self.redis.xpending_range(stream, GROUP, "-", "+", 1, consumername=worker_id)
                if not held:
                    await self.redis.xgroup_delconsumer(stream, GROUP, worker_id)
            except ResponseError:
                pass
