"""The adaptive window's control law (gpu_worker/window.py) against simulated engines, the load signals each
backend reads, and the ``INFERQ_WINDOW=auto`` settings."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import pytest

from gpu_worker.backends.base import EngineLoad
from gpu_worker.backends.openai import parse_vllm_metrics
from gpu_worker.backends.vllm import LoadRecorder
from gpu_worker.metrics import WorkerMetrics
from gpu_worker.window import (
    BUFFER_MAX,
    AdaptiveWindow,
    Refill,
    StaticWindow,
    WindowLaw,
    interval_load,
    window_for,
)
from inferq.config.settings import Settings, SettingsError


def engine(capacity: int, in_flight: int) -> EngineLoad:
    """An engine with ``capacity`` batch slots given ``in_flight`` requests: the rest wait inside it."""
    return EngineLoad(waiting=max(0, in_flight - capacity), running=min(in_flight, capacity))


def drive(law: WindowLaw, capacity: int, steps: int) -> list[int]:
    """A worker with an endless backlog: its window is always full."""
    sizes = []
    for _ in range(steps):
        sizes.append(law.step(engine(capacity, law.current), law.current))
    return sizes


@pytest.mark.parametrize("capacity", [1, 3, 12, 40])
def test_the_window_settles_at_the_engines_capacity_plus_a_small_buffer(capacity: int) -> None:
    law = WindowLaw(maximum=64)
    tail = drive(law, capacity, 300)[-150:]
    mean = sum(tail) / len(tail)
    buffer = min(4, max(1, 0.15 * capacity))
    assert capacity <= mean <= capacity + buffer + 1, (capacity, mean, tail[-20:])
    # settled, not oscillating: the engine's batch is full at nearly every poll, and what waits stays small
    assert sum(1 for size in tail if size < capacity) <= len(tail) // 10, (capacity, tail)
    assert max(tail) - min(tail) <= 2, (capacity, tail)


class CountingEngine:
    """An engine with ``capacity`` slots whose gauges always read idle (a busy front end answers ``/metrics`` after
    each burst has drained) but whose counters add up every request's time, as vLLM's histograms do."""

    def __init__(self, capacity: int, seconds_per_request: float = 0.5) -> None:
        self.capacity = capacity
        self.seconds_per_request = seconds_per_request
        self.totals = EngineLoad(waiting=0, running=0, finished=0.0, latency_s=0.0, inference_s=0.0)

    def read(self, in_flight: int, seconds: float) -> EngineLoad:
        running = min(in_flight, self.capacity)
        t = self.totals
        assert t.finished is not None and t.latency_s is not None and t.inference_s is not None
        self.totals = EngineLoad(
            waiting=0, running=0, finished=t.finished + running * seconds / self.seconds_per_request,
            latency_s=t.latency_s + in_flight * seconds, inference_s=t.inference_s + running * seconds)
        return self.totals


@pytest.mark.parametrize("capacity", [2, 12])
def test_the_counters_size_the_window_when_the_gauges_read_idle(capacity: int) -> None:
    law, engine, previous = WindowLaw(maximum=64), CountingEngine(capacity), None
    sizes = []
    for _ in range(300):
        raw = engine.read(law.current, 0.5)
        sizes.append(law.step(interval_load(previous, raw, 0.5), law.current))
        previous = raw
    tail = sizes[-150:]
    assert capacity <= sum(tail) / len(tail) <= capacity + BUFFER_MAX + 1, (capacity, tail[-20:])
    # the gauges alone (always idle) would have grown it to the maximum
    blind = WindowLaw(maximum=64)
    for _ in range(300):
        blind.step(EngineLoad(waiting=0, running=0), blind.current)
    assert blind.current == 64


def test_interval_load_is_the_mean_between_two_reads_or_the_gauges() -> None:
    gauges = EngineLoad(waiting=3, running=1, kv_cache_usage=0.5)
    before = replace(gauges, finished=10.0, latency_s=40.0, inference_s=30.0)
    # 4 requests finished in 2 s: 6 s of them inside the server, 2 s of those before the engine ran them
    after = replace(gauges, finished=14.0, latency_s=46.0, inference_s=34.0)
    assert interval_load(before, after, 2.0) == replace(after, waiting=1.0, running=2.0)
    assert interval_load(None, after, 2.0) == after  # the first read
    assert interval_load(after, after, 2.0) == after  # nothing finished: nothing new
    assert interval_load(after, replace(after, finished=1.0, latency_s=1.0, inference_s=1.0), 2.0).waiting == 3
    assert interval_load(gauges, after, 2.0) == after  # a server without the counters
    busy = replace(after, running=5.0)
    assert interval_load(before, busy, 2.0).running == 5.0  # the gauge's running when it shows more


def test_refill_is_the_time_outside_the_servers_stamps_by_the_answer_rate() -> None:
    refill = Refill(answers=8)
    counters = EngineLoad(waiting=0, running=0, finished=0.0, latency_s=0.0, answered=0.0, answered_s=0.0)

    def after(t: EngineLoad, answers: float, inside_s: float, outside_s: float) -> EngineLoad:
        assert t.finished is not None and t.latency_s is not None
        assert t.answered is not None and t.answered_s is not None
        return replace(t, finished=t.finished + answers, latency_s=t.latency_s + answers * inside_s,
                       answered=t.answered + answers, answered_s=t.answered_s + answers * (inside_s + outside_s))

    assert refill.update(counters, 0.0) == 0.0  # one read: nothing to compare
    counters = after(counters, 10, 0.5, 0.2)  # 20 answers a second, each 0.2 s outside the server: 4 on the path
    assert refill.update(counters, 0.5) == pytest.approx(4.0) and refill.per_request == pytest.approx(0.2)
    counters = after(counters, 4, 0.5, 0.05)  # too few answers for one poll: the mean reaches back a poll
    assert refill.update(counters, 1.0) == pytest.approx(14 / 1.0 * (10 * 0.2 + 4 * 0.05) / 14)
    # another client's requests at the server do not count: the comparison is per request
    counters = replace(after(counters, 10, 0.5, 0.1), finished=counters.finished + 30,
                       latency_s=counters.latency_s + 30 * 0.5)
    assert refill.update(counters, 1.5) == pytest.approx(20 * 0.1)
    # the server restarted: its counters start again, and so does the comparison
    restarted = EngineLoad(waiting=0, running=0, finished=1.0, latency_s=0.5, answered=counters.answered,
                           answered_s=counters.answered_s)
    assert refill.update(restarted, 2.0) == 0.0
    # a backend that does not time its requests, or a server without the counters: nothing to read
    assert refill.update(EngineLoad(waiting=0, running=0, finished=1.0, latency_s=0.5), 2.5) == 0.0
    assert refill.update(None, 3.0) == 0.0


def test_the_buffer_covers_the_requests_on_their_way_to_the_engine() -> None:
    """A slot that ends stays empty until the next request crosses the path to the engine, unless one waits there:
    the buffer is at least as many as are on the path, up to its maximum."""
    law = WindowLaw(maximum=64, initial=12)
    law.slow_start = False
    assert law.buffer(EngineLoad(waiting=0, running=8)) == 1.2
    assert law.buffer(EngineLoad(waiting=0, running=8, path=3.0)) == 3.0
    assert law.buffer(EngineLoad(waiting=0, running=8, path=40.0)) == BUFFER_MAX
    for _ in range(5):  # three wait in the engine: what ends while three cross the path, not a queue to cut
        law.step(EngineLoad(waiting=3, running=8, path=3.0), 12)
    assert law.current == 12
    for _ in range(2):  # the same three with nothing on the path: a queue
        law.step(EngineLoad(waiting=3, running=8), 12)
    assert law.current < 12


def test_the_workers_engine_gauges_read_the_laws_last_load_at_each_scrape() -> None:
    metrics = WorkerMetrics("q", 1)
    latest: list[EngineLoad] = []
    metrics.watch_engine(lambda: latest[-1] if latest else None)

    def scraped() -> dict[str, float | None]:
        return {name: metrics.registry.get_sample_value(f"inferq_worker_engine_{name}", {"queue": "q"})
                for name in ("waiting", "running", "path")}

    assert scraped() == {"waiting": 0.0, "running": 0.0, "path": 0.0}  # before the first read
    latest.append(EngineLoad(waiting=1.5, running=6.0, path=2.5))
    assert scraped() == {"waiting": 1.5, "running": 6.0, "path": 2.5}


def test_it_stops_growing_when_the_buffer_waits() -> None:
    law = WindowLaw(maximum=64, initial=9)
    law.slow_start = False
    for _ in range(10):
        law.step(EngineLoad(waiting=1, running=4), 9)  # buffer: one
    assert law.current == 9
    law.step(EngineLoad(waiting=0, running=9), 9)
    assert law.current == 10


def test_it_follows_the_capacity_down_and_up_again() -> None:
    law = WindowLaw(maximum=64)
    drive(law, 30, 200)
    assert law.current >= 22
    down = drive(law, 6, 100)[-50:]
    assert max(down) <= 8 and min(down) >= 4
    up = drive(law, 30, 200)[-50:]
    assert sum(up) / len(up) >= 22


def test_requests_waiting_in_the_engine_shrink_it_multiplicatively() -> None:
    law = WindowLaw(maximum=64, initial=32)
    law.slow_start = False
    law.step(EngineLoad(waiting=20, running=12), 32)
    assert law.current == 32  # one read: a burst the engine may admit at its next steps
    law.step(EngineLoad(waiting=20, running=12), 32)  # two: a queue that stands
    assert law.current == int(32 * 0.8)
    # held while the engine drains what queued before the signal caught up: no second cut at once
    law.step(EngineLoad(waiting=20, running=12), 25)
    assert law.current == 25


def test_the_cut_that_ends_slow_start_may_take_half() -> None:
    law = WindowLaw(maximum=64, initial=12)  # just doubled from 6, and the engine runs two
    for _ in range(2):
        law.step(EngineLoad(waiting=10, running=2), 12)
    assert law.current == 6 and not law.slow_start
    law._hold = 0
    for _ in range(2):
        law.step(EngineLoad(waiting=4, running=2), 6)
    assert law.current == int(6 * 0.8)  # afterwards a fifth at most


def test_bursts_that_the_engine_admits_between_reads_do_not_cut_it() -> None:
    """vLLM on a busy host: most reads find the engine idle, some find a burst waiting (its front end hands over
    requests in batches); a burst gone at the next read is not a queue the window made."""
    law = WindowLaw(maximum=32, initial=12)
    law.slow_start = False
    reads = [EngineLoad(waiting=0, running=2, kv_cache_usage=0.2)] * 3 + [
        EngineLoad(waiting=5, running=8, kv_cache_usage=1.0)]
    for _ in range(10):
        for load in reads:
            law.step(load, law.current)
    assert law.current == 32 and law.ceiling is None


def test_past_the_last_cut_it_grows_by_an_eighth_again() -> None:
    law = WindowLaw(maximum=64, initial=10)
    law.slow_start = False
    law.ceiling = 10.0
    law.step(EngineLoad(waiting=0, running=10), 10)
    assert law.size == 10.25  # probing the edge where requests last queued
    law.size = 11.5
    law.step(EngineLoad(waiting=0, running=11), 11)
    assert law.size == 11.5 * 1.125  # past it by more than a request: the edge has moved
    law.size = 4.0
    law.step(EngineLoad(waiting=0, running=4), 4)
    assert law.size == 5.0  # at least one request per poll


def test_a_window_a_job_short_of_full_still_grows() -> None:
    law = WindowLaw(maximum=64, initial=10)
    law.slow_start = False
    law.step(EngineLoad(waiting=0, running=9), 9)  # one job between its result and the next pull
    assert law.current == 11


def test_never_above_the_maximum_nor_below_one() -> None:
    law = WindowLaw(maximum=10)
    assert max(drive(law, 1000, 100)) == 10 and law.current == 10
    for _ in range(100):
        law.step(EngineLoad(waiting=500, running=0), law.current)
        assert law.current >= 1
    assert law.current == 1


def test_it_does_not_grow_when_the_kv_cache_is_full_or_the_window_unused() -> None:
    law = WindowLaw(maximum=64, initial=8)
    for _ in range(20):
        law.step(EngineLoad(waiting=0, running=8, kv_cache_usage=0.95), 8)
    assert law.current == 8
    for _ in range(20):  # an idle worker: its window says nothing about the engine's room
        law.step(EngineLoad(waiting=0, running=2), 2)
    assert law.current == 8
    law.step(EngineLoad(waiting=0, running=8, kv_cache_usage=0.5), 8)
    assert law.current > 8


def test_slow_start_doubles_only_once_the_gauges_show_the_window() -> None:
    law = WindowLaw(maximum=64, initial=16)
    law.step(EngineLoad(waiting=0, running=8), 16)  # the gauges still show the window before the last doubling
    assert law.current == 18  # an eighth, not twice
    law.step(EngineLoad(waiting=0, running=18), 18)
    assert law.current == 36


def test_without_signals_it_grows_to_the_maximum_as_it_fills() -> None:
    law = WindowLaw(maximum=20)
    for _ in range(20):
        law.step(None, law.current)
    assert law.current == 20


def test_a_single_transient_waiting_sample_is_tolerated() -> None:
    law = WindowLaw(maximum=64, initial=20)
    law.slow_start = False  # buffer: 15% of 16 running, 2.4 requests
    law.step(EngineLoad(waiting=4, running=16), 20)
    assert law.current == 20
    law.step(EngineLoad(waiting=4, running=16), 20)
    assert law.current < 20


def test_a_failed_read_holds_the_window() -> None:
    async def broken() -> EngineLoad | None:
        raise OSError("connection refused")

    window = AdaptiveWindow(broken, 32)
    assert asyncio.run(window.poll(in_flight=1)) == 1
    assert window.law.current == 1


def test_the_adaptive_window_reports_its_changes_until_stopped() -> None:
    async def scenario() -> list[tuple[int, int]]:
        window = AdaptiveWindow(lambda: _const(EngineLoad(waiting=0, running=4)), 8, poll_s=0.01)
        changes: list[tuple[int, int]] = []
        stop = asyncio.Event()
        task = asyncio.create_task(window.run(stop, lambda: window.size, lambda a, b: changes.append((a, b))))
        while window.size < 8:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 5)
        return changes

    assert asyncio.run(scenario()) == [(1, 2), (2, 4), (4, 8)]


async def _const(load: EngineLoad) -> EngineLoad:
    return load


# ---------------------------------------------------------------- signals

VLLM_0_32_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 3.0
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-llama",reason="capacity"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.42
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny-llama"} 30.5
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="tiny-llama"} 4.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny-llama"} 12.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny-llama"} 12.0
# HELP vllm:request_inference_time_seconds Histogram of time spent in RUNNING phase for request.
# TYPE vllm:request_inference_time_seconds histogram
vllm:request_inference_time_seconds_sum{engine="0",model_name="tiny-llama"} 20.25
vllm:request_inference_time_seconds_bucket{engine="0",le="+Inf",model_name="tiny-llama"} 12.0
vllm:request_inference_time_seconds_count{engine="0",model_name="tiny-llama"} 12.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 1234.0
"""


