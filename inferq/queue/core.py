"""What both sides of the queue share: one queue (``INFERQ_QUEUE``) on one Redis client, its scripts, the
replicated write, the group reads (of one lane, or blocking across all lanes), and the expiry of jobs whose
``ttl_s`` passed (which both a read on the producer side and a sweep on the consumer side can decide).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar

from redis.exceptions import ResponseError

from inferq.config.settings import Settings
from inferq.queue.jobs import LANES, Priority
from inferq.queue.keys import GROUP, WEBHOOK_GROUP, Keys
from inferq.queue.lanes import LaneShare
from inferq.redis.scripting import Scripts
from inferq.usage.periods import hour_start, meter_args

SCRIPT_BATCH = 32
"""Jobs one call of a hot-path script (enqueue, start, finish) takes at most: one script run and one increment of
each shared counter per call instead of per job, while Valkey, which runs a script to its end before anything else,
serves no one else for no more than about a millisecond (30 µs a job under S3's load)."""

T = TypeVar("T")


def chunks(items: Sequence[T], size: int = SCRIPT_BATCH, *, by: Callable[[T], Any] | None = None
           ) -> list[Sequence[T]]:
    """``items`` in consecutive runs of at most ``size``: one script call each; with ``by``, a run also ends where
    ``by`` of the next item differs (a script call that takes the items of one lane)."""
    if by is None:
        return [items[first:first + size] for first in range(0, len(items), size)]
    runs: list[Sequence[T]] = []
    first = 0
    for i in range(1, len(items) + 1):
        if i == len(items) or i - first == size or by(items[i]) != by(items[first]):
            runs.append(items[first:i])
            first = i
    return runs


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) as a pair that sorts as the stream does."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def now_ms() -> int:
    return int(time.time() * 1000)


def new_token() -> str:
    """A random token, generated once per script call (or per delivery, for a lease): a resent copy of the call
    carries the same token, which is how the script knows it already ran (G9)."""
    return secrets.token_hex(8)


class QueueCore:
    """One queue (``INFERQ_QUEUE``) on one Redis client."""

    def __init__(self, client: Any, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self.keys = Keys(settings.queue)
        self.scripts = Scripts(client)
        # under a model registry a job id names its queue, so the gateway finds any job without a lookup
        self.id_suffix = f"_{settings.queue}" if settings.models else ""
        self._reclaim_cursors = dict.fromkeys(LANES, "0-0")
        self.lane_share = LaneShare()
        self._meter: tuple[int, list[str], list[Any]] = (-1, [], [])

    def meter(self, now: int) -> tuple[list[str], list[Any]]:
        """The usage key (the hour's bucket) and its expiry that a script which may end a job at ``now`` (ms) takes
        (``includes/meter.lua``); made once per hour."""
        hour = hour_start(now / 1000)
        if self._meter[0] != hour:
            hour_label, hour_until = meter_args(now, self.settings.usage_retention_days)
            self._meter = (hour, [self.keys.usage_hour(hour_label)], [hour_until])
        return self._meter[1], self._meter[2]

    @classmethod
    def connect(cls, settings: Settings, **options: Any) -> Self:
        from inferq.redis.connection import connect

        return cls(connect(settings, **options), settings)

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    @property
    def fair_flag(self) -> str:
        """What every script that queues a job is told about fair share (G10): ``1`` when it is on."""
        return "1" if self.settings.fair_share else "0"

    async def ensure_groups(self) -> None:
        """Create the worker group on every lane's stream and the webhook group on the events stream, at id 0 with
        MKSTREAM: a group made at ``$`` would silently skip entries added before it."""
        counters = ("unfinished", "enqueued", "succeeded", "failed", "cancelled", "expired", "retried",
                    "reclaimed", "released", "dead_lettered", "duplicate_results", "skipped_terminal", "redriven",
                    "stale_writes", "latency_ms_total", "webhook_events")
        pipe = self.redis.pipeline(transaction=False)
        for counter in counters:  # every counter readable from the start, not only once first incremented
            pipe.hsetnx(self.keys.stats, counter, 0)
        await pipe.execute()
        for stream, group in (*((s, GROUP) for s in self.keys.lane_streams), (self.keys.events, WEBHOOK_GROUP)):
            try:
                await self.redis.xgroup_create(stream, group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def _write(self, calls: list[tuple[str, list[str], list[Any]]], *, replicated: bool) -> list[Any]:
        """Run script calls in one round trip. ``replicated``: a write the caller reports as accepted or final,
        which with ``INFERQ_REDIS_WAIT_REPLICAS`` waits for that many replicas (half the socket timeout at most)
        or raises :class:`ReplicationLag`."""
        replicas = self.settings.redis_wait_replicas
        if replicated and replicas > 0 and calls:
            timeout_ms = max(1, int(self.settings.redis_timeout_s * 500))
            return await self.scripts.replicated(calls, replicas, timeout_ms)
        return await self.scripts.many(calls)

    async def read_group(
        self, stream: str, group: str, consumer: str, count: int, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """``XREADGROUP`` of new entries, as ``[(entry id, fields)]``; a missing group (the stream was deleted, or
        Redis lost it) is created again and answers nothing this time."""
        replies = await self._xreadgroup(group, consumer, [stream], count, block_ms)
        return list(replies[0][1]) if replies else []

    async def read_lanes(
        self, consumer: str, count: int, block_ms: int
    ) -> list[tuple[Priority, str, dict[str, str]]]:
        """One blocking ``XREADGROUP`` across every lane, for when all were empty: it wakes on the first entry of
        any lane. COUNT applies per stream, so it may answer up to ``count`` entries of each lane, as
        ``[(lane, entry id, fields)]`` in lane order; the caller gives back what it has no slot for."""
        streams = {self.keys.stream_of(lane): lane for lane in LANES}
        pairs = await self._xreadgroup(GROUP, consumer, list(streams), count, block_ms)
        found = [(streams[stream], entry_id, fields) for stream, entries in pairs for entry_id, fields in entries]
        return sorted(found, key=lambda item: LANES.index(item[0]))

    async def _xreadgroup(
        self, group: str, consumer: str, streams: list[str], count: int, block_ms: int | None
    ) -> list[tuple[str, list[tuple[str, dict[str, str]]]]]:
        """One ``XREADGROUP`` of new entries of ``streams``, as ``[(stream, entries)]`` whatever the protocol; a
        missing group is created again (:meth:`ensure_groups`) and answers nothing this time."""
        try:
            reply = await self.redis.xreadgroup(group, consumer, dict.fromkeys(streams, ">"), count=count,
                                                block=block_ms)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            await self.ensure_groups()
            return []
        if not reply:
            return []
        # RESP2 answers [[stream, entries], ...], RESP3 {stream: [entries]}
        return [(s, e) for s, e in reply] if isinstance(reply, list) else [(s, v[0]) for s, v in reply.items()]

    async def _expire_calls(self, job_ids: Sequence[str], now: int | None = None) -> int:
        now = now or now_ms()
        usage_keys, usage_args = self.meter(now)
        calls = [
            ("expire", [*self.keys.fair_lanes, self.keys.stats, self.keys.events, self.keys.delayed, self.keys.expiry,
                        self.keys.tenants, self.keys.job(j), self.keys.done(j), *usage_keys, self.keys.bounds],
             [j, now, self.settings.result_ttl_s, self.settings.events_maxlen, *usage_args])
            for j in job_ids
        ]
        return sum(1 for reply in await self.scripts.many(calls) if int(reply[0]) == 0)
