"""Bulk submission from a JSONL file (``inferq submit --file``): read every line, submit with bounded concurrency
and a progress bar on stderr, then, when asked, wait for every job.

Each line is one ``POST /v1/jobs`` body (an OpenAI Batch API line works as is). A line without an idempotency key
gets one derived from its number and its text, so the same file submitted again (after an interruption) creates
no job twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from inferq.client import AsyncClient, InferqError

FILE_FIELDS = ("url", "metadata", "timeout_s", "ttl_s", "webhook_url", "priority")
JobLine = tuple[int, dict[str, Any], str]
"""(line number, request, idempotency key)"""


class BadJobFile(ValueError):
    """A line that is not a job; raised before anything is sent."""


def read_jobs(path: Path) -> list[JobLine]:
    """Every non-blank line of ``path`` (``-``: stdin) as a job."""
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    jobs: list[JobLine] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            raise BadJobFile(f"{path}:{number}: not JSON ({exc})") from None
        if not isinstance(request, dict) or not isinstance(request.get("body"), dict):
            raise BadJobFile(f"{path}:{number}: each line needs a \"body\" object (the model server's request)")
        digest = hashlib.sha256(f"{number}\n{line.strip()}".encode()).hexdigest()[:40]
        jobs.append((number, request, request.get("idempotency_key") or f"file-{digest}"))
    return jobs


def _error(exc: InferqError) -> dict[str, Any]:
    return {"status": exc.status, "type": exc.type, "message": exc.message}


async def submit_all(client: AsyncClient, jobs: list[JobLine], *, concurrency: int, wait: bool,
                     wait_s: float) -> list[dict[str, Any]]:
    """One result per line, in file order: ``line``, ``custom_id`` when the line has one, then ``id`` and
    ``status`` (with ``wait``: the final status and the whole ``job``, waiting ``wait_s`` at most), or ``error``."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    results: list[dict[str, Any]] = [
        {"line": number, **({"custom_id": req["custom_id"]} if "custom_id" in req else {})} for number, req, _ in jobs
    ]
    gate = asyncio.Semaphore(concurrency)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                        console=Console(stderr=True))
    with progress:
        sent = progress.add_task("submitting", total=len(jobs))

        async def one(index: int, request: dict[str, Any], key: str) -> None:
            fields = {name: request.get(name) for name in FILE_FIELDS}
            try:
                async with gate:
                    job = await client.submit(request["body"], idempotency_key=key, **fields)
                results[index].update(id=job.id, status=job.status.value)
            except InferqError as exc:
                results[index]["error"] = _error(exc)
            progress.advance(sent)

        await asyncio.gather(*(one(i, request, key) for i, (_, request, key) in enumerate(jobs)))
        if not wait:
            return results
        accepted = [r for r in results if "id" in r]
        ended = progress.add_task("waiting", total=len(accepted))
        deadline = time.monotonic() + wait_s

        async def finish(result: dict[str, Any]) -> None:
            try:
                async with gate:
                    job = await client.wait(result["id"], timeout=max(0.0, deadline - time.monotonic()))
                result.update(status=job.status.value, job=job.raw)
            except InferqError as exc:
                result["error"] = _error(exc)
            progress.advance(ended)

        await asyncio.gather(*(finish(r) for r in accepted))
    return results
