"""The whole stack under ``inferq up``, over HTTP: jobs succeed, the fleet follows the backlog up and back to zero,
and kill -9 of workers during a few hundred jobs loses none."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import redis

from tests.support.waiting import NeverHappened, eventually

from .conftest import ROOT, Emulator, chat


def wait_idle(stack: Emulator, timeout: float = 60.0) -> None:
    """Nothing queued or running: one test's jobs do not leak into the next one's numbers."""
    eventually(lambda: stack.scale()["unfinished"] == 0, what="the queue to drain", timeout=timeout, interval=0.2)


def test_the_stack_gets_ready_and_prints_how_to_submit(stack: Emulator) -> None:
    logs = stack.logs()
    print(f"time to ready: {stack.ready_s:.2f}s")  # a figure, not a test: the fixture's own timeout bounds it
    assert f"inferq: ready on http://127.0.0.1:{stack.port}" in logs
    assert "curl -s" in logs and "inferq submit" in logs

    def roles() -> set[str]:
        return {line.split("|", 1)[0].strip() for line in stack.logs().splitlines() if "|" in line[:12]}

    eventually(lambda: {"valkey", "gateway", "scaler"} <= roles(), what="log lines prefixed by role", interval=0.2)
    assert stack.client.get("/readyz").status_code == 200
    assert stack.client.get("/v1/scale", headers={"Authorization": "Bearer wrong-key-123"}).status_code == 401


def test_jobs_succeed_with_the_mock_answer(stack: Emulator) -> None:
    jobs = [stack.submit(chat(f"hello {i}")) for i in range(5)]
    for i, job in enumerate(jobs):
        done = stack.finish(job["id"])
        assert done["status"] == "succeeded", done
        assert done["result"]["status_code"] == 200
        assert done["result"]["body"]["choices"][0]["message"]["content"] == f"hello {i}"
    assert any(line.startswith("worker-") for line in stack.logs().splitlines())


def test_backlog_scales_the_fleet_up_and_idleness_back_to_zero(stack: Emulator) -> None:
    wait_idle(stack)
    jobs = [stack.submit(chat(f"backlog {i}", latency_ms=400)) for i in range(40)]
    # 40 jobs, 4 per worker: the policy wants 10, capped at INFERQ_SCALE_MAX=3 real worker processes
    eventually(lambda: stack.scale()["desired"] == 3, what="desired 3", timeout=15, interval=0.2)
    eventually(lambda: len(stack.workers()) == 3, what="3 worker processes", timeout=15, interval=0.2)
    for job in jobs:
        assert stack.finish(job["id"])["status"] == "succeeded"
    # cooldown 3 s, idle 4 s before zero: back to no worker process at all
    eventually(lambda: stack.scale()["desired"] == 0, what="desired 0", timeout=30, interval=0.3)
    eventually(lambda: not stack.workers(), what="no worker process left", timeout=20, interval=0.2)
    assert "scale-in" in stack.logs()


def test_kill_9_of_workers_during_hundreds_of_jobs_loses_none(own_stack: Callable[..., Emulator]) -> None:
    stack = own_stack()  # its workers are killed
    with ThreadPoolExecutor(8) as pool:
        jobs = list(pool.map(lambda i: stack.submit(chat(f"job {i}", latency_ms=100)), range(300)))
    killed: list[int] = []

    def oldest_worker_busy() -> int | None:  # the oldest: the one most likely to hold jobs
        workers = stack.workers()
        return workers[0] if workers and stack.scale()["unfinished"] > 40 else None

    with contextlib.suppress(NeverHappened):  # the fleet may finish the backlog before the fourth kill
        for _ in range(4):
            victim = eventually(oldest_worker_busy, what="a worker to kill while jobs are in flight", timeout=30,
                                interval=0.1)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
            eventually(lambda pid=victim: pid not in stack.workers(), what="the killed worker gone")
    assert len(killed) >= 2, "the fleet finished before the test could kill workers"
    with ThreadPoolExecutor(8) as pool:
        finished = list(pool.map(lambda job: stack.finish(job["id"], timeout=90), jobs))
    statuses = {job["status"] for job in finished}
    assert statuses == {"succeeded"}, [j for j in finished if j["status"] != "succeeded"][:3]
    for i, job in enumerate(finished):
        assert job["result"]["body"]["choices"][0]["message"]["content"] == f"job {i}"
    # each reached one terminal state and stays there; nothing dead-lettered, nothing unfinished
    again = [stack.job(job["id"]) for job in finished[::25]]
    assert all(j["status"] == "succeeded" and j["finished_at"] == f["finished_at"]
               for j, f in zip(again, finished[::25], strict=True))
    assert stack.client.get("/v1/dlq?limit=100").json()["data"] == []
    assert stack.scale()["unfinished"] == 0
    assert stack.logs().count("exited on its own (exit -9); replacing it") >= len(killed)  # each one replaced


def test_cli_submit_waits_for_the_answer_and_status_shows_the_fleet(stack: Emulator) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    base = [sys.executable, "-m", "inferq.cli.main"]
    common = ["--url", stack.url, "--data-dir", str(stack.data_dir)]
    submitted = subprocess.run([*base, "submit", "hi from the cli", "--wait", *common], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    first, answer = submitted.stdout.splitlines()[:2]
    assert first.startswith("job_") and " succeeded after " in first
    assert answer == "hi from the cli"
    shown = subprocess.run([*base, "status", "--once", *common], cwd=ROOT, env={**env, "COLUMNS": "200"},
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    for column in ("lag", "pending", "desired", "workers", "recent jobs"):
        assert column in shown.stdout
    assert first.split()[0] in shown.stdout
    wrong = subprocess.run([*base, "status", "--once", "--api-key", "not-the-key", *common], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert "401" in wrong.stdout


def test_valkey_killed_is_restarted_with_its_data_and_the_stack_recovers(own_stack: Callable[..., Emulator]) -> None:
    stack = own_stack()  # its Valkey is killed
    before = stack.submit(chat("before the crash"))
    assert stack.finish(before["id"])["status"] == "succeeded"
    [(valkey, command)] = [(pid, cmd) for pid, cmd in stack.processes().items() if "valkey-server" in cmd]
    # AOF everysec: a write of ours after the job's, fsynced (WAITAOF), means the job's is on disk too
    port = int(re.search(r"(?:--port |:)(\d+)", command).group(1))  # type: ignore[union-attr]  # its title: host:port
    with redis.Redis(port=port) as probe:
        probe.set("inferq-test:aof-probe", "1")
        assert probe.execute_command("WAITAOF", 1, 0, 10_000)[0] == 1
    os.kill(valkey, signal.SIGKILL)
    eventually(lambda: [p for p, c in stack.processes().items() if "valkey-server" in c and p != valkey],
               what="a new valkey-server")
    eventually(lambda: stack.client.get("/readyz").status_code == 200, what="the gateway to be ready again",
               timeout=15, interval=0.2)
    assert stack.job(before["id"])["status"] == "succeeded"  # replayed from the AOF
    after = stack.submit(chat("after the crash"))
    assert stack.finish(after["id"], timeout=60)["status"] == "succeeded"
    assert "valkey   | exited with -9; restarting (AOF replay)" in stack.logs()
