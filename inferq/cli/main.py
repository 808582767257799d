"""The ``inferq`` command: ``up`` (the emulator) and the HTTP commands, built on :mod:`inferq.client`.

Imports stay inside the commands: ``inferq up`` must not pay for httpx or rich, and the clients not for the
emulator. The HTTP commands find the gateway and the key the way a person would expect after ``make up``:
``--url``/``--api-key``, else ``INFERQ_URL``/``INFERQ_API_KEY``, else what ``inferq up`` left in ``--data-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferq.client import Client, Job

USAGE = """usage: inferq {up,submit,wait,status,cancel,dlq,redrive,usage,interrupt} [options]

  up       run the whole stack on this machine (gateway, Valkey, scaler, workers)
  submit   submit a job: inferq submit "text" [--wait], or many: inferq submit --file jobs.jsonl
  wait     wait for jobs to end and print them: inferq wait ID...
  status   live view of the queue and the fleet; with job ids, print those jobs
  cancel   cancel jobs: inferq cancel ID...
  dlq      list your dead-lettered jobs, newest first
  redrive  queue dead-lettered jobs again: inferq redrive ID...
  usage    your metered usage per model and lane: inferq usage --since 7d [--csv]
  interrupt  interrupt a worker of `inferq up` as EC2 Spot does: inferq interrupt [WORKER]

inferq COMMAND --help for a command's options"""

DEFAULT_URL = "http://127.0.0.1:8080"
RECENT_FILE = "recent-jobs"
RECENT_KEEP = 50


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit status 1."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "up":
        try:
            from emulator.up import main as up
        except ModuleNotFoundError as exc:
            if exc.name not in {"emulator", "functions", "gpu_worker"} and not (exc.name or "").startswith("emulator."):
                raise
            # the wheel holds the client and the CLI only: the stack's code lives in the repository
            print("inferq up: the local stack runs from a clone of the inferq repository (`make up` there): this "
                  "installation has the client and CLI only", file=sys.stderr)
            return 2
        return up(rest)
    if command == "interrupt":
        from .interrupt import InterruptError, interrupt

        try:
            return interrupt(rest)
        except InterruptError as exc:
            print(f"inferq interrupt: {exc}", file=sys.stderr)
            return 1
    from inferq.cli.usage import usage

    commands: dict[str, Callable[[list[str]], int]] = {
        "submit": submit, "wait": wait, "status": status, "cancel": cancel, "dlq": dlq, "redrive": redrive,
        "usage": usage,
    }
    if command not in commands:
        print(f"inferq: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    from inferq.client import GatewayUnreachable, InferqError

    try:
        return commands[command](rest)
    except GatewayUnreachable as exc:
        print(f"inferq {command}: cannot reach the gateway ({exc.message}); is `inferq up` running?",
              file=sys.stderr)
        return 1
    except InferqError as exc:
        print(f"inferq {command}: the gateway answered {exc.status} ({exc.type}: {exc.message})", file=sys.stderr)
        return 1
    except CliError as exc:
        print(f"inferq {command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# ---------------------------------------------------------------------- shared plumbing


def _client_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help=f"gateway base URL (default: $INFERQ_URL, the data dir's, or {DEFAULT_URL})")
    parser.add_argument("--api-key", help="API key (default: $INFERQ_API_KEY, else the data dir's dev key)")
    parser.add_argument("--data-dir", type=Path, default=Path(".inferq"), help="inferq up's data dir (.inferq)")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _base_url(args: argparse.Namespace) -> str:
    url = args.url or os.environ.get("INFERQ_URL") or _read(args.data_dir / "url") or DEFAULT_URL
    return url.rstrip("/")


def _api_key(args: argparse.Namespace) -> str:
    key = args.api_key or os.environ.get("INFERQ_API_KEY") or _read(args.data_dir / "dev-api-key")
    if not key:
        raise CliError(f"no API key: pass --api-key, set INFERQ_API_KEY, or run `inferq up` (it writes "
                       f"{args.data_dir / 'dev-api-key'})")
    return key


def _client(args: argparse.Namespace, timeout: float = 30.0) -> Client:
    from inferq.client import Client

    return Client(_base_url(args), _api_key(args), timeout=timeout)


def _remember(data_dir: Path, job_ids: list[str]) -> None:
    """Keep the ids this client submitted: the API lists no jobs, so ``status`` shows these."""
    path = data_dir / RECENT_FILE
    try:
        known = path.read_text().split() if path.exists() else []
        fresh = set(job_ids)
        known = [*[j for j in known if j not in fresh], *job_ids][-RECENT_KEEP:]
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(known) + "\n")
    except OSError:
        pass


