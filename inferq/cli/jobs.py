"""``inferq submit``, ``wait``, ``cancel``, ``redrive`` and ``dlq``: jobs through the gateway's API."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import CliError, api_key, base_url, client, client_args, exit_code, print_job, remember


def submit(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="inferq submit", description="Submit one chat completion job, or every line of a JSONL file."
    )
    parser.add_argument("text", nargs="?", help="the user message")
    parser.add_argument("--file", type=Path, help="JSONL: one POST /v1/jobs body (or OpenAI Batch line) per line; "
                        "'-' reads stdin. Re-running the same file submits nothing twice")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight with --file (16)")
    parser.add_argument("--wait", action="store_true", help="wait for the jobs to end and print them")
    parser.add_argument("--stream", action="store_true", help="print the answer as it is made, then how the job ended")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds --wait (or --stream) waits at most (300)")
    parser.add_argument("--model", default="mock", help="body.model (default mock)")
    parser.add_argument("--max-tokens", type=int, help="body.max_tokens")
    parser.add_argument("--completions", action="store_true", help="use /v1/completions with a prompt")
    parser.add_argument("--idempotency-key", help="same key, same job")
    parser.add_argument("--json", action="store_true", help="print the job object as JSON")
    client_args(parser)
    args = parser.parse_args(argv)
    if (args.text is None) == (args.file is None):
        parser.error("give either the text of one job or --file")
    if args.file is not None and args.stream:
        parser.error("--stream prints one job's answer: give the text of one job")
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
    with client(args) as gateway:
        job = gateway.submit(body, url="/v1/completions" if args.completions else None,
                            idempotency_key=args.idempotency_key)
        remember(args.data_dir, [job.id])
        if args.stream:
            from .streaming import print_stream

            return print_stream(gateway, job, args, started)
        if not args.wait:
            print_job(job, args.json)
            return 0
        job = gateway.wait(job.id, timeout=max(0.0, args.timeout - (time.monotonic() - started)))
    if not job.terminal:
        print(f"{job.id} still {job.status.value} after {args.timeout:g}s", file=sys.stderr)
        return 1
    print_job(job, args.json, time.monotonic() - started)
    return exit_code([job])


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
        async with AsyncClient(base_url(args), api_key(args), max_connections=concurrency) as client:
            return await submit_all(client, lines, concurrency=concurrency, wait=args.wait, wait_s=args.timeout)

    results = asyncio.run(run())
    failed = [r for r in results if "error" in r]
    for result in results:
        print(json.dumps(result))
    remember(args.data_dir, [r["id"] for r in results if "id" in r])
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
    client_args(parser)
    return parser


def wait(argv: list[str]) -> int:
    parser = _ids_command("inferq wait", "Wait for jobs to end (long-poll) and print them.", lambda p: p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait at most, for all of them (300)"))
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    jobs = []
    with client(args) as gateway:
        for job_id in args.ids:
            job = gateway.wait(job_id, timeout=max(0.0, deadline - time.monotonic()))
            print_job(job, args.json)
            jobs.append(job)
    if any(not job.terminal for job in jobs):
        print(f"inferq wait: not every job ended within {args.timeout:g}s", file=sys.stderr)
    return exit_code(jobs)


def cancel(argv: list[str]) -> int:
    from inferq.client import JobTerminal

    args = _ids_command("inferq cancel", "Cancel queued or running jobs.").parse_args(argv)
    code = 0
    with client(args) as gateway:
        for job_id in args.ids:
            try:
                print_job(gateway.cancel(job_id), args.json)
            except JobTerminal as exc:
                print(f"{job_id}: already {exc.job.status.value if exc.job else 'ended'}", file=sys.stderr)
                code = 1
    return code


def redrive(argv: list[str]) -> int:
    args = _ids_command("inferq redrive", "Queue dead-lettered jobs again, attempts reset.").parse_args(argv)
    with client(args) as gateway:
        for job_id in args.ids:
            print_job(gateway.redrive(job_id), args.json)
    return 0


def dlq(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="inferq dlq", description="Your dead-lettered jobs, newest first.")
    parser.add_argument("--limit", type=int, default=20, help="at most this many (20, up to 1000)")
    parser.add_argument("--json", action="store_true", help="print the job objects as JSON lines")
    client_args(parser)
    args = parser.parse_args(argv)
    with client(args) as gateway:
        jobs = gateway.dlq(limit=args.limit)
    for job in jobs:
        if args.json:
            print(json.dumps(job.raw))
        else:
            error = job.error or {}
            print(f"{job.id} attempts={job.attempts} {error.get('type', '')}: {error.get('message', '')}")
    if not args.json:
        print(f"{len(jobs)} dead-lettered job(s)", file=sys.stderr)
    return 0
