"""The Redis fault model every process shares (G8): which failures are worth waiting out, and how long to wait.

A managed Redis fails in a handful of ways every maintenance window, and each process must answer them alike:

- **TRANSIENT** — the server will answer again by itself: the connection was reset or refused, a call timed out
  (redis-py's ``TimeoutError`` or the ``asyncio.timeout`` around it), a failover is under way (``READONLY`` from a
  primary just demoted, ``LOADING`` while a replica loads its data set, ``MASTERDOWN``, ``UNBLOCKED`` for a blocked
  read whose server changed role), a cluster reshards (``CLUSTERDOWN``, ``TRYAGAIN``, a storm of ``MOVED``/``ASK``
  the client could not follow), or a script runs too long (``BUSY``). Retry with backoff; the gateway answers 503.
- **CAPACITY** — the server refuses writes until someone frees memory (``OOM command not allowed``, under
  ``maxmemory-policy noeviction``, which a queue must use). Also waited out with backoff, and a 503 too: the
  request was fine, the store is full.
- **BUG** — anything else (a wrong type, a script error, a refused argument): waiting does not help. The gateway
  answers a logged 500; a worker stops cleanly so its orchestrator replaces it.

redis-py turns each server error into a class by its first word (``redis/_parsers/base.py``): ``READONLY`` →
``ReadOnlyError``, ``LOADING`` → ``BusyLoadingError`` (a ``ConnectionError``), ``OOM`` → ``OutOfMemoryError``,
``MASTERDOWN`` → ``MasterDownError``, ``CLUSTERDOWN`` → ``ClusterDownError``, ``TRYAGAIN`` → ``TryAgainError``;
``BUSY`` and ``UNBLOCKED`` have no class of their own and arrive as a plain ``ResponseError``, recognised here by
their first word (also inside the ``Command # n (...) of pipeline caused error: ...`` text a pipeline raises).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import random
import re
from collections.abc import Callable, Sequence

from redis import exceptions as redis_errors

from inferq.retry import backoff


class Fault(enum.Enum):
    TRANSIENT = "transient"
    CAPACITY = "capacity"
    BUG = "bug"


TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,  # reset, refused, and its subclasses: BusyLoadingError (LOADING), auth (a rotation)
    redis_errors.TimeoutError,
    TimeoutError,  # asyncio.timeout / wait_for around a call
    ConnectionError,  # a socket reset, refusal or broken pipe that redis-py did not wrap (not every OSError: a
    # missing file is not the network's fault)
    redis_errors.ReadOnlyError,  # READONLY: a primary that was just demoted
    redis_errors.ClusterDownError,  # CLUSTERDOWN, and its subclass MasterDownError (MASTERDOWN)
    redis_errors.TryAgainError,  # TRYAGAIN: a multi-key command during resharding
    redis_errors.AskError,  # MOVED/ASK the cluster client could not follow in its redirections (MovedError too)
    redis_errors.SlotNotCoveredError,
)
"""Exception classes that are transient whatever their message."""

CAPACITY_ERRORS: tuple[type[BaseException], ...] = (redis_errors.OutOfMemoryError,)

RECONNECT_ERRORS: tuple[type[redis_errors.RedisError], ...] = (redis_errors.ReadOnlyError,)
"""Errors that say this connection talks to the wrong server (a demoted primary keeps its clients' connections
open): the client drops the connection and tries once more on a new one, which resolves the endpoint again and
reaches the new primary. Resending is safe: a replica refuses a script's first write, so nothing was written."""

_TRANSIENT_CODES = ("BUSY", "UNBLOCKED", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "LOADING", "READONLY",
                    "NOREPLICAS")
_CAPACITY_CODES = ("OOM",)
_PIPELINE_PREFIX = re.compile(r"^Command # \d+ \(.*?\) of pipeline caused error: \(?['\"]?", re.DOTALL)
"""What redis-py puts before a pipeline's error: ``Command # 1 (GET k) of pipeline caused error: ('BUSY ...',)``."""


def error_code(exc: BaseException) -> str:
    """The first word of a server error (``BUSY``, ``OOM``, ...), also out of a pipeline's wrapped message."""
    text = str(exc.args[0]) if exc.args else ""
    text = _PIPELINE_PREFIX.sub("", text, count=1)
    return text.split(" ", 1)[0]


