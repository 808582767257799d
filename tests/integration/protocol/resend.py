"""Test helpers for G9 (safe to resend): a full snapshot of one queue's keys, and a wrapper around a queue's
scripts that runs every call a second time with the same arguments -- what redis-py's retry, a frozen server
that thaws and a failover all do -- and checks that the copy answers the same and changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from inferq.queue import Queue
from inferq.scripting import Scripts

Snapshot = dict[str, Any]


async def snapshot(q: Queue) -> Snapshot:
    """Every key of the queue with its whole value: hashes, lists, sets, sorted sets with scores, streams with
    their entries, groups and pending entries (owner and delivery count, not idle times), and whether it has a
    TTL (not its value: time passes between two snapshots)."""
    state: Snapshot = {}
    for key in sorted(await q.redis.keys(q.keys.prefix + "*")):
        kind = await q.redis.type(key)
        value: Any
        if kind == "string":
            value = await q.redis.get(key)
        elif kind == "hash":
            value = await q.redis.hgetall(key)
        elif kind == "list":
            value = await q.redis.lrange(key, 0, -1)
        elif kind == "set":
            value = sorted(await q.redis.smembers(key))
        elif kind == "zset":
            value = await q.redis.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            groups = []
            for group in await q.redis.xinfo_groups(key):
                pending = await q.redis.xpending_range(key, group["name"], "-", "+", 10_000)
                groups.append((group["name"], group["last-delivered-id"], group["pending"],
                               [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pending]))
            value = (await q.redis.xrange(key), groups)
        else:
            raise AssertionError(f"{key}: unexpected type {kind}")
        state[key] = (kind, value, await q.redis.ttl(key) > 0)
    return state


def difference(before: Snapshot, after: Snapshot) -> dict[str, tuple[Any, Any]]:
    """The keys whose value differs, with both values (readable assertion messages)."""
    return {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


class Resending(Scripts):
    """Runs every script call twice with the same arguments, and fails the test unless the second run answers
    what the first did and leaves every key of the queue as the first run left it. Calls are serialized, so
    that nothing the test does concurrently runs between the two copies. ``checked`` counts the calls per
    script, so a test can prove which scripts it exercised."""

    def __init__(self, q: Queue) -> None:
        super().__init__(q.redis)
        self.q = q
        self.checked: dict[str, int] = {}
        self._lock = asyncio.Lock()

    async def __call__(self, name: str, keys: list[str], args: list[Any]) -> Any:
        async with self._lock:
            first = await super().__call__(name, keys, args)
            once = await snapshot(self.q)
            second = await super().__call__(name, keys, args)
            twice = await snapshot(self.q)
        assert second == first, f"{name} answered {first!r}, then {second!r} when resent"
        assert twice == once, f"{name} resent changed {difference(once, twice)}"
        self.checked[name] = self.checked.get(name, 0) + 1
        return first

    async def many(self, calls: list[tuple[str, list[str], list[Any]]]) -> list[Any]:
        return [await self(name, keys, args) for name, keys, args in calls]

    async def replicated(
        self, calls: list[tuple[str, list[str], list[Any]]], replicas: int, timeout_ms: int
    ) -> list[Any]:
        return await self.many(calls)
