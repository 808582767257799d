"""Scenario V's request set and verdicts (bench/efficiency.py), without a model server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest

from bench.efficiency import aggregate, verdicts
from bench.vllm_paths import WARMUP, _means, _submit_all, _warm_up, engine_placement, pin_group, request_set
from gpu_worker.backends.base import EngineLoad


def test_the_request_set_is_mixed_deterministic_and_shifts_from_short_to_long() -> None:
    bodies = request_set(200, "m")
    assert bodies == request_set(200, "m")
    assert len({b["prompt"] for b in bodies}) == 200  # distinct: no prefix-cache sharing

    def long_share(part: list[dict[str, Any]]) -> float:
        return sum(1 for b in part if len(b["prompt"].split()) > 40) / len(part)

    assert long_share(bodies[:100]) < 0.4 < 0.6 < long_share(bodies[100:])
    assert len({b["max_tokens"] for b in bodies}) >= 5
    assert all(b["ignore_eos"] and b["temperature"] == 0 for b in bodies)


def run(path: str, knob: int | str, tokens_per_s: float, waiting: float) -> dict[str, Any]:
    key = "concurrency" if path == "direct" else "window"
    return {"path": path, key: knob, "tokens_per_s": tokens_per_s, "waiting_mean": waiting, "errors": 0}


def test_verdicts_compare_the_best_of_each_path_and_auto_with_the_best_static_window() -> None:
    report = {
        "direct": [aggregate([run("direct", 8, 100.0, 0.0)]), aggregate([run("direct", 16, 200.0, 5.0)])],
        "inferq": [aggregate([run("inferq", 8, 150.0, 0.0), run("inferq", 8, 190.0, 0.0), run("inferq", 8, 170.0, 0)]),
                   aggregate([run("inferq", "auto", 180.0, 0.5)])],
    }
    assert report["inferq"][0]["tokens_per_s"] == 170.0 and report["inferq"][0]["tokens_per_s_range"] == [150, 190]
    v = verdicts(report)
    assert v["best_direct"] == {"concurrency": 16, "tokens_per_s": 200.0}
    assert v["inferq_over_direct"] == 0.9 and not v["inferq_goal_met"]
    assert v["best_static"]["window"] == 8 and v["auto_over_best_static"] == round(180 / 170, 3)
    assert not v["auto_goal_met"]  # faster, but more waiting in the engine than the best static window


def test_the_verdict_reads_the_servers_counters_when_both_runs_have_them() -> None:
    static, auto = run("inferq", 24, 100.0, 0.5), run("inferq", "auto", 96.0, 2.0)  # gauges: auto waits more
    static["server_waiting_mean"], auto["server_waiting_mean"] = 3.0, 1.0  # counters: it waits less
    report = {"direct": [aggregate([run("direct", 8, 100.0, 0.0)])], "inferq": [aggregate([static]), aggregate([auto])]}
    v = verdicts(report)
    assert v["auto_waiting"] == 1.0 and v["best_static"]["waiting"] == 3.0 and v["auto_goal_met"]
    auto["server_waiting_mean"] = None  # one run without them: both read the gauges
    v = verdicts({"direct": report["direct"], "inferq": [aggregate([static]), aggregate([auto])]})
    assert v["auto_waiting"] == 2.0 and not v["auto_goal_met"]


def test_the_runs_means_come_from_the_servers_counters() -> None:
    before = EngineLoad(waiting=0, running=0, finished=10.0, latency_s=20.0, inference_s=15.0)
    after = EngineLoad(waiting=7, running=1, finished=30.0, latency_s=60.0, inference_s=35.0)
    assert _means(before, after, 10.0) == {"server_waiting_mean": 2.0, "server_running_mean": 2.0}
    assert _means(before, before, 10.0) == {"server_waiting_mean": None, "server_running_mean": None}
    assert _means(None, after, 10.0)["server_waiting_mean"] is None


class FakeStack:
    """The gateway's submit and get, and a worker's metrics page whose window moves to the next of ``windows``
    after each batch of jobs collected."""

    def __init__(self, windows: list[float]) -> None:
        self.windows = windows
        self.batches = 0
        self.jobs = 0
        self.collected = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            window = self.windows[min(self.batches, len(self.windows) - 1)]
            return httpx.Response(200, text=f"# TYPE inferq_worker_window gauge\ninferq_worker_window {window}\n")
        if request.method == "POST":
            self.jobs += 1
            return httpx.Response(202, json={"id": str(self.jobs)})
        self.collected += 1
        if self.collected % WARMUP == 0:
            self.batches += 1
        usage = {"completion_tokens": 1}
        return httpx.Response(200, json={"status": "succeeded", "result": {"body": {"usage": usage}}})


@pytest.mark.parametrize(("windows", "batches"), [([8.0], 1), ([1.0, 4.0, 9.0, 12.0, 12.0, 12.0], 4)])
def test_each_worker_warms_up_until_its_window_holds_over_a_batch(windows: list[float], batches: int) -> None:
    stack = FakeStack(windows)

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url="http://gw", transport=httpx.MockTransport(stack.handler)) as client:
            await _warm_up(client, request_set(4 * WARMUP, "m"), "http://worker/metrics")

    asyncio.run(scenario())
    assert stack.batches == batches and stack.jobs == batches * WARMUP


def test_a_request_whose_connection_was_closed_under_it_is_sent_once_more() -> None:
    sent: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("Idempotency-Key"))
        if len(sent) == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return httpx.Response(202, json={"id": "j1"})

    async def scenario() -> list[str]:
        async with httpx.AsyncClient(base_url="http://gw", transport=httpx.MockTransport(handler)) as client:
            return await _submit_all(client, request_set(1, "m"))

    assert asyncio.run(scenario()) == ["j1"]
    assert len(sent) == 2 and sent[0] is not None and sent[0] == sent[1]  # the same key: one job


def test_the_engine_gets_the_first_cpu_and_the_rest_go_to_everyone_else() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    placement = engine_placement()
    if len(cpus) == 1:
        assert placement is None
    else:
        assert placement == ({cpus[0]}, set(cpus[1:]))


def test_pin_group_moves_every_thread_of_the_named_processes_of_a_group_and_no_other() -> None:
    cpu = min(os.sched_getaffinity(0))
    # a group of two processes: a named one with a second thread, and another one
    script = ("import threading, time, ctypes, sys\n"
              "if sys.argv[1] == 'engine':\n"
              "    ctypes.CDLL(None).prctl(15, b'VLLM::Worker', 0, 0, 0)\n"
              "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
              "print('ready', flush=True)\n"
              "time.sleep(30)\n")
    engine = subprocess.Popen([sys.executable, "-c", script, "engine"], stdout=subprocess.PIPE, text=True,
                              process_group=0)
    other = subprocess.Popen([sys.executable, "-c", script, "other"], stdout=subprocess.PIPE, text=True,
                             process_group=engine.pid)
    try:
        assert engine.stdout is not None and other.stdout is not None
        assert engine.stdout.readline().strip() == other.stdout.readline().strip() == "ready"
        before = os.sched_getaffinity(other.pid)
        assert pin_group(engine.pid, ("VLLM::Worker",), {cpu}) == ["VLLM::Worker"]
        threads = [int(t) for t in os.listdir(f"/proc/{engine.pid}/task")]
        assert len(threads) == 2 and all(os.sched_getaffinity(t) == {cpu} for t in threads)
        assert os.sched_getaffinity(other.pid) == before
        assert pin_group(engine.pid, ("VLLM::EngineCor",), {cpu}) == []
    finally:
        for proc in (engine, other):
            proc.kill()
            proc.wait()
