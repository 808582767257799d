"""A tenant's concurrent long polls, bounded (``INFERQ_TENANT_MAX_WAITS``, G11).

A wait (``GET /v1/jobs/{id}?wait=``, ``GET /v1/events?wait=``, a job's stream, a synchronous completion) holds a
gateway execution for its whole length: on Lambda, one of the function's reserved executions, for up to 20 s.
The rate limit counts requests, not how long they hold: a tenant making a few requests a second, each a 20 s wait,
would take every execution. So each wait takes a slot of its tenant's, for as long as it lasts, and past the limit
it is refused at once (the gateway answers 429 ``rate_limited`` with ``Retry-After``). A wait of 0 takes no slot.

The slots are one sorted set per tenant on the primary queue (:meth:`~inferq.queue.keys.Keys.waits`, shared by
every gateway process), slot token -> when the slot lapses: taking one and giving it back are one script each
(``takewait.lua``, ``givewait.lua``), both safe to resend. A slot lapses at the wait's end plus a margin, so one whose
holder never gave it back -- a Lambda sandbox killed or frozen mid-wait -- is free again by then, never held for
ever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from inferq.queue.core import new_token

log = logging.getLogger(__name__)


class WaitsFull(Exception):
    """The tenant holds ``limit`` waits already; one of them ends or lapses within ``retry_after_s``."""

    def __init__(self, limit: int, retry_after_s: float) -> None:
        super().__init__(f"{limit} waits of this tenant are running, its limit")
        self.limit = limit
        self.retry_after_s = retry_after_s

    @property
    def retry_after(self) -> str:
        """``Retry-After``: whole seconds, at least 1 (rounded: the slot's lapse is the clock of the gateway that
        took it, and the times of two gateways differ by a few milliseconds)."""
        return str(max(1, round(self.retry_after_s)))


class WaitSlots:
    """The long-poll slots of every tenant, on ``queue`` (the primary queue: one bound per tenant for the whole
    deployment). ``margin_s``: how long past its wait a slot is kept before it lapses on its own (the calls around
    the wait, bounded by their own timeouts, must fit in it). ``clock``: wall-clock seconds (tests move it)."""

    def __init__(self, queue: Any, limit: int, margin_s: float, clock: Callable[[], float] = time.time) -> None:
        self.queue = queue
        self.limit = limit
        self.margin_s = margin_s
        self.clock = clock

    async def take(self, tenant: str, wait_s: float) -> str | None:
        """A slot for a wait of ``wait_s`` seconds: its token, or None when no slot is needed (a wait of 0, or no
        limit). Raises :class:`WaitsFull`."""
        if wait_s <= 0 or self.limit <= 0:
            return None
        token = new_token()
        now = int(self.clock() * 1000)
        margin_ms = round(self.margin_s * 1000)
        lapses = now + round(wait_s * 1000) + margin_ms
        taken, first_lapse = await self.queue.scripts(
            "takewait", [self.queue.keys.waits(tenant)], [token, now, lapses, self.limit])
        if int(taken):
            return token
        # the held wait that lapses first ends at least margin_s before it; most end sooner (their job ends)
        raise WaitsFull(self.limit, max(1.0, (int(first_lapse) - now - margin_ms) / 1000))

    async def give(self, tenant: str, token: str) -> None:
        """Give a slot back. A failure is logged and the slot lapses by itself (``margin_s`` after its wait)."""
        try:
            async with asyncio.timeout(self.margin_s):  # a frozen server: the slot lapses before this would end
                await self.queue.scripts("givewait", [self.queue.keys.waits(tenant)], [token])
        except Exception as exc:  # the answer is written already; the slot's lapse is the net
            log.warning("could not give back a wait slot (%s); it lapses by itself", type(exc).__name__)

    @asynccontextmanager
    async def hold(self, tenant: str, wait_s: float) -> AsyncIterator[None]:
        """A slot held for the body of the ``async with`` (none for a wait of 0). Raises :class:`WaitsFull`."""
        token = await self.take(tenant, wait_s)
        try:
            yield
        finally:
            if token is not None:
                await self.give(tenant, token)
