"""The periods usage is kept in: hourly buckets (``inferq:{Q}:usage:<YYYY-MM-DDTHH>``, kept
``INFERQ_USAGE_RETENTION_DAYS``), and each tenant's totals of the calendar month through its last settled hour
(``inferq:{Q}:usage:month:<YYYY-MM>``, what budgets are checked against, kept by the scaler), in UTC. A script that may
end a job takes the bucket of its ``now`` and when it expires (:func:`meter_args`): the key comes in through
``KEYS``, computed here from the same clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

HOUR_S = 3600
DAY_S = 86400
MONTH_KEEP_S = 7 * DAY_S
"""A month's totals are kept a week into the next month (the last day's export and budget warnings read them)."""


def hour_start(unix_s: float) -> int:
    """The start of the UTC hour ``unix_s`` falls in (unix seconds)."""
    return int(unix_s // HOUR_S) * HOUR_S


def hour_label(start_s: int) -> str:
    """The hour's part of its key: ``2025-12-06T14`` (UTC)."""
    return datetime.fromtimestamp(start_s, UTC).strftime("%Y-%m-%dT%H")


def month_label(unix_s: float) -> str:
    """The month's part of its key: ``2025-12`` (UTC)."""
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m")


def month_start(unix_s: float) -> int:
    moment = datetime.fromtimestamp(unix_s, UTC)
    return int(datetime(moment.year, moment.month, 1, tzinfo=UTC).timestamp())


def next_month_start(unix_s: float) -> int:
    moment = datetime.fromtimestamp(unix_s, UTC)
    first = datetime(moment.year, moment.month, 1, tzinfo=UTC) + timedelta(days=32)
    return int(datetime(first.year, first.month, 1, tzinfo=UTC).timestamp())


def hours(start_s: float, end_s: float) -> list[int]:
    """The starts of the hours that ``[start_s, end_s)`` touches, oldest first."""
    first, last = hour_start(start_s), hour_start(max(start_s, end_s - 1e-6))
    return list(range(first, last + HOUR_S, HOUR_S))


def meter_args(now_ms: int, retention_days: int) -> tuple[str, int]:
    """For a script that may end a job at ``now_ms``: the label of its hour, and when the hour's bucket expires (unix
    seconds; 0 with ``retention_days`` 0, metering off: the scripts write nothing)."""
    start = hour_start(now_ms / 1000)
    return hour_label(start), (start + HOUR_S + retention_days * DAY_S if retention_days > 0 else 0)
