"""The followers of jobs' output in one process and event loop: one sharded pub/sub connection for all of them.

``appendoutput.lua`` publishes each delta it writes, and ``closeoutput.lua`` the end entry, on a channel named as the
job's output stream key (``SPUBLISH``: the channel hashes to the queue's slot, like its keys, so a cluster keeps it
on the queue's shard). A follower of a job (``OutputReader.follow``: the OpenAI front door's ``stream: true`` on a
host that streams) takes the deltas from its :class:`Followed`, instead of a blocked ``XREAD`` of its own that Valkey
wakes for each delta and that is then sent again: in server instructions, a delivery on a connection already
subscribed costs about a tenth of that wake (``make bench ARGS="--only ST"``, floor per write).

Pub/sub is not durable: a message sent while the connection is down (redis-py reconnects and subscribes again) is
lost. The stream stays the truth: every message names its entry, a follower that sees a delta start past what it has
read (a message it missed) reads the stream from its cursor, and so do the followers of a channel subscribed again
(the server confirms each subscription, so a second confirmation means a new connection), those told that a read
failed, and one that heard nothing for a while (the reader's slice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from redis.asyncio import RedisCluster
from redis.exceptions import NoPermissionError, RedisError, ResponseError

from inferq.queue.core import entry_key

log = logging.getLogger(__name__)

SUBSCRIBED_WAIT_S = 2.0
"""How long a new follower waits for the server to confirm its subscription before it reads the stream (past it, it
reads anyway: a delta published in between is a gap it reads again from the stream)."""


def parse(data: str) -> tuple[str, dict[str, str]] | None:
    """A published message as a stream entry ``(id, fields)``: ``<id>\\n<p>\\n<k>\\n<t>`` for a delta,
    ``<id>\\nend\\n<status>`` for the end; None for anything else."""
    parts = data.split("\n", 3)
    if len(parts) == 3 and parts[1] == "end":
        return parts[0], {"end": parts[2]}
    if len(parts) == 4 and parts[1].isdigit():
        return parts[0], {"p": parts[1], "k": parts[2], "t": parts[3]}
    return None


def unread(entry: str, offset: int, entries: list[tuple[str, dict[str, str]]]
           ) -> list[tuple[str, dict[str, str]]] | None:
    """The published ``entries`` after stream entry ``entry``, in order, for a reader that has read ``offset`` bytes;
    None when one was missed (a delta that starts past what has been read, before any that covers it): the stream
    has it."""
    after = entry_key(entry)
    fresh = []
    for entry_id, fields in sorted(entries, key=lambda e: entry_key(e[0])):
        if entry_key(entry_id) <= after:
            continue  # read already (the first look, or a read of the stream since)
        at, said = fields.get("p"), fields.get("t")
        if at is not None and said is not None:
            if int(at) > offset:
                return None
            offset = max(offset, int(at) + len(said.encode()))
        fresh.append((entry_id, fields))
    return fresh


CLUSTER_POLL_S = 0.02
"""How long one read of a cluster client's sharded pub/sub waits: redis-py's ``ClusterPubSub`` holds the node's lock
while it reads, so a new subscription waits up to this long (its reads send nothing to the server)."""

REFUSALS = ("NOPERM", "unknown command", "ERR unknown")
"""Answers that mean the server will never let this process subscribe (its ACL, or no sharded pub/sub)."""


class Followed:
    """One follower's subscription to one job's output: the entries published since its last :meth:`take`."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._entries: list[tuple[str, dict[str, str]]] = []
        self._lost = False
        self._ready = asyncio.Event()

    def _put(self, entry: tuple[str, dict[str, str]]) -> None:
        self._entries.append(entry)
        self._ready.set()

    def _lose(self) -> None:
        self._lost = True
        self._ready.set()

    async def take(self, seconds: float) -> tuple[list[tuple[str, dict[str, str]]], bool] | None:
        """The entries published since the last take, and whether some may have been missed (the connection was
        lost: read the stream); waits up to ``seconds`` for the first. None when nothing came."""
        if not self._ready.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), max(0.0, seconds))
        if not self._ready.is_set():
            return None
        entries, lost = self._entries, self._lost
        self._entries, self._lost = [], False
        self._ready.clear()
        return entries, lost


