"""The queue's recent history, kept in Redis with a bounded size: what the console draws its charts from.

The scaler appends one sample per evaluation (at most one every :data:`SAMPLE_EVERY_S`, so the capped list spans
``HISTORY_SAMPLES * SAMPLE_EVERY_S`` = an hour whatever the scaler's cadence) to ``inferq:{Q}:history``: the
time, the cumulative terminal counters of ``inferq:{Q}:stats`` and the gauges the scaler observed. Rates are the
reader's business (differences of consecutive samples), so a lost or repeated sample costs nothing but
resolution. Numbers only, summed over every tenant: nothing here names a job or a tenant.
"""

from __future__ import annotations

import json
import time
from typing import Any

from inferq.queue.protocol import Observation, Queue

HISTORY_SAMPLES = 720
SAMPLE_EVERY_S = 5.0
COUNTERS = ("enqueued", "succeeded", "failed", "cancelled", "expired", "latency_ms_total")
"""Cumulative counters of ``inferq:{Q}:stats`` copied into each sample (absent ones as 0; ``latency_ms_total`` is
the sum over terminal jobs of finished_at - created_at, in ms: a reader divides its growth by the terminal jobs of
the same interval, and an interval in which none ended has no latency, not a latency of zero)."""


def sample(stats: dict[str, int], observation: Observation, *, at: float, desired: int | None,
           running: int | None) -> dict[str, Any]:
    counters = {name: int(stats.get(name, 0)) for name in COUNTERS}
    return {
        "at": round(at, 3),
        **counters,
        "lag": observation.lag,
        "pending": observation.pending,
        "delayed": observation.delayed,
        "unfinished": observation.unfinished,
        "dlq": observation.dlq,
        "workers": observation.workers,
        "desired": desired,
        "running": running,
    }


async def record_sample(queue: Queue, observation: Observation, *, desired: int | None, running: int | None,
                        at: float | None = None) -> bool:
    """Append one sample unless the newest is younger than :data:`SAMPLE_EVERY_S`; True when one was appended."""
    at = time.time() if at is None else at
    key = queue.keys.history
    newest = await queue.redis.lindex(key, 0)
    if newest is not None:
        try:
            if at - float(json.loads(newest)["at"]) < SAMPLE_EVERY_S - 0.5:
                return False
        except (ValueError, KeyError, TypeError):
            pass  # an unreadable head is overwritten history, not a reason to stop sampling
    stats = await queue.stats()
    pipe = queue.redis.pipeline(transaction=True)  # one key: MULTI/EXEC is cluster-safe
    pipe.lpush(key, json.dumps(sample(stats, observation, at=at, desired=desired, running=running)))
    pipe.ltrim(key, 0, HISTORY_SAMPLES - 1)
    await pipe.execute()
    return True


async def read_history(queue: Queue, limit: int = HISTORY_SAMPLES) -> list[dict[str, Any]]:
    """The newest ``limit`` samples, oldest first (what a chart's x axis wants)."""
    raw = await queue.redis.lrange(queue.keys.history, 0, max(0, limit - 1))
    samples: list[dict[str, Any]] = []
    for item in reversed(raw):
        try:
            value = json.loads(item)
        except ValueError:
            continue
        if isinstance(value, dict):
            samples.append(value)
    return samples
