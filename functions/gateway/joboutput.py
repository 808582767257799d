"""What the routes that read a job's output share (:mod:`.routers.streams`, :mod:`.routers.completions`): the reader
of a job's output stream for a tenant, and the final text of a job's first choice, from its result (read from S3
where the claim check keeps it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferq.queue.jobs import Job
from inferq.queue.output import OutputReader, first_choice_text

from .jobs import job_id_or_404

if TYPE_CHECKING:
    from .gateway import Gateway


def reader(gw: Gateway, job_id: str, tenant: str) -> OutputReader:
    """The reader of a job's output for ``tenant`` (404 for an id that is not one, or names no queue here)."""
    job_id_or_404(job_id)
    return OutputReader(gw.job_queue(job_id), job_id, tenant, text_of=lambda job: final_text(gw, job))


async def final_text(gw: Gateway, job: Job) -> str | None:
    """The first choice's text of a succeeded job's result, a result held in S3 read from there."""
    result = job.result or {}
    if "body" not in result:
        result = (await gw.claim_check.present(job)).get("result") or {}
    return first_choice_text(result.get("body"))
