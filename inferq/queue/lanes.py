"""How a worker shares its takes between the lanes of a queue: higher lanes first, with a starvation bound.

A take is one entry a worker reads. The ``high`` lane is read first, then ``normal``, then ``low``, so a job
submitted ``high`` after a backlog of ``low`` ones starts first. But a lane below ``high`` that has entries
waiting is owed one take in every :data:`SHARE_EVERY` (so at least 10% of the takes each, counted in takes, not
time): under a constant stream of ``high`` work, ``normal`` and ``low`` still move. A lane that came back with
fewer entries than asked for has nothing waiting, and owes nothing until it is read again.

Pure bookkeeping: :meth:`inferq.queue.consumer.Consumer.read` asks :meth:`LaneShare.plan` which lanes to read for its
free slots, reads them lane by lane, and reports what each gave with :meth:`LaneShare.record`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inferq.queue.jobs import LANES, Priority

SHARE_EVERY = 10
"""A waiting lane below ``high`` gets at least one take in every this many."""

SHARED = (Priority.LOW, Priority.NORMAL)
"""The lanes with a guaranteed share, in the order their owed takes are read (the lowest first)."""


@dataclass
class LaneShare:
    every: int = SHARE_EVERY
    waited: dict[Priority, int] = field(default_factory=lambda: {Priority.LOW: 0, Priority.NORMAL: 1})
    """Per shared lane: takes of other lanes since its own last take, while it had (as far as known) entries.
    ``normal`` starts one take ahead, so that the two shares do not fall due on the same take (one of them would
    slip by one)."""

    def plan(self, count: int) -> list[tuple[Priority, int | None]]:
        """The reads for ``count`` free slots, in order: first the takes owed to the shared lanes within these
        ``count`` takes (lowest lane first), then every lane in priority order; ``None`` asks for every slot
        still free."""
        owed: list[tuple[Priority, int | None]] = []
        left = count
        for lane in SHARED:
            n = min(left, (self.waited[lane] + count) // self.every)
            if n > 0:
                owed.append((lane, n))
                left -= n
        return owed + [(lane, None) for lane in LANES]

    def record(self, taken: Mapping[Priority, int], short: set[Priority]) -> None:
        """What one read took per lane, and which lanes came back with fewer entries than asked (empty now).
        A lane's takes count as the first of the read: conservative for the lane's share."""
        total = sum(taken.values())
        for lane in SHARED:
            mine = taken.get(lane, 0)
            if lane in short:
                self.waited[lane] = 0
            elif mine:
                self.waited[lane] = total - mine
            else:
                self.waited[lane] += total
