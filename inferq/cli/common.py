"""What the ``inferq`` commands that call the gateway share: where the gateway and the key are found
(``--url``/``--api-key``, else ``INFERQ_URL``/``INFERQ_API_KEY``, else what ``inferq up`` left in ``--data-dir``),
the client, the jobs this client submitted (``status`` shows them), and how a job is printed."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferq.client import Client, Job

DEFAULT_URL = "http://127.0.0.1:8080"
RECENT_FILE = "recent-jobs"
RECENT_KEEP = 50


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit status 1."""


def client_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help=f"gateway base URL (default: $INFERQ_URL, the data dir's, or {DEFAULT_URL})")
    parser.add_argument("--api-key", help="API key (default: $INFERQ_API_KEY, else the data dir's dev key)")
    parser.add_argument("--data-dir", type=Path, default=Path(".inferq"), help="inferq up's data dir (.inferq)")


def read_file(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def base_url(args: argparse.Namespace) -> str:
    url = args.url or os.environ.get("INFERQ_URL") or read_file(args.data_dir / "url") or DEFAULT_URL
    return url.rstrip("/")


def api_key(args: argparse.Namespace) -> str:
    key = args.api_key or os.environ.get("INFERQ_API_KEY") or read_file(args.data_dir / "dev-api-key")
    if not key:
        raise CliError(f"no API key: pass --api-key, set INFERQ_API_KEY, or run `inferq up` (it writes "
                       f"{args.data_dir / 'dev-api-key'})")
    return key


def client(args: argparse.Namespace, timeout: float = 30.0) -> Client:
    from inferq.client import Client

    return Client(base_url(args), api_key(args), timeout=timeout)


def remember(data_dir: Path, job_ids: list[str]) -> None:
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


def print_job(job: Job, as_json: bool, took: float | None = None) -> None:
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


def exit_code(jobs: list[Job]) -> int:
    return 0 if jobs and all(job.status.value == "succeeded" for job in jobs) else 1
