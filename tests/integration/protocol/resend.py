"""Test helpers for G9 (safe to resend): a full snapshot of one queue's keys, and a wrapper around a queue's
scripts that runs every call a second time with the same arguments -- what redis-py's retry, a frozen server
that thaws and a failover all do -- and checks that the copy answers the same and changes nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from inferq.queue.protocol import Queue
from inferq.redis.scripting import Scripts

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


def without_refusals(state: Snapshot, q: Queue) -> Snapshot:
    """The state less what a refused write may leave: its counter and the record of its answer on the job (kept
    so that a resent copy is not counted again)."""
    out = dict(state)
    if q.keys.stats in out:
        kind, stats, ttl = out[q.keys.stats]
        out[q.keys.stats] = (kind, {k: v for k, v in stats.items() if k != "stale_writes"}, ttl)
    for key, (kind, value, ttl) in state.items():
        if key.startswith(q.keys.prefix + "job:"):
            out[key] = (kind, {k: v for k, v in value.items() if k != "refused"}, ttl)
    return out


def difference(before: Snapshot, after: Snapshot) -> dict[str, tuple[Any, Any]]:
    """The keys whose value differs, with both values (readable assertion messages)."""
    return {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


class Resending(Scripts):
    """Runs every script call twice with the same arguments, and fails the test unless the second run answers
    what the first did and leaves every key of the queue as the first run left it. Calls are serialized, so
    that nothing the test does concurrently runs between the two copies. ``checked`` counts the calls per
    script, so a test can prove which scripts it exercised. With ``always=False`` only the calls armed by
    :meth:`arm` are resent (a stateful test picks when)."""

    def __init__(self, q: Queue, *, always: bool = True) -> None:
        super().__init__(q.redis)
        self.q = q
        self.always = always
        self.armed = 0
        self.checked: dict[str, int] = {}
        self._lock = asyncio.Lock()

    def arm(self, calls: int = 1) -> None:
        """Resend the next ``calls`` script calls."""
        self.armed = calls

    async def __call__(self, name: str, keys: list[str], args: list[Any]) -> Any:
        if not self.always:
            if not self.armed:
                return await super().__call__(name, keys, args)
            self.armed -= 1
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

    async def many_then(
        self, calls: list[tuple[str, list[str], list[Any]]], reads: list[Sequence[tuple[Any, ...]]]
    ) -> list[tuple[Any, list[Any]]]:
        return [(await self(*call), [await self.q.redis.execute_command(*read) for read in after])
                for call, after in zip(calls, reads, strict=True)]

    async def then_command(self, call: tuple[str, list[str], list[Any]], command: tuple[Any, ...]) -> tuple[Any, Any]:
        return await self(*call), await self.q.redis.execute_command(*command)

    async def replicated(
        self, calls: list[tuple[str, list[str], list[Any]]], replicas: int, timeout_ms: int
    ) -> list[Any]:
        return await self.many(calls)


class DelayingProxy:
    """A TCP proxy in front of a server that can hold back the server's replies on the connections open at one
    moment (a network blip): the client times out and resends on a new connection, while the server has already
    run the first copy. The fault of issue 11, point 2, made deterministic."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._delayed: set[asyncio.StreamWriter] = set()
        self.delay_s = 0.0

    async def __aenter__(self) -> DelayingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._open):
            writer.close()

    def delay_open_connections(self, delay_s: float) -> None:
        """From now on, replies to the connections open now reach their client ``delay_s`` late."""
        self.delay_s = delay_s
        self._delayed = set(self._open)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        self._open.add(client_writer)

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, replies: bool) -> None:
            try:
                while chunk := await reader.read(65536):
                    if replies and client_writer in self._delayed:
                        await asyncio.sleep(self.delay_s)
                    writer.write(chunk)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        await asyncio.gather(pipe(client_reader, server_writer, False), pipe(server_reader, client_writer, True))
        self._open.discard(client_writer)
