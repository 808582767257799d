"""``inferq submit --stream``: a job's answer printed as it is made (its output stream, ``Client.stream``), then how
the job ended."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from .common import print_job

if TYPE_CHECKING:
    from inferq.client import Client, Job


def print_stream(client: Client, job: Job, args: argparse.Namespace, started: float) -> int:
    """Print the job's answer as it is made (its output stream), then how it ended."""
    print(job.id, file=sys.stderr)
    output = client.stream(job.id, timeout=max(0.0, args.timeout - (time.monotonic() - started)))
    wrote = False
    for piece in output:
        sys.stdout.write(piece)
        sys.stdout.flush()
        wrote = True
    if wrote:
        print()
    if not output.done:
        print(f"{job.id} still {output.status or 'running'} after {args.timeout:g}s", file=sys.stderr)
        return 1
    ended = client.get(job.id)
    if ended.status.value != "succeeded":
        print_job(ended, args.json, time.monotonic() - started)
        return 1
    print(f"{job.id} succeeded after {time.monotonic() - started:.2f}s", file=sys.stderr)
    return 0
