"""The worker's window: how many jobs it holds at once, fixed (``INFERQ_WINDOW=N``) or adaptive (``auto``).

A fixed window is wrong for some workload: the right concurrency for vLLM depends on prompt and output lengths
(how many sequences fit in the KV cache). Too small leaves the batch half empty; too large queues requests
*inside* the model server, where no other replica can take them and reclaim cannot see them. With ``auto`` the
window follows the model server's own load signals (:class:`~gpu_worker.backends.base.EngineLoad`: requests
waiting, requests running, KV-cache usage), read every :data:`POLL_S` seconds (never per job) by
:class:`AdaptiveWindow`, which turns the server's counters into the means between two reads
(:func:`interval_load`, where the server counts them; its gauges otherwise), and :class:`WindowLaw` (pure, no
I/O) decides the size:

- **shrink multiplicatively** when more requests wait inside the server than a small buffer
  (:meth:`WindowLaw.buffer`: :data:`BUFFER_SHARE` of the running batch, or the worker's requests on their way to
  the engine and back where more (:class:`Refill`), 1 to :data:`BUFFER_MAX`; smoothed, and
  only when they waited at two of the last three reads: a queue that stands, not a burst the engine admits at
  its next steps, as CoDel reads a queue over an interval rather than by its peak): by the share of the window
  that stands beyond the buffer, as DCTCP cuts by the share of marked packets, and by at most x :data:`DECREASE`
  per poll (x :data:`SLOW_START_DECREASE` for the cut that ends slow start); then hold for :data:`HOLD_POLLS`
  polls so the server can drain what already queued before the signal is read again (the signal lags the window);
- **grow** while fewer than the buffer wait (now and at two of the last three reads), the KV cache has room
  (below :data:`KV_HIGH`) and the window is used (:data:`USED_SHARE`; a window that is not used says nothing
  about the engine's room, so an idle worker's window does not creep to the maximum): doubling until the first
  cut while the gauges show the window (slow start, so a fresh worker reaches a large batch in a few polls;
  :data:`SEEN_SHARE`), otherwise by :data:`GROWTH` of the window per poll (at least one), and by
  :data:`PROBE_STEP` within one request of the size of the last cut, so it probes that edge slowly instead of
  oscillating across it;
- always within ``[1, INFERQ_WINDOW_MAX]``.

A backend without signals (a server with no vLLM metrics) gives no reason to shrink: the window then grows to
``INFERQ_WINDOW_MAX`` as it fills, like a static window of that size. A failed read holds the size.

Why a buffer rather than nothing waiting: when a request ends, its slot stays empty until the worker has written
the result, pulled the next job and sent it, a few milliseconds to tens of them; an engine with the next request
already queued fills the slot at its next step. Measured against vLLM on CPU (bench V), a window that keeps
nothing waiting leaves the batch short by that refill time; one that keeps one or two waiting does not, and
those few are all that no other replica can take. What the engine needs waiting is how many requests end while
one crosses that path, which by Little's law is how many of the worker's requests are on it: a backend that times
its requests (the ``openai`` one, send to answer) gives the time each spent outside the server's stamps, compared
per request with the server's own latency counter, and :class:`Refill` turns that into the count.

The requests on that path (in the server's HTTP front end before it stamps their arrival, above all) are neither
waiting nor running by the server's metrics, and they are not counted as waiting here. Read as a queue to cut
(tried against vLLM on 2 cores, whose front end held them 0.1-0.9 s each against 0.01-0.02 s idle), they drove the
window down to 4-5 and lost a quarter of the output tokens/s against the law without them, nearly half against
window 24 (docs/benchmarks.md): a front end given more requests at once gets more through, and a window that
starves it holds fewer requests only by serving fewer.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

from inferq.config.settings import Settings

from .backends.base import EngineLoad

log = logging.getLogger(__name__)

POLL_S = 0.5
"""Period of the load reads: a few per second is enough for batches that last seconds, and costs one small HTTP
request (vLLM's /metrics page) per period, whatever the job rate."""
DECREASE = 0.8
SLOW_START_DECREASE = 0.5
"""The most the first cut takes (the one that ends slow start): the last doubling may have overshot by half."""
BUFFER_SHARE = 0.15
BUFFER_MAX = 4.0
"""Requests allowed to wait inside the engine: :data:`BUFFER_SHARE` of its running batch, at least one and at most
:data:`BUFFER_MAX` (the next requests at hand when some end; a large batch ends a few per refill time, not more)."""
TOLERANCE = 0.5
"""How far the smoothed waiting count may exceed the buffer before the window is cut: one sample of one request
more (a request seen between its arrival and the next engine step) is tolerated."""
SMOOTHING = 0.5
"""Weight of the newest sample in the moving average of the waiting count."""
KV_HIGH = 0.9
HOLD_POLLS = 2
SEEN_SHARE = 0.8
"""Slow start doubles the window only once the engine's gauges show most of it (running + waiting >= this share
of the jobs in flight), and otherwise by :data:`GROWTH`: vLLM's gauges trail its requests by a few tenths of a
second, and doubling on a reading taken before the last doubling arrived overshoots by far. (Requests held in
the server's HTTP front end, before its engine, are not in the gauges either: a front end that is the
bottleneck keeps the window growing by :data:`GROWTH`.)"""
GROWTH = 0.125
"""Growth per poll away from the last cut, as a share of the window (at least one request): when the engine's
gauges never show the window (a model server whose HTTP front end holds most of the requests, on a busy host),
slow start does not double, and one request per poll would take a minute to reach a batch of a few dozen;
an eighth per poll takes about 8 ln(N) polls."""
PROBE_STEP = 0.25
"""Growth per poll within one request of the size of the last cut: that edge is probed slowly; once past it by a
request, the edge has moved and growth is back to :data:`GROWTH`."""
USED_SHARE = 0.8
"""A window counts as used, and may grow, when at least this share of it is in flight: a worker with a backlog
is always a job or two short of its window (a job ends, its result is written and the next one pulled), and a
window that had to be full to the last job would rarely grow; an idle worker holds far less and does not grow."""

OUTSIDE_ANSWERS = 8
"""Answers the worker's estimate of its requests outside the server's stamps is taken over at least (the last
poll's, or as many polls back as it takes, up to :data:`OUTSIDE_POLLS`): one or two answers are too noisy a mean."""
OUTSIDE_POLLS = 20

LoadSource = Callable[[], Awaitable[EngineLoad | None]]


def interval_load(previous: EngineLoad | None, current: EngineLoad, seconds: float) -> EngineLoad:
    """The load the law reads: the mean numbers of requests waiting and running inside the model server between
    two reads, where the server counts its finished requests' times; its gauges otherwise.

    Little's law: the seconds requests spent waiting, summed over an interval, divided by its length, is the mean
    number waiting during it. A gauge is what one moment shows, and which moment is biased: a model server whose
    front end is busy answers ``/metrics`` late, after a burst has drained (measured on vLLM on 2 cores: a read
    took 3 s under load, and most reads found an idle engine while ten requests were in flight). The counters
    integrate over the whole interval, whenever they are read. Waiting is a request's time in the server before
    the engine first ran it (its latency less its inference time: the front end's queue and the engine's, where
    vLLM's own queue-time histogram restarts at each requeue and read 0 s for requests that waited seconds). A
    request's times are counted when it finishes, so one that waited long is counted at once at its end: hence the
    law's smoothing and its two reads of three. An interval in which nothing finished (long requests, or none)
    says nothing new: the gauges stand in. The running count is the larger of the two (slow start asks whether
    the engine holds the window)."""
    if (previous is None or seconds <= 0 or current.finished is None or previous.finished is None
            or current.latency_s is None or previous.latency_s is None
            or current.inference_s is None or previous.inference_s is None
            or current.finished <= previous.finished):  # nothing finished, or the server restarted
        return current
    inference = max(0.0, current.inference_s - previous.inference_s)
    waiting = max(0.0, current.latency_s - previous.latency_s - inference) / seconds
    return replace(current, waiting=waiting, running=max(inference / seconds, current.running))


class Refill:
    """How many of the worker's requests are on their way between it and the engine: sent but not yet stamped by
    the server (its HTTP front end, the connection), or finished but not yet answered (the answer on its way back).
    That is the refill path of a slot: when a request ends, its slot is empty until the next request comes through
    it, unless one already waits inside the engine; so the engine needs as many waiting as end while one crosses
    the path (its bandwidth-delay product, as BBR sizes what it keeps in flight), and that is how many are on it.

    From the backend's counters (:attr:`EngineLoad.answered`, :attr:`EngineLoad.answered_s`: the worker's own
    requests, from send to answer) and the server's (``finished``, ``latency_s``: arrival to last token): the mean
    time a request spent outside the server's stamps over the last answers is the difference of the two means per
    request (per request, so a server that also answers other clients does not skew it); times the requests
    answered per second it is, by Little's law, the mean number on the path. 0 where the counters are missing."""

    def __init__(self, *, answers: int = OUTSIDE_ANSWERS, polls: int = OUTSIDE_POLLS) -> None:
        self.answers = answers
        self._reads: collections.deque[tuple[float, EngineLoad]] = collections.deque(maxlen=polls + 1)
        self.per_request: float | None = None

    def update(self, raw: EngineLoad | None, now: float) -> float:
        """The mean requests on the path over the last answers, given the server's read at ``now``."""
        if (raw is None or raw.answered is None or raw.answered_s is None or raw.finished is None
                or raw.latency_s is None):
            return 0.0
        if self._reads:
            last = self._reads[-1][1]
            assert last.answered is not None and last.finished is not None
            if raw.answered < last.answered or raw.finished < last.finished:  # the server or the backend restarted
                self._reads.clear()
        self._reads.append((now, raw))
        for then, old in reversed(list(self._reads)[:-1]):  # the most recent read with enough answers since
            assert old.answered is not None and old.answered_s is not None
            assert old.finished is not None and old.latency_s is not None
            answered, finished = raw.answered - old.answered, raw.finished - old.finished
            if answered >= self.answers and finished >= 1 and now > then:
                break
        else:
            return 0.0
        self.per_request = max(0.0, (raw.answered_s - old.answered_s) / answered
                               - (raw.latency_s - old.latency_s) / finished)
        return answered / (now - then) * self.per_request


class WindowLaw:
    """The control law, a pure state machine: :meth:`step` takes one load sample and the worker's in-flight count
    and returns the new window."""

    def __init__(
        self, maximum: int, *, initial: int = 1, decrease: float = DECREASE, tolerance: float = TOLERANCE,
        smoothing: float = SMOOTHING, kv_high: float = KV_HIGH, hold_polls: int = HOLD_POLLS,
        probe_step: float = PROBE_STEP, buffer_share: float = BUFFER_SHARE, buffer_max: float = BUFFER_MAX,
        growth: float = GROWTH,
    ) -> None:
        if maximum < 1:
            raise ValueError(f"maximum must be >= 1, got {maximum}")
        if not 0 < decrease < 1:
            raise ValueError(f"decrease must be in (0, 1), got {decrease}")
        self.maximum = maximum
        self.size = float(min(max(initial, 1), maximum))
        self.decrease = decrease
        self.tolerance = tolerance
        self.smoothing = smoothing
        self.kv_high = kv_high
        self.hold_polls = hold_polls
        self.probe_step = probe_step
        self.buffer_share = buffer_share
        self.buffer_max = buffer_max
        self.growth = growth
        self.waiting = 0.0  # moving average of the engine's waiting count
        self.ceiling: float | None = None  # the size at which requests last queued in the engine
        self.slow_start = True
        self._hold = 0
        self._recent = (0.0, 0.0, 0.0)  # the last three reads of the waiting count

    @property
    def current(self) -> int:
        return max(1, min(self.maximum, math.floor(self.size)))

    def step(self, load: EngineLoad | None, in_flight: int) -> int:
        if load is None:  # no signals: nothing says the engine is full
            load = EngineLoad(waiting=0.0, running=float(in_flight))
        self.waiting = self.smoothing * load.waiting + (1 - self.smoothing) * self.waiting
        # what waited at two of the last three reads: a queue that stands, not a burst the engine admits at its
        # next steps (as CoDel reads a queue over an interval, not by its peak), nor one read that finds it
        # drained between two that find it standing
        self._recent = (*self._recent[1:], load.waiting)
        standing = sorted(self._recent)[1]
        buffer = self.buffer(load)
        if self._hold:
            self._hold -= 1
        elif self.waiting > buffer + self.tolerance and standing > buffer:
            # DCTCP-like: cut by the share that stands beyond the buffer, at most by ``decrease`` (one request too
            # many costs one slot, a slow-start overshoot a fifth per poll)
            self.ceiling = self.size
            excess = standing - buffer
            # leaving slow start, the last doubling may have overshot by half: cut by up to half, as TCP does
            decrease = SLOW_START_DECREASE if self.slow_start else self.decrease
            self.size = max(1.0, self.size * max(decrease, 1 - excess / self.size))
            self.slow_start = False
            self._hold = self.hold_polls
        elif self._may_grow(load, in_flight, buffer, standing):
            if self.slow_start and load.running + load.waiting >= SEEN_SHARE * in_flight:
                self.size *= 2
            elif self.ceiling is not None and abs(self.size - self.ceiling) <= 1:
                self.size += self.probe_step
            else:
                self.size += max(1.0, self.growth * self.size)
            self.size = min(self.size, float(self.maximum))
        return self.current

    def buffer(self, load: EngineLoad) -> float:
        """Requests that may wait inside the engine: the next one at hand when one ends."""
        if self.buffer_share <= 0:
            return 0.0
        return min(self.buffer_max, max(1.0, self.buffer_share * load.running, load.path))

    def _may_grow(self, load: EngineLoad, in_flight: int, buffer: float, standing: float) -> bool:
        # below the buffer now and at two of the last three reads: one read that finds the queue drained between
        # reads that find it standing is not room, as one that finds a burst is not a queue
        if load.waiting >= max(buffer, 1e-9) or standing >= max(buffer, 1e-9):
            return False
        if load.kv_cache_usage is not None and load.kv_cache_usage >= self.kv_high:
            return False
        return in_flight >= max(1, math.floor(USED_SHARE * self.current))


class Window(Protocol):
    """What the worker's pull loop asks: how many jobs it may hold now."""

    @property
    def size(self) -> int: ...

    async def run(self, stop: asyncio.Event, in_flight: Callable[[], int], changed: Callable[[int, int], None]) -> None:
        """Adapt until ``stop`` (not before: the worker supervises its tasks, and one that ends early stops it),
        calling ``changed(old, new)`` on each change."""
        ...


class StaticWindow:
    """``INFERQ_WINDOW=N``: N, always."""

    def __init__(self, size: int) -> None:
        self._size = size

    @property
    def size(self) -> int:
        return self._size

    async def run(self, stop: asyncio.Event, in_flight: Callable[[], int], changed: Callable[[int, int], None]) -> None:
        await stop.wait()  # nothing to adapt; a supervised task ends only when its worker stops


class AdaptiveWindow:
    """``INFERQ_WINDOW=auto``: reads the backend's load every ``poll_s`` and lets :class:`WindowLaw` size the
    window."""

    def __init__(self, source: LoadSource | None, maximum: int, *, poll_s: float = POLL_S,
                 law: WindowLaw | None = None) -> None:
        self.source = source
        self.law = law or WindowLaw(maximum)
        self.poll_s = poll_s
        self.last_load: EngineLoad | None = None
        self._last_raw: EngineLoad | None = None
        self._last_read_at = 0.0
        self._failures = 0
        self.refill = Refill()

    @property
    def size(self) -> int:
        return self.law.current

    async def read(self) -> tuple[bool, EngineLoad | None]:
        """(read, load): ``read`` is False when the source failed (the window then holds its size)."""
        if self.source is None:
            return True, None
        try:
            load = await self.source()
        except Exception as exc:  # the model server restarting, a proxy in the way: not the worker's problem
            self._failures += 1
            if self._failures in (1, 10) or self._failures % 100 == 0:
                log.warning("cannot read the model server's load (%s: %s); the window holds at %d",
                            type(exc).__name__, exc, self.size)
            return False, None
        self._failures = 0
        return True, load

    async def poll(self, in_flight: int) -> int:
        """One read and one step of the law; returns the window."""
        ok, raw = await self.read()
        if ok:
            now = time.monotonic()
            load = None if raw is None else interval_load(self._last_raw, raw, now - self._last_read_at)
            if load is not None:
                load = replace(load, path=self.refill.update(raw, now))
            self._last_raw, self._last_read_at = raw, now
            self.last_load = load
            self.law.step(load, in_flight)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("window %d (%.2f): in flight %d, engine waiting %s running %s kv %s, path %s "
                          "(%s s a request)", self.size, self.law.size, in_flight,
                          *(("-",) * 4 if load is None else
                            (load.waiting, load.running, load.kv_cache_usage, round(load.path, 2))),
                          self.refill.per_request)
        return self.size

    async def run(self, stop: asyncio.Event, in_flight: Callable[[], int], changed: Callable[[int, int], None]) -> None:
        while not stop.is_set():
            before = self.size
            after = await self.poll(in_flight())
            if after != before:
                changed(before, after)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)


def window_for(settings: Settings, backend: Any) -> StaticWindow | AdaptiveWindow:
    """The window ``settings`` asks for; with ``auto``, fed by the backend's ``load()`` when it has one."""
    if not settings.adaptive_window:
        return StaticWindow(settings.window_limit)
    source = getattr(backend, "load", None)
    if not callable(source):
        log.warning("the %s backend publishes no load signals: INFERQ_WINDOW=auto grows to INFERQ_WINDOW_MAX",
                    getattr(backend, "name", "configured"))
        source = None
    return AdaptiveWindow(source, settings.window_max)
