"""Reading usage back (``GET /v1/usage``, the console, the daily export): the hourly buckets of each queue
(``includes/meter.lua`` writes them) over a range, summed per tenant, model and lane, and priced.

A range covers whole hours: every hour that overlaps ``[start, end)``. A tenant's usage across models is the sum
over the queues (one model each with a registry), which only a reader can do: a script touches one queue's slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferq.queue.keys import Keys
from inferq.usage.periods import DAY_S, hour_label, hours

STATUSES = ("succeeded", "failed", "cancelled", "expired")
READ_CHUNK = 256
"""Hour buckets read per round trip."""


@dataclass(frozen=True)
class Source:
    """One queue's usage: its client and keys, the model its rows belong to (a registry's model; None for the
    single queue, whose rows name the model each job asked for) and its price per GPU-hour."""

    redis: Any
    keys: Keys
    model: str | None
    gpu_hour_usd: float

    def model_of(self, recorded: str) -> str:
        return self.model or recorded or self.keys.queue


@dataclass
class Row:
    """Usage of one tenant, model and lane (and bucket, when asked per hour or day)."""

    tenant: str
    model: str
    lane: str
    start: int | None = None
    jobs: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    prompt_tokens: int = 0
    completion_tokens: int = 0
    run_ms: int = 0
    gpu_ms: int = 0
    cost_usd: float = 0.0

    def add(self, values: Sequence[int], gpu_hour_usd: float) -> None:
        for i in range(4):
            self.jobs[i] += values[i]
        self.prompt_tokens += values[4]
        self.completion_tokens += values[5]
        self.run_ms += values[6]
        self.gpu_ms += values[7]
        self.cost_usd += values[7] / 3_600_000 * gpu_hour_usd

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_api(self, *, with_tenant: bool = False, with_cost: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"tenant": self.tenant} if with_tenant else {}
        if self.start is not None:
            out["start"] = self.start
        out.update({
            "model": self.model,
            "lane": self.lane,
            "jobs": dict(zip(STATUSES, self.jobs, strict=True)),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "run_seconds": round(self.run_ms / 1000, 3),
            "gpu_seconds": round(self.gpu_ms / 1000, 3),
        })
        if with_cost:
            out["estimated_cost_usd"] = round(self.cost_usd, 6)
            out["usd_per_million_tokens"] = round(self.cost_usd / self.tokens * 1e6, 4) if self.tokens else None
        return out


def parse(field_name: str, value: str) -> tuple[str, str, str, list[int]] | None:
    """A bucket's field and value as (tenant, lane, model, the eight numbers); None for a row count (``#tenant``)
    or anything malformed."""
    if field_name.startswith("#"):
        return None
    parts = field_name.split("|", 2)
    numbers = value.split()
    if len(parts) != 3 or len(numbers) != 8 or not all(n.isdigit() for n in numbers):
        return None
    return parts[0], parts[1], parts[2], [int(n) for n in numbers]


async def read_buckets(source: Source, starts: Sequence[int]) -> list[tuple[int, dict[str, str]]]:
    """The buckets of the hours starting at ``starts`` (those that exist), pipelined :data:`READ_CHUNK` at a time."""
    out: list[tuple[int, dict[str, str]]] = []
    for first in range(0, len(starts), READ_CHUNK):
        chunk = starts[first:first + READ_CHUNK]
        pipe = source.redis.pipeline(transaction=False)
        for start in chunk:
            pipe.hgetall(source.keys.usage_hour(hour_label(start)))
        out += [(start, bucket) for start, bucket in zip(chunk, await pipe.execute(), strict=True) if bucket]
    return out


def bucket_of(hour: int, width: str | None) -> int | None:
    if width == "hour":
        return hour
    if width == "day":
        return hour - hour % DAY_S
    return None


async def usage(sources: Iterable[Source], start_s: float, end_s: float, *, tenant: str | None = None,
                width: str | None = None) -> list[Row]:
    """The rows of the range: every tenant's (``tenant`` None) or one tenant's, per model and lane (and per
    ``width``, ``"hour"`` or ``"day"``, when given), each queue's GPU time priced at its own rate; ordered by bucket,
    tenant, model and lane."""
    starts = hours(start_s, end_s)
    rows: dict[tuple[int | None, str, str, str], Row] = {}
    prefix = f"{tenant}|" if tenant is not None else ""
    for source in sources:
        for hour, bucket in await read_buckets(source, starts):
            for name, value in bucket.items():
                if not name.startswith(prefix):
                    continue
                parsed = parse(name, value)
                if parsed is None:
                    continue
                who, lane, recorded, numbers = parsed
                model, at = source.model_of(recorded), bucket_of(hour, width)
                row = rows.get((at, who, model, lane))
                if row is None:
                    row = rows[(at, who, model, lane)] = Row(who, model, lane, at)
                row.add(numbers, source.gpu_hour_usd)
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0] or 0, k[1], k[2], k[3]))]


def totals(rows: Iterable[Row]) -> dict[str, Row]:
    """Per tenant, every model and lane together (the console's table, the export's summary)."""
    out: dict[str, Row] = {}
    for row in rows:
        total = out.get(row.tenant)
        if total is None:
            total = out[row.tenant] = Row(row.tenant, "*", "*")
        total.add([*row.jobs, row.prompt_tokens, row.completion_tokens, row.run_ms, row.gpu_ms], 0.0)
        total.cost_usd += row.cost_usd
    return out
