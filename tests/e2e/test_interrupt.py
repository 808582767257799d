"""Spot interruptions through ``inferq up``: ``inferq interrupt`` drains a worker as ECS does on EC2's two-minute
notice (SIGTERM, a replacement started at once), and nothing is lost, no attempt spent."""

from __future__ import annotations

import os
import signal
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


def streamed(emulator: Emulator, job_id: str) -> tuple[str, bool]:
    """The job's output so far, read from its stream from the start (a read marks it watched), and whether it ended."""
    reply = emulator.client.get(f"/v1/jobs/{job_id}/stream")
    assert reply.status_code == 200, reply.text
    page = reply.json()
    return "".join(piece["delta"] for piece in page["data"]), bool(page["done"])


def test_a_job_that_cannot_end_within_the_notice_is_handed_back_at_once_and_continued(spot: Emulator) -> None:
    text = "one two three four five six seven eight nine ten"
    job = spot.submit(chat(text, latency_ms=6000))  # a word every 0.6 s: 6 s in all, the drain is 3 s
    eventually(lambda: len(streamed(spot, job["id"])[0].split()) >= 2, what="the job to stream two words", timeout=20,
               interval=0.1)
    logged = len(spot.logs())
    assert interrupt(spot).returncode == 0
    eventually(lambda: "handing back 1 jobs that will not end within the 3 s drain" in spot.logs()[logged:],
               what="the interrupted worker to hand the job back")
    finished = spot.finish(job["id"], timeout=60)
    assert (finished["status"], finished["attempts"]) == ("succeeded", 1)  # no attempt spent on the interruption
    assert finished["result"]["body"]["choices"][0]["message"]["content"] == text
    assert streamed(spot, job["id"]) == (text, True)  # continued after what was kept: the pieces spell it once
    assert "releasing" not in spot.logs()[logged:]  # nothing was left for the end of the drain


def test_sigterm_to_the_worker_mid_stream_under_default_settings_ends_the_job_whole_where_it_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """What ECS's SIGTERM does to a worker of ``inferq up`` as it comes (default settings, one worker): a streamed job
    halfway through ends where it runs, whole, in the rest of its time, not another run of it."""
    emulator = Emulator(tmp_path_factory.mktemp("inferq") / "data", {})
    try:
        emulator.start()
        words = "one two three four five six seven eight"
        job = emulator.submit(chat(words, latency_ms=4000))  # a word every 0.5 s
        eventually(lambda: len(streamed(emulator, job["id"])[0].split()) >= 4, what="the job to stream half",
                   timeout=60)
        [worker] = emulator.workers()
        logged = len(emulator.logs())
        os.kill(worker, signal.SIGTERM)
        interrupted = time.monotonic()
        finished = emulator.finish(job["id"], timeout=60)
        took = time.monotonic() - interrupted
        assert (finished["status"], finished["attempts"]) == ("succeeded", 1)
        assert finished["result"]["body"]["choices"][0]["message"]["content"] == words
        assert streamed(emulator, job["id"]) == (words, True)
        since = emulator.logs()[logged:]
        assert "handing back" not in since and "releasing" not in since  # it ended where it ran
        print(f"SIGTERM mid-stream -> succeeded in {took:.1f}s (a rerun would take 4 s or more)")
        assert took < 4.0  # the rest of its 4 s, not a run from the start
    finally:
        emulator.cleanup()


def test_interrupting_a_worker_that_is_not_there_says_so(spot: Emulator) -> None:
    done = interrupt(spot, "worker-999")
    assert done.returncode == 1
    assert "no live worker worker-999 to interrupt" in done.stderr


def test_random_interruptions_lose_nothing_spend_no_attempt_and_continue(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """INFERQ_EMULATOR_INTERRUPT_EVERY_S: every worker is interrupted after a random time while jobs stream; waves of
    jobs go in until one was handed back mid-stream, and every job ends once, whole, on its first attempt."""
    with running_emulator(tmp_path_factory, INFERQ_EMULATOR_INTERRUPT_EVERY_S="12", INFERQ_SCALE_MAX="2",
                          INFERQ_CLAIM_IDLE_MS="30000") as emulator:
        texts: dict[str, str] = {}

        def handed_back() -> bool:
            for n in range(4):  # a wave: four jobs of 8 words over 4 s each, longer than the 2 s drain
                text = " ".join(f"w{len(texts)}-{n}-{i}" for i in range(8))
                texts[emulator.submit(chat(text, latency_ms=4000))["id"]] = text
            return "handing back" in emulator.logs()

        eventually(handed_back, what="a job handed back mid-stream", timeout=120, interval=3.0)
        for job_id, text in texts.items():
            finished = emulator.finish(job_id, timeout=120)
            assert (finished["status"], finished["attempts"]) == ("succeeded", 1), finished
            assert finished["result"]["body"]["choices"][0]["message"]["content"] == text
            assert streamed(emulator, job_id) == (text, True)  # continued after what was kept, never twice
        logs = emulator.logs()
        print(f"{len(texts)} jobs, {logs.count('(Spot interruption')} interruptions, "
              f"{logs.count('handing back')} hand-backs: all succeeded on their first attempt")