def _print_job(job: Job, as_json: bool, took: float | None = None) -> None:
    if as_json:
        print(json.dumps(job.raw, indent=2))
        return
    after = f" after {took:.2f}s" if took is not None else ""
    dead = " (dead-lettered)" if job.dead_lettered else ""
    print(f"{job.id} {job.status.value}{dead}{after}")
    if job.text is not None:
        print(job.text)
    elif job.error:
        print(f"{job.error.get('type')}: {job.error.get('message')}")


def _exit_code(jobs: list[Job]) -> int:
    return 0 if jobs and all(job.status.value == "succeeded" for job in jobs) else 1


# ---------------------------------------------------------------------- inferq submit


def submit(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="inferq submit", description="Submit one chat completion job, or every line of a JSONL file."
    )
    parser.add_argument("text", nargs="?", help="the user message")
    parser.add_argument("--file", type=Path, help="JSONL: one POST /v1/jobs body (or OpenAI Batch line) per line; "
                        "'-' reads stdin. Re-running the same file submits nothing twice")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight with --file (16)")
    parser.add_argument("--wait", action="store_true", help="wait for the jobs to end and print them")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds --wait waits at most (300)")
    parser.add_argument("--model", default="mock", help="body.model (default mock)")
    parser.add_argument("--max-tokens", type=int, help="body.max_tokens")
    parser.add_argument("--completions", action="store_true", help="use /v1/completions with a prompt")
    parser.add_argument("--idempotency-key", help="same key, same job")
    parser.add_argument("--json", action="store_true", help="print the job object as JSON")
    _client_args(parser)
    args = parser.parse_args(argv)
    if (args.text is None) == (args.file is None):
        parser.error("give either the text of one job or --file")
    if args.file is not None:
        return _submit_file(args)

    body: dict[str, Any] = {"model": args.model}
    if args.completions:
        body["prompt"] = args.text
    else:
        body["messages"] = [{"role": "user", "content": args.text}]
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens

    started = time.monotonic()
    with _client(args) as client:
        job = client.submit(body, url="/v1/completions" if args.completions else None,
                            idempotency_key=args.idempotency_key)
        _remember(args.data_dir, [job.id])
        if not args.wait:
            _print_job(job, args.json)
            return 0
        job = client.wait(job.id, timeout=max(0.0, args.timeout - (time.monotonic() - started)))
    if not job.terminal:
        print(f"{job.id} still {job.status.value} after {args.timeout:g}s", file=sys.stderr)
        return 1
    _print_job(job, args.json, time.monotonic() - started)
    return _exit_code([job])


def _submit_file(args: argparse.Namespace) -> int:
    import asyncio

    from inferq.client import AsyncClient

    from .bulk import BadJobFile, read_jobs, submit_all

    try:
        lines = read_jobs(args.file)
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc}") from None
    except BadJobFile as exc:
        raise CliError(str(exc)) from None
    if not lines:
        raise CliError(f"{args.file} has no jobs")

    async def run() -> list[dict[str, Any]]:
        concurrency = max(1, args.concurrency)
        async with AsyncClient(_base_url(args), _api_key(args), max_connections=concurrency) as client:
            return await submit_all(client, lines, concurrency=concurrency, wait=args.wait, wait_s=args.timeout)

    results = asyncio.run(run())
    failed = [r for r in results if "error" in r]
    for result in results:
        print(json.dumps(result))
    _remember(args.data_dir, [r["id"] for r in results if "id" in r])
    print(f"inferq submit: {len(results) - len(failed)} of {len(results)} jobs accepted", file=sys.stderr)
    if failed:
        return 1
    return 0 if not args.wait else int(any(r.get("status") != "succeeded" for r in results))


