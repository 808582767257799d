"""The jobs a worker holds, and how many more its window lets it take.

The window bounds the jobs at the model server. A job whose backend call is over no longer takes a slot there
while its outcome is written: the next job is pulled and sent meanwhile, so the engine's slot is refilled one
Redis round trip sooner (the write of the outcome is off the refill path). Writes that cannot keep up must not let
the worker take ever more, so it holds at most twice its window in all: jobs at the server and jobs whose outcome
is still being written together.

The puller adds what it starts and waits here for a free slot; the runner marks a job settling and removes it when
its outcome is written; the lease keeper and the drain walk what is held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol

from .attempt import Attempt


class Sized(Protocol):
    @property
    def size(self) -> int: ...


class HeldJobs:
    """By :attr:`Delivery.key <inferq.queue.protocol.Delivery.key>` (entry ids are per lane). ``window`` is asked
    for its size at each question; ``on_change(count)`` is told the count after each start and each end."""

    def __init__(self, window: Sized, on_change: Callable[[int], None] | None = None) -> None:
        self.window = window
        self._on_change = on_change
        self._jobs: dict[str, Attempt] = {}
        self._settling = 0
        self._slot_freed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def __iter__(self) -> Iterator[Attempt]:
        return iter(list(self._jobs.values()))

    def add(self, attempt: Attempt) -> None:
        self._jobs[attempt.key] = attempt

    def changed(self) -> None:
        """Tell ``on_change`` the count (once per batch of starts, once per end)."""
        if self._on_change is not None:
            self._on_change(len(self._jobs))

    def settling(self, attempt: Attempt) -> None:
        """The attempt's backend call is over: its engine slot is free while its outcome is written."""
        if not attempt.settling:
            attempt.settling = True
            self._settling += 1
            self._slot_freed.set()

    def remove(self, attempt: Attempt) -> None:
        """The attempt's outcome is written (or given up): its slot is free."""
        if self._jobs.pop(attempt.key, None) is attempt and attempt.settling:
            self._settling -= 1
        self._slot_freed.set()
        self.changed()

    def at_engine(self) -> int:
        """The jobs the window counts: those whose backend call is not over yet."""
        return len(self._jobs) - self._settling

    def free(self) -> int:
        """How many more jobs the worker may take now (module docstring)."""
        size = self.window.size
        return min(size - self.at_engine(), 2 * size - len(self._jobs))

    def slot_freed(self) -> None:
        """More room than before (the window grew): wake a puller that waits for a slot."""
        self._slot_freed.set()

    def wait_for_slot(self) -> Coroutine[Any, Any, bool]:
        """Until a slot may have been freed (then ask :meth:`free` again). The wait starts now, not when the
        coroutine first runs: a slot freed in between is not missed."""
        self._slot_freed.clear()
        return self._slot_freed.wait()