def classify(exc: BaseException) -> Fault:
    """TRANSIENT, CAPACITY or BUG (see the module's docstring)."""
    if isinstance(exc, CAPACITY_ERRORS):
        return Fault.CAPACITY
    if isinstance(exc, TRANSIENT_ERRORS):
        return Fault.TRANSIENT
    if isinstance(exc, redis_errors.ResponseError):
        code = error_code(exc)
        if code in _CAPACITY_CODES:
            return Fault.CAPACITY
        if code in _TRANSIENT_CODES:
            return Fault.TRANSIENT
    return Fault.BUG


def is_recoverable(exc: BaseException) -> bool:
    """Worth waiting out with backoff: TRANSIENT or CAPACITY."""
    return classify(exc) is not Fault.BUG


_JITTER = random.Random()
"""The process's jitter source for :class:`Backoff`. One per process, not one per ``Backoff``: a worker makes a
``Backoff`` for every settle and model call, and ``random.Random()`` seeds itself from ``os.urandom`` (a system
call, ~3% of a worker's CPU in S3's profile). Processes still draw different waits: each seeds its own, and a
forked child seeds it again (as the ``random`` module does for its own)."""


def reseed_jitter() -> None:
    """A fresh seed for the jitter source, from ``os.urandom``: after a fork, or a Lambda SnapStart restore (every
    copy of a snapshot would otherwise draw the same waits)."""
    _JITTER.seed()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reseed_jitter)


class Backoff:
    """Capped exponential backoff with full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter") for
    waiting out a fault: many processes that lost one server together do not all come back in the same
    millisecond. ``failures`` counts the run, so a caller can log its first failure and stay quiet after."""

    def __init__(self, base_s: float = 0.05, cap_s: float = 2.0, rng: random.Random | None = None) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0
        self._rng = rng or _JITTER

    def next(self) -> float:
        """Seconds to wait after one more failure: uniform in [0, min(cap, base * 2**failures)]."""
        self.failures += 1
        return backoff(self.failures + 1, self.base_s, self.cap_s, rng=self._rng)

    def reset(self) -> None:
        self.failures = 0


def cancelling() -> bool:
    """True when the current task has been asked to stop.

    On Python 3.11 a cancellation that races with an ``asyncio.timeout`` (redis-py wraps every read in one) can
    come out as a ``TimeoutError``, which classifies as transient: a loop that retries those must check this, or
    it would swallow its own cancellation and never end."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def drop_stale_connections(client: object, exc: BaseException) -> None:
    """After a ``READONLY``, close the idle connections of ``client``'s pool: they were opened to the server that
    was the primary, and each would answer ``READONLY`` once more before redis-py replaces it (a pipeline, which
    returns errors instead of raising them, never replaces it). New connections reach the current primary."""
    if not isinstance(exc, RECONNECT_ERRORS):
        return
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        await pool.disconnect(inuse_connections=False)


class FaultRun:
    """The bookkeeping of one loop that talks to Redis, between two of its successes: wait out recoverable faults
    with backoff, count each, log the first of a run (then the tenth and every fiftieth, never a storm), and let
    anything else through.

    ``await run.absorb(exc)`` in an ``except Exception`` block answers the seconds to wait before the next try, or
    re-raises: ``exc`` itself when it is a BUG (the caller's supervisor decides what a dead loop means), and
    ``CancelledError`` when it is a cancellation that surfaced as a timeout (see :func:`cancelling`)."""

    def __init__(
        self, what: str, logger: logging.Logger, *, on_fault: Callable[[Fault], None] | None = None,
        clients: Sequence[object] = (), base_s: float = 0.05, cap_s: float = 2.0,
    ) -> None:
        self.what = what
        self.log = logger
        self.on_fault = on_fault
        self.clients = clients
        self.backoff = Backoff(base_s, cap_s)

    @property
    def failures(self) -> int:
        return self.backoff.failures

    async def absorb(self, exc: BaseException) -> float:
        if cancelling():
            raise asyncio.CancelledError from exc
        fault = classify(exc)
        if fault is Fault.BUG:
            raise exc
        if self.on_fault is not None:
            self.on_fault(fault)
        failures = self.backoff.failures
        if failures in (0, 10) or (failures and failures % 50 == 0):
            self.log.warning("%s (%s, %s: %s); retrying with backoff", self.what, fault.value, type(exc).__name__,
                             exc, extra={"failures": failures + 1})
        for client in self.clients:  # the clients this loop uses: their pools may hold a demoted primary's connections
            await drop_stale_connections(client, exc)
        return self.backoff.next()

    def succeeded(self) -> None:
        """The loop's call went through: the next fault starts a new run (and is logged again)."""
        if self.backoff.failures:
            self.log.info("%s: Redis answers again after %d failures", self.what, self.backoff.failures)
            self.backoff.reset()
