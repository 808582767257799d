"""``inferq usage``: the tenant's metered usage (``GET /v1/usage``) as a table, or CSV for a spreadsheet.

    inferq usage --since 7d                 # the last 7 days, one row per model and lane, and the total
    inferq usage --since 2025-11-01 --until 2025-12-01 --csv > november.csv
    inferq usage --tenant '*' --since 30d   # every tenant's (an operator's key), with the estimated cost

The gateway and key are found as by the other commands: ``--url``/``--api-key``, else ``INFERQ_URL``/
``INFERQ_API_KEY``, else what ``inferq up`` left in ``--data-dir``.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_SPAN = re.compile(r"^(\d+)([mhdw])$")
_SPAN_S = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
COLUMNS = ("succeeded", "failed", "cancelled", "expired", "prompt_tokens", "completion_tokens", "run_seconds",
           "gpu_seconds")


def moment(text: str, now: float) -> int:
    """Unix seconds of ``7d`` (that long ago), ``2025-11-01`` / ``2025-11-01T12:00`` (UTC unless it says) or a
    number of Unix seconds."""
    span = _SPAN.match(text)
    if span:
        return int(now - int(span.group(1)) * _SPAN_S[span.group(2)])
    if text.isdigit():
        return int(text)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give 30m, 12h, 7d, 2w, a date (2025-11-01), a time "
                                         "(2025-11-01T12:00) or Unix seconds") from None
    return int((parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp())


def flat(row: dict[str, Any]) -> dict[str, Any]:
    """A row of the usage object with its job counts as columns of their own."""
    out = {k: v for k, v in row.items() if k != "jobs"}
    out.update(row.get("jobs") or {})
    return out


def total(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {name: sum(r.get(name) or 0 for r in rows) for name in COLUMNS}
    if any("estimated_cost_usd" in r for r in rows):
        out["estimated_cost_usd"] = sum(r.get("estimated_cost_usd") or 0 for r in rows)
    return out


def write_csv(rows: list[dict[str, Any]], out: Any) -> None:
    names = [n for n in ("tenant", "start", "model", "lane", *COLUMNS, "estimated_cost_usd",
                         "usd_per_million_tokens") if any(n in r for r in rows)] or ["model", "lane", *COLUMNS]
    writer = csv.DictWriter(out, fieldnames=names, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.3f}"


def table(answer: dict[str, Any], rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    span = f"{datetime.fromtimestamp(answer['start'], UTC):%Y-%m-%d %H:%M} to " \
           f"{datetime.fromtimestamp(answer['end'], UTC):%Y-%m-%d %H:%M} UTC"
    view = Table(title=f"usage of {answer['tenant']}, {span}", title_justify="left")
    by_tenant = any("tenant" in r for r in rows)
    priced = any("estimated_cost_usd" in r for r in rows)
    for name in (["tenant"] if by_tenant else []) + ["model", "lane"]:
        view.add_column(name)
    for name in ("ok", "failed", "cancelled", "expired", "prompt tokens", "completion tokens", "run hours",
                 "GPU hours") + (("est. USD",) if priced else ()):
        view.add_column(name, justify="right")

    def cells(row: dict[str, Any]) -> list[str]:
        out = [f"{row.get(n, 0):,}" for n in COLUMNS[:6]] + [_hours(row["run_seconds"]), _hours(row["gpu_seconds"])]
        return out + ([f"{row.get('estimated_cost_usd', 0):,.2f}"] if priced else [])

    for row in rows:
        view.add_row(*([row["tenant"]] if by_tenant else []), row["model"], row["lane"], *cells(row))
    if len(rows) > 1:
        view.add_section()
        view.add_row(*([""] if by_tenant else []), "total", "", *cells(total(rows)), style="bold")
    return view


def usage(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="inferq usage", description="Your metered usage per model and lane "
                                     "(jobs, tokens, run and GPU time), for chargeback.")
    parser.add_argument("--since", default="24h", help="from: 30m, 12h, 7d, 2w, a date, a time or Unix seconds "
                        "(24h); whole UTC hours")
    parser.add_argument("--until", help="to (exclusive), as --since (default: now)")
    parser.add_argument("--tenant", help="operators: another tenant's usage, or '*' for every tenant's")
    parser.add_argument("--by", choices=("hour", "day"), help="one row per hour or day too")
    parser.add_argument("--csv", action="store_true", help="CSV on stdout (a header, then one line per row)")
    parser.add_argument("--json", action="store_true", help="the usage object as the API answers it")
    parser.add_argument("--url", help="gateway base URL (default: $INFERQ_URL, the data dir's, or the local one)")
    parser.add_argument("--api-key", help="API key (default: $INFERQ_API_KEY, else the data dir's dev key)")
    parser.add_argument("--data-dir", type=Path, default=Path(".inferq"), help="inferq up's data dir (.inferq)")
    args = parser.parse_args(argv)
    now = time.time()
    try:
        start = moment(args.since, now)
        end = moment(args.until, now) if args.until else None
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    from inferq.client import Client

    with Client(args.url, args.api_key, data_dir=args.data_dir) as client:
        answer = client.usage(start, end, tenant=args.tenant, bucket=args.by)
    rows = [flat(r) for r in answer["data"]]
    if args.json:
        print(json.dumps(answer))
    elif args.csv:
        write_csv(rows, sys.stdout)
    else:
        from rich.console import Console

        Console().print(table(answer, rows))
        if not rows:
            print("no job ended in that range", file=sys.stderr)
    return 0