# ---------------------------------------------------------------------- inferq wait, cancel, redrive, dlq


def _ids_command(prog: str, description: str, extra: Callable[[argparse.ArgumentParser], Any] | None = None
                 ) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("ids", nargs="+", metavar="ID", help="job ids")
    parser.add_argument("--json", action="store_true", help="print the job objects as JSON")
    if extra is not None:
        extra(parser)
    _client_args(parser)
    return parser


def wait(argv: list[str]) -> int:
    parser = _ids_command("inferq wait", "Wait for jobs to end (long-poll) and print them.", lambda p: p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait at most, for all of them (300)"))
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    jobs = []
    with _client(args) as client:
        for job_id in args.ids:
            job = client.wait(job_id, timeout=max(0.0, deadline - time.monotonic()))
            _print_job(job, args.json)
            jobs.append(job)
    if any(not job.terminal for job in jobs):
        print(f"inferq wait: not every job ended within {args.timeout:g}s", file=sys.stderr)
    return _exit_code(jobs)


def cancel(argv: list[str]) -> int:
    from inferq.client import JobTerminal

    args = _ids_command("inferq cancel", "Cancel queued or running jobs.").parse_args(argv)
    code = 0
    with _client(args) as client:
        for job_id in args.ids:
            try:
                _print_job(client.cancel(job_id), args.json)
            except JobTerminal as exc:
                print(f"{job_id}: already {exc.job.status.value if exc.job else 'ended'}", file=sys.stderr)
                code = 1
    return code


def redrive(argv: list[str]) -> int:
    args = _ids_command("inferq redrive", "Queue dead-lettered jobs again, attempts reset.").parse_args(argv)
    with _client(args) as client:
        for job_id in args.ids:
            _print_job(client.redrive(job_id), args.json)
    return 0


def dlq(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="inferq dlq", description="Your dead-lettered jobs, newest first.")
    parser.add_argument("--limit", type=int, default=20, help="at most this many (20, up to 1000)")
    parser.add_argument("--json", action="store_true", help="print the job objects as JSON lines")
    _client_args(parser)
    args = parser.parse_args(argv)
    with _client(args) as client:
        jobs = client.dlq(limit=args.limit)
    for job in jobs:
        if args.json:
            print(json.dumps(job.raw))
        else:
            error = job.error or {}
            print(f"{job.id} attempts={job.attempts} {error.get('type', '')}: {error.get('message', '')}")
    if not args.json:
        print(f"{len(jobs)} dead-lettered job(s)", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------- inferq status


def status(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="inferq status", description="Live view of the queue and the fleet; "
                                     "with job ids, print those jobs.")
    parser.add_argument("ids", nargs="*", metavar="ID", help="job ids to print instead of the live view")
    parser.add_argument("--interval", type=float, default=1.0, help="refresh period in seconds (1)")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--jobs", type=int, default=10, help="recent jobs shown (10)")
    parser.add_argument("--json", action="store_true", help="with ids: print the job objects as JSON")
    _client_args(parser)
    args = parser.parse_args(argv)

    if args.ids:
        with _client(args) as client:
            for job_id in args.ids:
                _print_job(client.get(job_id), args.json)
        return 0

    from rich.console import Console

    console = Console()
    with _client(args, timeout=5.0) as client:
        if args.once:
            console.print(_status_view(client, args))
            return 0
        if not console.is_terminal:  # piped: one snapshot per interval instead of redrawing in place
            while True:
                console.print(_status_view(client, args))
                time.sleep(args.interval)
        from rich.live import Live

        try:
            with Live(_status_view(client, args), console=console, refresh_per_second=4, screen=False) as live:
                while True:
                    time.sleep(args.interval)
                    live.update(_status_view(client, args))
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
    recent = (_read(args.data_dir / RECENT_FILE) or "").split()[-args.jobs:]
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


if __name__ == "__main__":
    raise SystemExit(main())