def test_vllm_metrics_are_read_by_their_real_names() -> None:
    assert parse_vllm_metrics(VLLM_0_32_METRICS) == EngineLoad(waiting=3.0, running=7.0, kv_cache_usage=0.42,
                                                               finished=12.0, latency_s=30.5, inference_s=20.25)


def test_older_vllm_names_and_several_engines() -> None:
    text = (
        'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_running{engine="1"} 3\n'
        'vllm:num_requests_waiting{engine="0"} 1\nvllm:num_requests_waiting{engine="1"} 0\n'
        'vllm:gpu_cache_usage_perc{engine="0"} 0.5\n'
    )
    assert parse_vllm_metrics(text) == EngineLoad(waiting=1.0, running=5.0, kv_cache_usage=0.5)


def test_a_server_without_vllm_gauges_gives_no_signal() -> None:
    assert parse_vllm_metrics("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.5\n") is None


def test_the_in_process_engine_signal_comes_from_its_scheduler_stats() -> None:
    recorder = LoadRecorder()
    logger = recorder.factory(None, 0)
    logger.record(None, None)
    assert recorder.latest is None
    logger.record(SimpleNamespace(num_waiting_reqs=4, num_running_reqs=16, kv_cache_usage=0.8), None, engine_idx=0)
    assert recorder.latest == EngineLoad(waiting=4.0, running=16.0, kv_cache_usage=0.8)
    finished = [SimpleNamespace(e2e_latency=3.0, inference_time=2.0),
                SimpleNamespace(e2e_latency=1.5, inference_time=1.0)]
    logger.record(None, SimpleNamespace(finished_requests=finished))
    assert recorder.latest == EngineLoad(waiting=4.0, running=16.0, kv_cache_usage=0.8, finished=2.0, latency_s=4.5,
                                         inference_s=3.0)


