"""``inferq status``: a live view of the queue and the fleet (``GET /v1/scale``, ``GET /v1/models``) and the jobs
this client submitted; with job ids, those jobs."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from .common import RECENT_FILE, client, client_args, print_job, read_file

if TYPE_CHECKING:
    from inferq.client import Client


def status(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="inferq status", description="Live view of the queue and the fleet; "
                                     "with job ids, print those jobs.")
    parser.add_argument("ids", nargs="*", metavar="ID", help="job ids to print instead of the live view")
    parser.add_argument("--interval", type=float, default=1.0, help="refresh period in seconds (1)")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--jobs", type=int, default=10, help="recent jobs shown (10)")
    parser.add_argument("--json", action="store_true", help="with ids: print the job objects as JSON")
    client_args(parser)
    args = parser.parse_args(argv)

    if args.ids:
        with client(args) as gateway:
            for job_id in args.ids:
                print_job(gateway.get(job_id), args.json)
        return 0

    from rich.console import Console

    console = Console()
    with client(args, timeout=5.0) as gateway:
        if args.once:
            console.print(_status_view(gateway, args))
            return 0
        if not console.is_terminal:  # piped: one snapshot per interval instead of redrawing in place
            while True:
                console.print(_status_view(gateway, args))
                time.sleep(args.interval)
        from rich.live import Live

        try:
            with Live(_status_view(gateway, args), console=console, refresh_per_second=4, screen=False) as live:
                while True:
                    time.sleep(args.interval)
                    live.update(_status_view(gateway, args))
        except KeyboardInterrupt:
            return 0


def _status_view(client: Client, args: argparse.Namespace) -> Any:
    from rich.console import Group
    from rich.table import Table

    from inferq.client import GatewayUnreachable, InferqError, NotFound

    try:
        scale = client.scale()
    except GatewayUnreachable as exc:
        return Group(f"[red]cannot reach the gateway at {client.base_url}: {exc.message}[/red]")
    except InferqError as exc:
        return Group(f"[red]GET /v1/scale answered {exc.status} ({exc.type}: {exc.message})[/red]")
    fleet = Table(title=f"inferq at {client.base_url}", title_justify="left")
    for column in ("lag", "pending", "unfinished", "dlq", "workers", "desired", "last decision"):
        fleet.add_column(column, justify="left" if column == "last decision" else "right")
    decision = scale.get("decision") or {}
    reason = decision.get("reason") or "-"
    if decision.get("at"):
        reason += f" ({time.time() - float(decision['at']):.0f}s ago)"
    desired = scale.get("desired")
    fleet.add_row(*(str(scale.get(k, "-")) for k in ("lag", "pending", "unfinished", "dlq", "workers")),
                  "-" if desired is None else str(desired), reason)

    tables = [fleet]
    try:
        models = client.models()
    except InferqError:
        models = []
    if len(models) > 1:  # a model registry: one fleet per model
        per_model = Table(title="models", title_justify="left")
        for column in ("model", "queue", "lag", "pending", "running", "desired"):
            per_model.add_column(column, justify="left" if column in ("model", "queue") else "right")
        for model in models:
            state = model.get("inferq") or {}
            per_model.add_row(model["id"], *(str("-" if state.get(k) is None else state[k])
                                             for k in ("queue", "lag", "pending", "running", "desired")))
        tables.append(per_model)

    jobs = Table(title="recent jobs (submitted with inferq submit)", title_justify="left")
    for column in ("id", "status", "attempts", "age", "answer / error"):
        jobs.add_column(column)
    recent = (read_file(args.data_dir / RECENT_FILE) or "").split()[-args.jobs:]
    colours = {"succeeded": "green", "failed": "red", "running": "yellow", "queued": "cyan"}
    for job_id in reversed(recent):
        try:
            job = client.get(job_id)
        except (NotFound, GatewayUnreachable):
            continue  # expired from Redis, or another key's job
        state = job.status.value
        detail = job.text if state == "succeeded" else (job.error or {}).get("message", "")
        age = f"{time.time() - job.created_at:.0f}s" if job.created_at else "-"
        jobs.add_row(job_id, f"[{colours.get(state, 'white')}]{state}[/]", str(job.attempts), age,
                     (detail or "")[:60])
    return Group(*tables, jobs)
