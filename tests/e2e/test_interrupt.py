"""Spot interruptions through ``inferq up``: ``inferq interrupt`` drains a worker as ECS does on EC2's two-minute
notice (SIGTERM, a replacement started at once), and nothing is lost, no attempt spent."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.support.waiting import eventually

from .conftest import ROOT, Emulator, chat, running_emulator

SPOT = {
    "INFERQ_DRAIN_S": "3",  # what ends within 3 s finishes where it runs
    "INFERQ_CLAIM_IDLE_MS": "30000",  # a reclaim would take 30 s: a quick handover can only be the hand-back
    "INFERQ_SCALE_MAX": "1",
}


@pytest.fixture(scope="module")
def spot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """Shared: each interruption leaves the service as ECS does, its replacement started."""
    with running_emulator(tmp_path_factory, **SPOT) as emulator:
        yield emulator


def interrupt(emulator: Emulator, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferq.cli.main", "interrupt", *args, "--data-dir",
                           str(emulator.data_dir)], cwd=ROOT, capture_output=True, text=True, timeout=30)


def running(emulator: Emulator, job_id: str) -> bool:
    return bool(emulator.job(job_id)["status"] == "running")


def test_a_job_that_ends_within_the_notice_ends_where_it_runs_and_a_replacement_starts_at_once(
    spot: Emulator,
) -> None:
    job = spot.submit(chat("ends in time", latency_ms=1500))
    eventually(lambda: running(spot, job["id"]), what="the job to run", timeout=20, interval=0.05)
    logged = len(spot.logs())
    done = interrupt(spot)
    assert done.returncode == 0, done.stderr
    assert "interrupted worker-" in done.stdout and "its replacement is starting" in done.stdout
    # the service starts the replacement while the interrupted worker still finishes its job
    eventually(lambda: "| started worker-" in spot.logs()[logged:], what="the replacement to start", timeout=20)
    finished = spot.finish(job["id"], timeout=30)
    assert (finished["status"], finished["attempts"]) == ("succeeded", 1)
    assert finished["result"]["body"]["choices"][0]["message"]["content"] == "ends in time"
    since = spot.logs()[logged:]
    assert "(Spot interruption, 120s notice): SIGTERM" in since
    assert "releasing" not in since  # it ended where it ran: nothing handed back


def test_a_job_that_cannot_end_within_the_notice_is_handed_back_and_ends_once(spot: Emulator) -> None:
    job = spot.submit(chat("too long for the notice", latency_ms=6000))
    eventually(lambda: running(spot, job["id"]), what="the job to run", timeout=20, interval=0.05)
    logged = len(spot.logs())
    interrupted = time.monotonic()
    assert interrupt(spot).returncode == 0
    finished = spot.finish(job["id"], timeout=60)
    took = time.monotonic() - interrupted
    assert (finished["status"], finished["attempts"]) == ("succeeded", 1)  # no attempt spent on the interruption
    assert finished["result"]["body"]["choices"][0]["message"]["content"] == "too long for the notice"
    print(f"interruption -> succeeded on the replacement: {took:.1f}s")
    assert "releasing 1 unfinished jobs" in spot.logs()[logged:]  # handed back, not left for a reclaim


def test_interrupting_a_worker_that_is_not_there_says_so(spot: Emulator) -> None:
    done = interrupt(spot, "worker-999")
    assert done.returncode == 1
    assert "no live worker worker-999 to interrupt" in done.stderr
