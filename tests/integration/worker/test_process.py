"""``python -m gpu_worker`` as a real process: configuration errors, SIGTERM drain and hand-over, burst mode (drain
the queue, then exit), JSON logs, Prometheus metrics."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from pathlib import Path

from emulator.valkey import free_port
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from tests.support.waiting import eventually_async

from .support import REPO, chat, mock_calls, status_is, submit, terminal, worker_env, worker_processes


def test_a_bad_setting_stops_the_worker_with_exit_2_naming_the_variable(settings: Settings) -> None:
    env = worker_env(settings, INFERQ_WINDOW="0")
    done = subprocess.run([sys.executable, "-m", "gpu_worker"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "INFERQ_WINDOW" in lines[0]


async def test_burst_mode_drains_the_queue_retries_included_then_exits_0(settings: Settings) -> None:
    settings = settings.replace(retry_base_ms=300, retry_max_ms=300, window=2)
    queue = Queue.connect(settings)
    jobs = [await submit(queue, chat(f"q{i}", latency_ms=50)) for i in range(5)]
    retried = await submit(queue, chat("flaky", fail_attempts=1))  # back in the queue only after its backoff
    env = worker_env(settings, INFERQ_WORKER_ID="burst")
    command = [sys.executable, "-m", "gpu_worker", "--burst"]
    done = await asyncio.to_thread(subprocess.run, command, cwd=REPO, env=env, capture_output=True, text=True,
                                   timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    for job in [*jobs, retried]:
        record = await queue.get(job.id)
        assert record is not None and record.status is JobStatus.SUCCEEDED
    assert (await queue.get(retried.id)).attempts == 2  # type: ignore[union-attr]
    assert (await queue.observe()).backlog == 0
    assert await queue.redis.hget(queue.keys.workers, "burst") is None  # deregistered on the way out
    # nothing to do: it exits at once, still 0
    again = await asyncio.to_thread(subprocess.run, command, cwd=REPO, env=env, capture_output=True, text=True,
                                    timeout=60)
    assert again.returncode == 0, again.stderr[-3000:]
    await queue.close()


async def test_sigterm_drains_then_hands_unfinished_work_over_at_once(
    settings: Settings, tmp_path: Path
) -> None:
    # a long claim-idle: if the long job reached the second worker by reclaim, this test would time out
    settings = settings.replace(claim_idle_ms=60_000, drain_s=3, window=4)
    queue = Queue.connect(settings)
    with worker_processes(settings, tmp_path) as spawn:
        first = spawn("first")
        await first.started(queue)
        short = await submit(queue, chat("short", latency_ms=1500))  # ends within the drain
        long = await submit(queue, chat("long", latency_ms=30_000))  # does not
        await status_is(queue, long.id, "running")
        await status_is(queue, short.id, "running")
        first.terminate()
        # out after the drain, without waiting for the long job: it ran one call and is queued again, unfinished
        assert await first.wait(timeout=15) == 0
        assert (await queue.get(short.id)).status is JobStatus.SUCCEEDED  # type: ignore[union-attr]
        released = await queue.get(long.id)
        assert released is not None and released.status is JobStatus.QUEUED and released.attempts == 1
        assert await queue.redis.hget(queue.keys.workers, "first") is None  # deregistered

        second = spawn("second")
        await status_is(queue, long.id, "running", timeout=15)
        assert await queue.redis.hget(queue.keys.job(long.id), "worker") == "second"
        # the mock counts a call when it receives it, a moment after the job shows running: wait for the count
        async def called_twice() -> bool:
            return await mock_calls(queue, long.id) == 2

        await eventually_async(called_twice, what="the second worker's call of the long job", timeout=15)
        # handed over by the release, not taken back by a reclaim after the 60 s claim-idle
        assert (await queue.stats()).get("reclaimed", 0) == 0
        second.kill()
    await queue.close()


async def test_logs_are_json_with_job_and_trace_ids_and_never_the_prompt(
    settings: Settings, queue: Queue, tmp_path: Path
) -> None:
    secret_prompt = "the-patient-record-7f3a9"
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with worker_processes(settings, tmp_path) as spawn:
        worker = spawn("logger")
        job = await submit(queue, chat(secret_prompt, fatal=True), traceparent=trace)
        await terminal(queue, job.id, timeout=15)
        worker.terminate()
        assert await worker.wait() == 0
    text = worker.output()
    assert secret_prompt not in text
    lines = worker.log_lines()
    assert len(lines) == len(text.strip().splitlines())  # every line is one JSON object
    failed = [line for line in lines if line.get("job_id") == job.id]
    assert failed and failed[0]["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert failed[0]["worker_id"] == "logger" and failed[0]["level"] == "WARNING"
    assert any(line["message"] == "worker stopped" for line in lines)


async def test_metrics_are_served_on_the_metrics_port(settings: Settings, queue: Queue, tmp_path: Path) -> None:
    port = free_port()
    with worker_processes(settings, tmp_path) as spawn:
        worker = spawn("measured", INFERQ_METRICS_PORT=str(port))
        jobs = [await submit(queue, chat(f"q{i}")) for i in range(3)]
        fatal = await submit(queue, chat("bad", fatal=True))
        for job in [*jobs, fatal]:
            await terminal(queue, job.id, timeout=15)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            scraped = response.read().decode()
        worker.terminate()
        assert await worker.wait() == 0
    q = settings.queue
    assert f'inferq_worker_jobs_total{{outcome="succeeded",queue="{q}"}} 3.0' in scraped
    assert f'inferq_worker_jobs_total{{outcome="failed",queue="{q}"}} 1.0' in scraped
    assert f'inferq_worker_backend_errors_total{{kind="fatal",queue="{q}"}} 1.0' in scraped
    assert f'inferq_worker_window{{queue="{q}"}} 8.0' in scraped
    assert "inferq_worker_queue_wait_seconds_bucket" in scraped and "inferq_worker_run_seconds_count" in scraped


async def test_a_task_that_dies_stops_the_worker_which_releases_its_jobs_and_exits_1(
    settings: Settings, tmp_path: Path
) -> None:
    """A failure the fault model does not wait out (here a key of the wrong type, which only a bug or an operator
    can cause) kills the maintenance task: the worker must not run on without it."""
    settings = settings.replace(claim_idle_ms=60_000, window=4)
    queue = Queue.connect(settings)
    with worker_processes(settings, tmp_path) as spawn:
        first = spawn("first")
        await first.started(queue)
        jobs = [await submit(queue, chat(f"long {i}", latency_ms=30_000)) for i in range(2)]
        for job in jobs:
            await status_is(queue, job.id, "running")
        await queue.redis.set(queue.keys.delayed, "not a sorted set")  # WRONGTYPE for the promotion
        assert await first.wait(timeout=20) == 1
        lines = first.log_lines()
        assert any("the maintenance task died" in line.get("message", "") for line in lines), first.output()[-3000:]
        for job in jobs:  # handed back at once, no attempt spent: the next worker need not wait for claim-idle
            released = await queue.get(job.id)
            assert released is not None and released.status is JobStatus.QUEUED and released.attempts == 1
        assert await queue.redis.hget(queue.keys.workers, "first") is None  # deregistered
    await queue.close()
