"""The results feed (``GET /v1/events``, docs/api.md): a tenant's terminal jobs in the order they ended.

Read from the queue's terminal events stream (``inferq:{Q}:events``), which every terminal transition appends to
(``job``, ``status``, ``tenant``) and which all tenants share. The cursor is the id of the last entry a call looked
at, so the feed needs no state of its own and survives any restart; each call scans at most ``SCAN_MAX`` entries
(other tenants' included) and says ``has_more`` when it stopped early. Retention: the stream's length cap and the
result TTL (older entries are skipped; a job whose record has expired is left out).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from .jobs import Job
from .queue import Queue

SCAN_MAX = 2000
"""Events stream entries one read looks at, whoever's they are."""
CURSOR_RE = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")


@dataclass(frozen=True)
class Page:
    jobs: list[Job]
    cursor: str
    has_more: bool


def _later(a: str, b: str) -> str:
    """The later of two stream ids."""
    ma, sa = (int(x) for x in a.split("-"))
    mb, sb = (int(x) for x in b.split("-"))
    return a if (ma, sa) >= (mb, sb) else b


async def read(queue: Queue, tenant: str, after: str | None, limit: int, wait_s: float = 0.0) -> Page:
    """Up to ``limit`` of the tenant's terminal jobs that ended after the entry ``after``. With ``wait_s``, waits
    (blocking in Redis, in slices shorter than the socket timeout) until one arrives or the time is over."""
    redis = queue.redis
    key = queue.keys.events
    floor = f"{max(0, int(time.time() * 1000) - queue.settings.result_ttl_s * 1000)}-0"
    cursor = _later(after, floor) if after else floor
    deadline = time.monotonic() + wait_s
    slice_s = max(0.1, queue.settings.redis_timeout_s * 0.5)
    while True:
        entries = await redis.xrange(key, min="(" + cursor, max="+", count=SCAN_MAX)
        matched: list[tuple[str, str]] = []
        stopped_early = len(entries) == SCAN_MAX
        for entry_id, fields in entries:
            if fields.get("tenant") == tenant:
                if len(matched) == limit:
                    stopped_early = True
                    break
                matched.append((entry_id, fields.get("job", "")))
            cursor = entry_id
        jobs: list[Job] = []
        if matched:
            pipe = redis.pipeline(transaction=False)
            for _, job_id in matched:
                pipe.hgetall(queue.keys.job(job_id))
            for record in await pipe.execute():
                if record and "status" in record:
                    jobs.append(Job.from_hash(record))
        remaining = deadline - time.monotonic()
        if jobs or stopped_early or remaining <= 0.01:
            return Page(jobs, cursor, stopped_early)
        # nothing for this tenant yet: block until the stream grows past the cursor, then look again
        await redis.xread({key: cursor}, count=1, block=max(1, int(min(remaining, slice_s) * 1000)))
