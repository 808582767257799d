"""The gateway's Redis client, created on first use and bound to the event loop that uses it.

A ``redis.asyncio`` connection belongs to the loop it was opened on. Mangum drives each invocation with
``run_until_complete`` on the thread's current loop, which is usually the same loop for the life of the
sandbox, but nothing promises it (a test, another adapter, or a closed loop replaced by a new one): reusing a
pool across loops fails with "attached to a different loop". So the client is keyed by the running loop; a new
loop gets a new client, and the old one is dropped (its loop can no longer run its close).

With a model registry the provider holds one :class:`Queue` per model, all on the one client (one pool).
"""

from __future__ import annotations

import asyncio
import contextlib

from inferq.config.registry import Registry
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue
from inferq.redis.connection import connect


class QueueProvider:
    def __init__(self, settings: Settings, queue: Queue | None = None, registry: Registry | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.primary = registry.primary.queue if registry is not None else settings.queue
        """The queue of what is not per model (files, batches, the console, ``/v1/scale``)."""
        self._queue_settings = {m.queue: m.settings for m in registry.models} if registry else {}
        self._injected = queue
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, Queue] = {}
        self.created = 0
        """How many clients this provider has opened (one per event loop seen)."""

    def names(self) -> list[str]:
        """Every queue, the primary first."""
        return [self.primary, *(q for q in self._queue_settings if q != self.primary)]

    def get(self, name: str | None = None) -> Queue:
        """The queue ``name`` (a queue of the registry), or the primary one."""
        name = name or self.primary
        if self._injected is not None:
            if name == self.primary:
                return self._injected
            if name not in self._queues:  # the registry's other queues share the injected queue's client
                self._queues[name] = Queue(self._injected.redis, self._queue_settings[name])
            return self._queues[name]
        loop = asyncio.get_running_loop()
        if not self._queues or self._loop is not loop:
            client = connect(self.settings)
            self._queues = {q: Queue(client, s) for q, s in self._queue_settings.items()} or {
                self.primary: Queue(client, self.settings)}
            self._loop = loop
            self.created += 1
        return self._queues[name]

    async def aclose(self) -> None:
        """Close the client of the running loop (tests, shutdown). An injected queue belongs to its owner."""
        queues, self._queues = self._queues, {}
        if self._loop is asyncio.get_running_loop():
            for queue in queues.values():
                await queue.close_waiters()
        if queues and self._injected is None and self._loop is asyncio.get_running_loop():
            await next(iter(queues.values())).close()  # one client under them all
        self._loop = None

    def close_now(self, timeout_s: float = 2.0) -> None:
        """Close the clients from outside any request (SnapStart's hooks: before the snapshot, after a restore),
        on the loop they belong to when it can still run one; forget them in any case, so the next request
        connects anew. Never raises: a connection a restore broke may fail its close."""
        loop = self._loop
        if self._queues and self._injected is None and loop is not None and not loop.is_closed() \
                and not loop.is_running():
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.wait_for(self.aclose(), timeout_s))
        self._queues, self._loop = {}, None
