"""The ``inferq`` command: ``up`` (the emulator), ``submit`` and ``status`` (HTTP clients of a running gateway).

Imports stay inside the commands: ``inferq up`` must not pay for httpx or rich, and the clients not for the
emulator. ``submit`` and ``status`` find the gateway and the key the way a person would expect after ``make up``:
``--url``/``--api-key``, else ``INFERQ_URL``/``INFERQ_API_KEY``, else what ``inferq up`` left in ``--data-dir``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

USAGE = """usage: inferq {up,submit,status} [options]

  up       run the whole stack on this machine (gateway, Valkey, scaler, workers)
  submit   submit a job: inferq submit "text" [--wait]
  status   live view of the queue and the fleet: lag, pending, desired, workers, recent jobs

inferq COMMAND --help for a command's options"""

DEFAULT_URL = "http://127.0.0.1:8080"
RECENT_FILE = "recent-jobs"
RECENT_KEEP = 50
TERMINAL = {"succeeded", "failed", "cancelled", "expired"}


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit status 1."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "up":
        from emulator.up import main as up

        return up(rest)
    commands = {"submit": submit, "status": status}
    if command not in commands:
        print(f"inferq: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return commands[command](rest)
    except CliError as exc:
        print(f"inferq {command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# ---------------------------------------------------------------------- shared client plumbing


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


def _client(args: argparse.Namespace, timeout: float = 10.0) -> Any:
    import httpx

    return httpx.Client(
        base_url=_base_url(args), headers={"Authorization": f"Bearer {_api_key(args)}"}, timeout=timeout
    )


def _call(client: Any, method: str, path: str, **kwargs: Any) -> Any:
    """One request; a transport failure or an error envelope becomes a CliError naming the gateway's words."""
    import httpx

    try:
        response = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach the gateway at {client.base_url}: {exc} (is `inferq up` running?)") from None
    if response.status_code >= 400:
        try:
            error = response.json()["error"]
            detail = f"{error['type']}: {error['message']}"
        except (ValueError, KeyError, TypeError):
            detail = response.text[:200]
        raise CliError(f"{method} {path} answered {response.status_code} ({detail})")
    return response.json()


def _remember(data_dir: Path, job_id: str) -> None:
    """Keep the ids this client submitted: the API lists no jobs, so ``status`` shows these."""
    path = data_dir / RECENT_FILE
    try:
        known = path.read_text().split() if path.exists() else []
        known = [*[j for j in known if j != job_id][-(RECENT_KEEP - 1):], job_id]
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(known) + "\n")
    except OSError:
        pass


def _answer_text(job: dict[str, Any]) -> str:
    body = (job.get("result") or {}).get("body") or {}
    try:
        choice = body["choices"][0]
        return str(choice.get("message", {}).get("content") if "message" in choice else choice.get("text"))
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""


# ---------------------------------------------------------------------- inferq submit


def submit(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="inferq submit", description="Submit one chat completion job.")
    parser.add_argument("text", help="the user message")
    parser.add_argument("--wait", action="store_true", help="wait for the job to end and print the answer")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds --wait waits at most (300)")
    parser.add_argument("--model", default="mock", help="body.model (default mock)")
    parser.add_argument("--max-tokens", type=int, help="body.max_tokens")
    parser.add_argument("--completions", action="store_true", help="use /v1/completions with a prompt")
    parser.add_argument("--idempotency-key", help="same key, same job")
    parser.add_argument("--json", action="store_true", help="print the job object as JSON")
    _client_args(parser)
    args = parser.parse_args(argv)

    body: dict[str, Any] = {"model": args.model}
    if args.completions:
        body["prompt"] = args.text
    else:
        body["messages"] = [{"role": "user", "content": args.text}]
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens
    request: dict[str, Any] = {"body": body}
    if args.completions:
        request["url"] = "/v1/completions"
    if args.idempotency_key:
        request["idempotency_key"] = args.idempotency_key

    started = time.monotonic()
    with _client(args, timeout=30.0) as client:
        job = _call(client, "POST", "/v1/jobs", json=request)
        _remember(args.data_dir, job["id"])
        if not args.wait:
            _print_job(job, args.json, None)
            return 0
        deadline = started + args.timeout
        while job["status"] not in TERMINAL:
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"{job['id']} still {job['status']} after {args.timeout:g}s", file=sys.stderr)
                return 1
            wait = max(1, min(20, int(left)))
            job = _call(client, "GET", f"/v1/jobs/{job['id']}", params={"wait": wait})
    _print_job(job, args.json, time.monotonic() - started)
    return 0 if job["status"] == "succeeded" else 1


def _print_job(job: dict[str, Any], as_json: bool, took: float | None) -> None:
    if as_json:
        import json

        print(json.dumps(job, indent=2))
        return
    after = f" after {took:.2f}s" if took is not None else ""
    print(f"{job['id']} {job['status']}{after}")
    if job["status"] == "succeeded":
        print(_answer_text(job))
    elif job.get("error"):
        print(f"{job['error'].get('type')}: {job['error'].get('message')}")


# ---------------------------------------------------------------------- inferq status


def status(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="inferq status", description="Live view of the queue and the fleet.")
    parser.add_argument("--interval", type=float, default=1.0, help="refresh period in seconds (1)")
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--jobs", type=int, default=10, help="recent jobs shown (10)")
    _client_args(parser)
    args = parser.parse_args(argv)

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


def _status_view(client: Any, args: argparse.Namespace) -> Any:
    from rich.console import Group
    from rich.table import Table

    try:
        scale = _call(client, "GET", "/v1/scale")
    except CliError as exc:
        return Group(f"[red]{exc}[/red]")
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

    jobs = Table(title="recent jobs (submitted with inferq submit)", title_justify="left")
    for column in ("id", "status", "attempts", "age", "answer / error"):
        jobs.add_column(column)
    recent = (_read(args.data_dir / RECENT_FILE) or "").split()[-args.jobs:]
    colours = {"succeeded": "green", "failed": "red", "running": "yellow", "queued": "cyan"}
    for job_id in reversed(recent):
        try:
            job = _call(client, "GET", f"/v1/jobs/{job_id}")
        except CliError:
            continue  # expired from Redis, or another key's job
        state = job["status"]
        detail = _answer_text(job) if state == "succeeded" else (job.get("error") or {}).get("message", "")
        age = f"{time.time() - float(job['created_at']):.0f}s" if job.get("created_at") else "-"
        jobs.add_row(job_id, f"[{colours.get(state, 'white')}]{state}[/]", str(job.get("attempts", "")), age,
                     (detail or "")[:60])
    return Group(fleet, jobs)


if __name__ == "__main__":
    raise SystemExit(main())