# ---------------------------------------------------------------- settings


def test_window_auto_and_its_maximum() -> None:
    s = Settings.from_env({"INFERQ_WINDOW": "Auto", "INFERQ_WINDOW_MAX": "24"})
    assert s.window == "auto" and s.adaptive_window and s.window_max == 24
    assert s.window_limit == 24 and s.target_per_worker == 24
    static = Settings.from_env({"INFERQ_WINDOW": "6", "INFERQ_WINDOW_MAX": "24"})
    assert not static.adaptive_window and static.window_limit == 6 and static.target_per_worker == 6
    assert Settings().window_max == 64


@pytest.mark.parametrize(("name", "value"), [("INFERQ_WINDOW", "automatic"), ("INFERQ_WINDOW", "0"),
                                             ("INFERQ_WINDOW_MAX", "0"), ("INFERQ_WINDOW_MAX", "auto")])
def test_a_bad_window_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: value})
    assert info.value.variable == name and name in str(info.value)


def test_window_for_picks_static_or_adaptive() -> None:
    assert isinstance(window_for(Settings(window=5), object()), StaticWindow)
    assert window_for(Settings(window=5), object()).size == 5

    class WithLoad:
        name = "x"

        async def load(self) -> EngineLoad | None:
            return None

    adaptive = window_for(Settings(window="auto", window_max=9), WithLoad())
    assert isinstance(adaptive, AdaptiveWindow) and adaptive.source is not None and adaptive.law.maximum == 9
    blind = window_for(Settings(window="auto"), object())
    assert isinstance(blind, AdaptiveWindow) and blind.source is None