class OutputFeed:
    """The sharded pub/sub subscriptions of one process and event loop to jobs' output channels, on one connection
    (:meth:`follow`, :meth:`leave`); one task reads it while anyone follows."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._cluster = isinstance(redis, RedisCluster)
        self._pubsub: Any = None
        self._followers: dict[str, set[Followed]] = {}
        self._confirmed: dict[str, asyncio.Future[None]] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._leaving: set[asyncio.Task[None]] = set()
        """Unsubscriptions under way (a task each, so that the follower who left need not wait)."""
        self.refused: ResponseError | None = None
        """Why the server refused a subscription (its ACL, or no sharded pub/sub): followers read the stream then."""
        self.messages = 0
        """Messages handed to followers (tests and metrics)."""

    async def follow(self, channel: str) -> Followed:
        """Subscribe to ``channel`` (if this process does not already) and return the follower's subscription, once
        the server has confirmed it: anything published after this returns reaches it. Raises ``ResponseError``
        when the server refuses sharded pub/sub (the caller reads the stream instead)."""
        if self.refused is not None:
            raise ResponseError(str(self.refused))  # a new one each time: a kept traceback would keep its frames
        followed = Followed(channel)
        self._followers.setdefault(channel, set()).add(followed)  # at once: a cancelled follow is dropped below
        try:
            confirmed = await asyncio.shield(self._subscribed(channel))
            try:
                await asyncio.wait_for(asyncio.shield(confirmed), SUBSCRIBED_WAIT_S)
            except TimeoutError:
                pass
        except BaseException:
            self._drop(followed)
            raise
        return followed

    async def leave(self, followed: Followed) -> None:
        """End ``followed``; the channel is unsubscribed when its last follower leaves. Never waits on the server, so
        a follower cancelled again while it leaves (a client gone mid-stream) still leaves."""
        self._drop(followed)

    async def _subscribed(self, channel: str) -> asyncio.Future[None]:
        """The confirmation of this process's subscription to ``channel``, subscribing first if it is not."""
        async with self._lock:
            confirmed = self._confirmed.get(channel)
            if confirmed is not None:
                return confirmed
            if self._pubsub is None:
                self._pubsub = self._redis.pubsub()
            confirmed = self._confirmed[channel] = asyncio.get_running_loop().create_future()
            # a refusal may land after every follower stopped waiting: read here, it is never "unretrieved"
            confirmed.add_done_callback(lambda f: None if f.cancelled() else f.exception())
            try:
                await self._pubsub.ssubscribe(channel)
            except BaseException:
                del self._confirmed[channel]
                raise
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._run(), name="inferq-output-feed")
            return confirmed

    def _drop(self, followed: Followed) -> None:
        others = self._followers.get(followed.channel)
        if others is None or followed not in others:
            return
        others.discard(followed)
        if others:
            return
        del self._followers[followed.channel]
        self._confirmed.pop(followed.channel, None)
        task = asyncio.get_running_loop().create_task(self._unsubscribe(followed.channel))
        self._leaving.add(task)
        task.add_done_callback(self._leaving.discard)

    async def _unsubscribe(self, channel: str) -> None:
        async with self._lock:
            if channel in self._followers or self._pubsub is None:
                return  # followed again meanwhile: it stays
            with contextlib.suppress(RedisError, OSError):
                await self._pubsub.sunsubscribe(channel)

    def following(self) -> int:
        """Channels subscribed now."""
        return len(self._followers)

    async def aclose(self) -> None:
        """Stop reading and close the connection; followers still waiting hear that they may have missed output."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RedisError, OSError):
                await task
        for others in self._followers.values():
            for followed in others:
                followed._lose()
        self._followers.clear()
        self._confirmed.clear()
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()

    async def _next(self) -> dict[str, Any] | None:
        if self._cluster:  # redis-py holds the node's lock while it reads, and a new subscription waits for it
            return await self._pubsub.get_sharded_message(timeout=CLUSTER_POLL_S)
        return await self._pubsub.get_message(timeout=1.0)

    async def _run(self) -> None:
        pause = 0.0
        while self._followers:
            failed: Exception | None = None
            message = None
            try:
                message = await self._next()
            except ResponseError as exc:
                if isinstance(exc, NoPermissionError) or any(r in str(exc) for r in REFUSALS):
                    self._refuse(exc)  # refused for good: no follower is served here from now on
                    return
                failed = exc  # a cluster that is down or moving a slot: waited out as a lost connection
            except (RedisError, OSError) as exc:
                failed = exc
            if failed is not None:
                # redis-py connects again and subscribes again on the next read; what was sent meanwhile is lost
                if not pause:
                    log.warning("output feed: connection lost (%s); followers read their streams",
                                type(failed).__name__)
                for others in self._followers.values():
                    for followed in others:
                        followed._lose()
                pause = min(1.0, max(0.05, pause * 2))  # while the server is away: 50 ms, doubling, at most 1 s
                await asyncio.sleep(pause)
                continue
            pause = 0.0
            if message is not None:
                self._dispatch(message)

    def _refuse(self, exc: ResponseError) -> None:
        log.warning("output feed: the server refused a subscription (%s); followers read their streams", exc)
        self.refused = exc
        for confirmed in self._confirmed.values():
            if not confirmed.done():
                confirmed.set_exception(exc)
        for others in self._followers.values():
            for followed in others:
                followed._lose()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind, raw = message.get("type"), message.get("channel")
        channel = raw.decode() if isinstance(raw, bytes) else str(raw)
        if kind == "ssubscribe":
            confirmed = self._confirmed.get(channel)
            if confirmed is not None and not confirmed.done():
                confirmed.set_result(None)
            elif confirmed is not None:  # subscribed again: redis-py connected anew, and what came meanwhile is lost
                for followed in self._followers.get(channel, ()):
                    followed._lose()
            return
        if kind != "smessage":
            return
        data = message.get("data")
        entry = parse(data.decode() if isinstance(data, bytes) else str(data))
        if entry is None:
            return
        for followed in self._followers.get(channel, ()):
            followed._put(entry)
            self.messages += 1
