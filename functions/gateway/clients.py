"""The gateway's Redis client, created on first use and bound to the event loop that uses it.

A ``redis.asyncio`` connection belongs to the loop it was opened on. Mangum drives each invocation with
``run_until_complete`` on the thread's current loop, which is usually the same loop for the life of the
sandbox, but nothing promises it (a test, another adapter, or a closed loop replaced by a new one): reusing a
pool across loops fails with "attached to a different loop". So the client is keyed by the running loop; a new
loop gets a new client, and the old one is dropped (its loop can no longer run its close).
"""

from __future__ import annotations

import asyncio

from inferq.queue import Queue
from inferq.settings import Settings


class QueueProvider:
    def __init__(self, settings: Settings, queue: Queue | None = None) -> None:
        self.settings = settings
        self._injected = queue
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: Queue | None = None
        self.created = 0
        """How many clients this provider has opened (one per event loop seen)."""

    def get(self) -> Queue:
        if self._injected is not None:
            return self._injected
        loop = asyncio.get_running_loop()
        if self._queue is None or self._loop is not loop:
            self._queue = Queue.connect(self.settings)
            self._loop = loop
            self.created += 1
        return self._queue

    async def aclose(self) -> None:
        """Close the client of the running loop (tests, shutdown). An injected queue belongs to its owner."""
        queue, self._queue = self._queue, None
        if queue is not None and self._loop is asyncio.get_running_loop():
            await queue.close()
        self._loop = None
