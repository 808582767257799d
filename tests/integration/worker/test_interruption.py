"""A worker told to stop (SIGTERM: a scale-in, or ECS draining its Spot instance on the two-minute notice), on real
Valkey with the mock backend: what will end within the drain finishes where it runs, the rest is handed back at
once with its output kept and continued by the next worker, no attempt spent; a job that opted out starts over."""

from __future__ import annotations

import asyncio
import time

from gpu_worker.attempt import Attempt
from gpu_worker.backends.mock import MockBackend
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue import output
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from inferq.usage.report import Source, usage
from tests.support.waiting import eventually_async

from .support import chat, mock_calls, status_is, submit, terminal

LONG = " ".join(f"word{i}" for i in range(24))  # 24 pieces over 4.8 s: 0.2 s each


def held(worker: Worker, job_id: str) -> Attempt | None:
    return next((a for a in worker.held if a.delivery.job.id == job_id), None)


async def making(worker: Worker, job_id: str, seconds: float) -> Attempt:
    """The job's attempt on ``worker`` once it has made output for ``seconds`` (a rate to judge it by)."""

    async def check() -> Attempt | None:
        attempt = held(worker, job_id)
        out = attempt.output if attempt is not None else None
        first = out.first_at if out is not None else None
        return attempt if first is not None and time.monotonic() - first >= seconds else None

    found: Attempt = await eventually_async(check, what=f"job {job_id} to make output")
    return found


async def test_what_ends_in_time_stays_and_the_rest_is_continued_elsewhere_at_once(
    settings: Settings, queue: Queue
) -> None:
    settings = settings.replace(drain_s=2)
    long = await submit(queue, chat(LONG, latency_ms=4800))
    short = await submit(queue, chat("four words end soon", latency_ms=1200))
    first = Worker(settings, queue, MockBackend(queue.redis, queue.keys), worker_id="interrupted")
    running = asyncio.create_task(first.run())
    attempt = await making(first, long.id, 0.8)
    assert attempt.progress() is not None and attempt.progress().left  # type: ignore[union-attr]
    await status_is(queue, short.id, "running")

    first.stop()  # SIGTERM
    handed = await status_is(queue, long.id, "queued", timeout=5)  # back at once: no drain, no claim-idle wait
    assert (handed.attempts, handed.has_output) == (1, True)  # no attempt spent; its output so far kept
    kept = await output.kept(queue, long.id)
    assert kept.text and LONG.startswith(kept.text) and kept.text != LONG
    assert (await terminal(queue, short.id)).status is JobStatus.SUCCEEDED  # ended where it ran, within the drain
    await asyncio.wait_for(running, 30)

    second = Worker(settings, queue, MockBackend(queue.redis, queue.keys), worker_id="replacement")
    again = asyncio.create_task(second.run())
    try:
        done = await terminal(queue, long.id)
    finally:
        second.stop(now=True)
        await asyncio.wait_for(again, 30)
    assert (done.status, done.attempts) == (JobStatus.SUCCEEDED, 1)
    answer = done.result["body"]  # type: ignore[index]
    assert answer["choices"][0]["message"]["content"] == LONG  # whole: the kept text, then the rest
    assert answer["usage"]["completion_tokens"] == 24  # every word once
    assert await mock_calls(queue, long.id) == 2  # continued, not restarted: the second call echoed the rest
    now = time.time()
    [metered] = await usage([Source(queue.redis, queue.keys, None, 1.0)], now - 3600, now + 3600)
    assert metered.jobs[0] == 2  # the long job and the short one, each counted once, when it ended
    assert metered.completion_tokens == 24 + 4 and metered.prompt_tokens == 24 + 4  # the whole, once
    assert metered.run_ms >= 4800  # both attempts of the long job ran: the interrupted one's time counts too


async def test_a_job_whose_end_cannot_be_told_stays_for_the_drain(settings: Settings, queue: Queue) -> None:
    """A request answered whole (several choices) writes no output: nothing says when it ends, so it is kept."""
    job = await submit(queue, {**chat("two choices", latency_ms=1500), "n": 2})
    worker = Worker(settings.replace(drain_s=5), queue, MockBackend(queue.redis, queue.keys))
    running = asyncio.create_task(worker.run())
    await status_is(queue, job.id, "running")
    assert held(worker, job.id) is not None and held(worker, job.id).progress() is None  # type: ignore[union-attr]
    worker.stop()
    assert worker.hand_back_late() == []
    assert (await terminal(queue, job.id)).status is JobStatus.SUCCEEDED
    await asyncio.wait_for(running, 30)


async def test_a_job_that_opted_out_of_continuation_starts_over(settings: Settings, queue: Queue) -> None:
    job = await submit(queue, chat(LONG, latency_ms=2400), continuation=False)
    first = Worker(settings.replace(drain_s=0), queue, MockBackend(queue.redis, queue.keys))
    running = asyncio.create_task(first.run())
    await status_is(queue, job.id, "running")
    assert held(first, job.id).output is None  # type: ignore[union-attr]  # nothing kept to continue after
    first.stop()
    await asyncio.wait_for(running, 30)
    released = await queue.get(job.id)
    assert released is not None and (released.status, released.has_output) == (JobStatus.QUEUED, False)

    second = Worker(settings, queue, MockBackend(queue.redis, queue.keys))
    again = asyncio.create_task(second.run())
    try:
        done = await terminal(queue, job.id)
    finally:
        second.stop(now=True)
        await asyncio.wait_for(again, 30)
    assert (done.status, done.attempts) == (JobStatus.SUCCEEDED, 1)
    assert done.result["body"]["choices"][0]["message"]["content"] == LONG  # type: ignore[index]
    assert await mock_calls(queue, job.id) == 2
