"""The daily usage export (docs/operations.md, "Usage and chargeback"): one JSON Lines object per UTC day under
``usage/`` in the files bucket, a line per hour, tenant, model and lane, flat columns for Athena. The object of a
day is a function of the buckets it reads, written whole each time: a rerun, or a later export of the same day,
rewrites the same object (idempotent)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime

from inferq.usage.report import STATUSES, Row

PREFIX = "usage/"


def day_key(day_start_s: int) -> str:
    """``usage/date=2025-12-06/usage.jsonl``: one object per day, a Hive-style partition for Athena."""
    return f"{PREFIX}date={datetime.fromtimestamp(day_start_s, UTC):%Y-%m-%d}/usage.jsonl"


def line(row: Row) -> dict[str, object]:
    """One row of one hour (``row.start``) as the export's columns."""
    assert row.start is not None, "the export is per hour"
    out: dict[str, object] = {
        "hour": datetime.fromtimestamp(row.start, UTC).strftime("%Y-%m-%dT%H:00:00Z"),
        "tenant": row.tenant,
        "model": row.model,
        "lane": row.lane,
    }
    out.update({f"jobs_{status}": count for status, count in zip(STATUSES, row.jobs, strict=True)})
    out.update({
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "run_seconds": round(row.run_ms / 1000, 3),
        "gpu_seconds": round(row.gpu_ms / 1000, 3),
        "estimated_cost_usd": round(row.cost_usd, 6),
    })
    return out


def jsonl(rows: Iterable[Row]) -> bytes:
    """The day's object: the rows of its hours in order (hour, tenant, model, lane), one JSON object a line."""
    ordered = sorted(rows, key=lambda r: (r.start or 0, r.tenant, r.model, r.lane))
    return b"".join(json.dumps(line(r), separators=(",", ":")).encode() + b"\n" for r in ordered)
