"""The consumer side of the queue, what a worker runs: read and reclaim entries, start them under a lease, then
finish, retry or release each delivery, renew the leases, and sweep what is due (retries to promote, jobs to
expire). A duplicate or stale completion is a normal event to count, so these return an :class:`Outcome`.

Each queue has three lanes (``high``, ``normal``, ``low``), each its own stream; a job's entries are always in its
lane's, so each write about a delivery goes to the stream its entry came from. Reads take the lanes in priority
order with a starvation bound (:mod:`inferq.queue.lanes`); reclaim, renewal and a stopped worker's clean-up cover all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from redis.exceptions import ResponseError

from inferq import fastjson
from inferq.config.settings import Settings
from inferq.queue.core import QueueCore, chunks, new_token, now_ms
from inferq.queue.deliveries import Delivery, Lease, Outcome, Skipped, settle_token
from inferq.queue.fairshare import FAIR_BUFFER
from inferq.queue.jobs import LANES, Job, JobStatus, Priority
from inferq.queue.keys import GROUP
from inferq.redis.scripting import Code, reply_code
from inferq.usage.spend import NONE, Spend, UsageRows

Entry = tuple[Priority, str, dict[str, str]]
"""A stream entry read from a lane: (lane, entry id, fields)."""

Finish = tuple[Delivery, JobStatus, Any, Any] | tuple[Delivery, JobStatus, Any, Any, Spend | None]
"""One finish: the delivery, its terminal status, result, error and (optionally) what the attempt spent."""


def _lane_of(item: tuple[Priority, str, str, str]) -> Priority:
    return item[0]


class Consumer(QueueCore):
    def __init__(self, client: Any, settings: Settings) -> None:
        super().__init__(client, settings)
        self._drained: set[str] = set()
        """The consumers whose last read found every lane drained (see :meth:`read`)."""
        self._waiting: defaultdict[str, dict[Priority, bool]] = defaultdict(dict)
        """Per consumer, the lanes whose jobs its last start of each found waiting for admission (see :meth:`read`)."""

    def _start_call(self, consumer: str, now: int, reclaimed: bool, live: Sequence[tuple[Priority, str, str, str]],
                    refill: int = 0) -> tuple:
        """The start script call that begins ``live`` (lane, entry id, job id, lease; :data:`SCRIPT_BATCH` at most,
        all of one lane) and admits up to ``refill`` of the lane's waiting jobs for those it takes (fair share,
        G10: the entries that were in the stream before the caller's own admission)."""
        keys_of, settings = self.keys, self.settings
        usage_keys, usage_args = self.meter(now)
        keys = [keys_of.stats, keys_of.events, keys_of.dlq, keys_of.expiry, keys_of.tenants, keys_of.dlq_index,
                *usage_keys, keys_of.bounds, *keys_of.fair_lane(live[0][0])]
        args: list[Any] = [consumer, now, settings.max_deliveries, settings.result_ttl_s, settings.events_maxlen,
                           "1" if reclaimed else "0", *usage_args, refill]
        for _, entry_id, job_id, lease in live:
            keys += [keys_of.job(job_id), keys_of.done(job_id)]
            args += [entry_id, lease]
        return ("start", keys, args)

    async def _start_entries(
        self, consumer: str, entries: Sequence[Entry], reclaimed: bool, refill: Mapping[Priority, int] | None = None
    ) -> tuple[list[Delivery], list[Skipped]]:
        """Start ``entries``; ``refill``: per lane, how many of them were in the stream before this consumer's own
        admission (start.lua admits as many waiting jobs in their place). Notes which lanes' jobs still wait for
        admission (:attr:`_waiting`)."""
        if not entries:
            return [], []
        now = now_ms()
        live = [(lane, entry_id, fields.get("job", ""), new_token()) for lane, entry_id, fields in entries if fields]
        parts = chunks(live, by=_lane_of)
        left = dict(refill or {})
        calls = []
        for part in parts:
            lane = part[0][0]
            share = min(left.get(lane, 0), len(part))
            left[lane] = left.get(lane, 0) - share
            calls.append(self._start_call(consumer, now, reclaimed, part, share))
        # each call is followed by the reads of its jobs' records in the same round trip (start.lua answers 0)
        reads: list[Sequence[tuple[Any, ...]]] = [[("HGETALL", self.keys.job(j)) for _, _, j, _ in part]
                                                  for part in parts]
        answered: list[tuple[Any, Any]] = []
        for part, (replies, records) in zip(parts, await self.scripts.many_then(calls, reads), strict=True):
            *replies, waits = replies
            self._waiting[consumer][part[0][0]] = bool(int(waits))
            answered += zip(replies, records, strict=True)
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

        Fair share (G10, :mod:`inferq.queue.fairshare`): a lane whose jobs wait for admission holds a few entries in
        its stream (the start of each admits one in its place), and this consumer's last start told it whether they
        do; a read of such a lane for more than those first admits the rest, in the same round trip, so the lane
        reads as full as its waiting jobs make it, before any lower lane.

        When this consumer's last read found every lane drained, the blocking read comes first: it answers at once
        whatever came meanwhile, one round trip where the lane-by-lane reads take up to three before it. A worker
        that keeps the queue empty, as under a steady load, reads this way; the entries of several lanes it may find
        are the few that came since its last read."""
        if count <= 0:
            return [], []
        if block_ms is not None and consumer in self._drained and not any(self._waiting[consumer].values()):
            return await self.read_blocking(consumer, count, block_ms)
        entries, refill = await self._take(consumer, count)
        if not entries and block_ms is not None:
            return await self.read_blocking(consumer, count, block_ms)
        return await self._start_entries(consumer, entries, reclaimed=False, refill=refill)

    async def read_blocking(self, consumer: str, count: int, block_ms: int) -> tuple[list[Delivery], list[Skipped]]:
        """One read that blocks across every lane for up to ``block_ms`` (below the client's socket timeout) and
        starts at most ``count`` entries, higher lanes first: COUNT applies per stream, so what it answers beyond
        ``count`` is given back unstarted (``requeue``), spending no attempt. It returns at once whenever jobs wait
        for admission: their lane's stream holds entries (:mod:`inferq.queue.fairshare`)."""
        entries = await self.read_lanes(consumer, count, block_ms)
        per_lane = [sum(1 for e in entries if e[0] is lane) for lane in LANES]
        self._note_drained(consumer, len(entries) <= count and max(per_lane) < count)
        if len(entries) > count:
            await self._give_back(entries[count:])
            entries = entries[:count]
        taken = {lane: n for lane, n in zip(LANES, per_lane, strict=True) if n}
        self.lane_share.record(taken, set())
        return await self._start_entries(consumer, entries, reclaimed=False, refill=taken)

    async def _admit_and_read(self, consumer: str, lane: Priority, admit: int, count: int
                              ) -> list[tuple[str, dict[str, str]]]:
        """Admit up to ``admit`` of ``lane``'s waiting jobs (``admit.lua``), then read up to ``count`` of the lane's
        new entries, in one round trip; a missing group is created again and answers nothing."""
        call = ("admit", self.keys.fair_lanes, [admit, new_token(), lane.value])
        read = ("XREADGROUP", "GROUP", GROUP, consumer, "COUNT", count, "STREAMS", self.keys.stream_of(lane), ">")
        try:
            _, reply = await self.scripts.then_command(call, read)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_groups()
            return []
        if not reply:
            return []
        # RESP2 answers [[stream, entries], ...], RESP3 {stream: [entries]}
        pairs = [(s, e) for s, e in reply] if isinstance(reply, list) else [(s, v[0]) for s, v in reply.items()]
        return [entry for _, got in pairs for entry in got]

    async def _take(self, consumer: str, count: int) -> tuple[list[Entry], dict[Priority, int]]:
        """Non-blocking reads, lane by lane, as :meth:`LaneShare.plan` orders them, until ``count`` are taken; a
        lane whose jobs wait for admission admits what the read wants beyond the entries its stream keeps, in the
        same round trip. Returns the entries, and per lane how many of them its stream held before this consumer's
        own admission (at most what it keeps)."""
        entries: list[Entry] = []
        taken = dict.fromkeys(LANES, 0)
        found: dict[Priority, int] = {}
        short: set[Priority] = set()
        waiting = self._waiting[consumer]
        for lane, wanted in self.lane_share.plan(count):
            free = count - len(entries)
            if free <= 0:
                break
            if wanted is None and lane in short:
                continue  # found empty by its owed read a moment ago
            ask = free if wanted is None else min(wanted, free)
            stream = self.keys.stream_of(lane)
            if waiting.get(lane) and ask > FAIR_BUFFER:
                got = await self._admit_and_read(consumer, lane, ask - FAIR_BUFFER, ask)
                found[lane] = found.get(lane, 0) + min(len(got), FAIR_BUFFER)
                waiting[lane] = len(got) == ask  # short: none waits any more
            else:
                got = await self.read_group(stream, GROUP, consumer, ask)
                found[lane] = found.get(lane, 0) + len(got)
            if len(got) < ask:
                short.add(lane)
            taken[lane] += len(got)
            entries += [(lane, entry_id, fields) for entry_id, fields in got]
        self.lane_share.record(taken, short)
        self._note_drained(consumer, short == set(LANES))
        return entries, found

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
                *usage_keys, self.keys.bounds, *self.keys.fair_lane(delivery.lane)[1:]]
        error_json = fastjson.dumps(error).decode()
        args = [delivery.entry_id, now, max(0, int(delay_ms)), self.settings.max_attempts,
                error_json, self.settings.result_ttl_s, self.settings.events_maxlen, delivery.lease,
                settle_token(delivery, "retry", error_json, dead_letter or "", str(strikes)), dead_letter or "",
                strikes, *self._spent(delivery, spend), *usage_args, self.settings.engine_strikes,
                self.settings.engine_strike_window_s * 1000, self.settings.engine_cooloff_s * 1000, self.fair_flag]
        # a retry may end the job (dead-lettered, or cancelled): with replicas to wait for, it waits like finish
        [reply] = await self._write([("retry", keys, args)], replicated=True)
        if reply_code(reply) == 2:
            return Outcome.DEAD_LETTERED
        return self._outcome(reply, Outcome.RETRY_SCHEDULED)

    async def release(self, delivery: Delivery, *, spend: Spend | None = None) -> Outcome:
        """Give the job back at once without spending an attempt (shutdown). ``spend``: the run and GPU time the
        attempt had, added to the job's."""
        keys = [self.keys.stream_of(delivery.lane), self.keys.stats, self.keys.job(delivery.job.id),
                *self.keys.fair_lane(delivery.lane)[1:]]
        args = [delivery.entry_id, delivery.lease, settle_token(delivery, "release"), *self._spent(delivery, spend),
                self.fair_flag]
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
        """Move due retries from the delayed set to where each one's lane takes it from (its stream, or its tenant's
        turn when jobs wait for admission), and make sure each lane whose jobs wait holds
        :data:`~inferq.queue.fairshare.FAIR_BUFFER` entries in its stream (``admit.lua``'s sweep: whatever happened
        to those admitted before, no job waits behind an empty stream for longer than one sweep). The maintenance
        sweeps of the workers and of the scaler run it. Returns the retries promoted."""
        now = now or now_ms()
        due = await self.redis.zrangebyscore(self.keys.delayed, "-inf", now, start=0, num=limit)
        sweep: tuple[str, list[str], list[Any]] = ("admit", self.keys.fair_lanes, [0, ""])
        if not due:
            await self.scripts(*sweep)
            return 0
        keys = [*self.keys.fair_lanes, self.keys.delayed, *(self.keys.job(j) for j in due)]
        promoted, _ = await self.scripts.many([("promote", keys, [now, new_token(), self.fair_flag, *due]), sweep])
        return int(promoted)

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
