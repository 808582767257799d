"""bench.lambda_gateway's measurement helpers (scenario GL): Lambda's billing step, the per-invocation summary, the
v2 events the children send, and the goal's verdict. No timing is asserted."""

from __future__ import annotations

from typing import Any

import pytest

from bench import lambda_gateway as gl
from bench.__main__ import ALL


@pytest.mark.parametrize(("wall_s", "billed"), [
    (0.0, 1), (0.0004, 1), (0.001, 1), (0.0010001, 2), (0.00199, 2), (0.002, 2), (0.0375, 38), (1.0, 1000),
])
def test_an_invocation_is_billed_in_whole_milliseconds_rounded_up_and_at_least_one(wall_s: float, billed: int) -> None:
    assert gl.billed_ms(wall_s) == billed


def test_a_coarser_billing_step_rounds_up_to_it() -> None:
    assert gl.billed_ms(0.0011, step_ms=100) == 100
    assert gl.billed_ms(0.1001, step_ms=100) == 200


def test_the_summary_gives_wall_cpu_and_billed_figures_and_the_share_billed_at_one_millisecond() -> None:
    samples = [(0.0005, 0.0004)] * 97 + [(0.0015, 0.001), (0.0030, 0.002), (0.0100, 0.009)]
    summary = gl.summarize_invocations(samples)
    assert summary["n"] == 100
    assert summary["wall_ms_p50"] == pytest.approx(0.5) and summary["cpu_ms_p50"] == pytest.approx(0.4)
    assert summary["billed_ms_p50"] == 1
    assert summary["billed_ms_p99"] == 3  # nearest rank: the 99th of 100
    assert summary["wall_ms_p99"] == pytest.approx(3.0)
    assert summary["billed_at_goal_share"] == pytest.approx(0.97)
    assert gl.summarize_invocations([]) == {"n": 0}


def test_at_the_deployed_memory_only_the_cpu_time_is_stretched_by_lambdas_cpu_share() -> None:
    """1,024 MB has 1,024 / 1,769 of a vCPU: 0.5 ms of CPU takes 0.86 ms there, a 0.3 ms wait stays 0.3 ms."""
    stretch = gl.FULL_VCPU_MB / gl.DEPLOYED_MEMORY_MB
    cpu_bound = gl.summarize_invocations([(0.0007, 0.0005)] * 10)  # 0.2 + 0.5 * 1.73 = 1.06 ms: billed 2
    waiting = gl.summarize_invocations([(0.0007, 0.0002)] * 10)  # 0.5 + 0.2 * 1.73 = 0.85 ms: billed 1
    assert 0.0002 + 0.0005 * stretch > 0.001 > 0.0005 + 0.0002 * stretch
    assert cpu_bound["billed_ms_p50"] == waiting["billed_ms_p50"] == 1
    assert cpu_bound["deployed_billed_ms_p50"] == 2 and cpu_bound["deployed_billed_at_goal_share"] == 0.0
    assert waiting["deployed_billed_ms_p50"] == 1 and waiting["deployed_billed_at_goal_share"] == 1.0


def test_the_deployed_memory_is_the_gateway_functions() -> None:
    from tests.infra.cfn import load

    template = load(gl.ROOT / "template.yaml")
    assert template["Resources"]["GatewayFunction"]["Properties"]["MemorySize"] == gl.DEPLOYED_MEMORY_MB


def test_percentile_is_the_nearest_rank() -> None:
    assert gl.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert gl.percentile([1.0, 2.0], 99) == 2.0
    assert gl.percentile([], 50) is None


def test_the_events_are_the_real_v2_events_with_the_bench_key_and_the_job_path() -> None:
    submit = gl.submit_event("k-1")
    assert submit["version"] == "2.0" and submit["requestContext"]["http"]["method"] == "POST"
    assert submit["rawPath"] == "/v1/jobs" and submit["headers"]["authorization"] == "Bearer k-1"
    template = gl.get_event("k-1", "job_first")
    get = gl.get_event("k-2", "job_second", template)
    assert get["rawPath"] == get["requestContext"]["http"]["path"] == "/v1/jobs/job_second"
    assert get["headers"]["authorization"] == "Bearer k-2" and get["rawQueryString"] == "wait=0"
    assert template["rawPath"] == "/v1/jobs/job_first"  # the template is copied, not changed


def _section(ratio: float, submit_billed: int, get_billed: int, cpu_ratio: float | None = None) -> dict[str, Any]:
    return {"cold_ratio_to_floor": ratio, "cold_cpu_ratio_to_floor": ratio if cpu_ratio is None else cpu_ratio,
            "gateway": {"submit": {"billed_ms_p50": submit_billed}, "get": {"billed_ms_p50": get_billed}}}


@pytest.mark.parametrize(("section", "met"), [
    (_section(1.25, 1, 1), True), (_section(1.3, 1, 1), True), (_section(1.31, 1, 1), False),
    (_section(1.1, 2, 1), False), (_section(1.1, 1, 2), False), ({"gateway": {}}, False),
    (_section(1.25, 1, 1, cpu_ratio=1.46), False), (_section(1.46, 1, 1, cpu_ratio=1.25), False),
])
def test_the_goal_needs_cold_within_1_3x_the_floor_in_wall_and_cpu_time_and_both_warm_calls_billed_1_ms(
        section: dict[str, Any], met: bool) -> None:
    assert gl.target(section)["met"] is met
    assert gl.target({"lambda_gateway": section})["met"] is met  # the report run() fills, as bench.standalone has it


def test_the_child_environment_drops_the_callers_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "x")
    env = gl.child_env("redis://127.0.0.1:1/0", "q1")
    assert "INFERQ_LOG_LEVEL" not in env and "POWERTOOLS_SERVICE_NAME" not in env  # default settings
    assert env["INFERQ_API_KEYS"] == f"bench:{gl.BENCH_KEY}" and env["INFERQ_QUEUE"] == "q1"
    assert env["INFERQ_REDIS_URL"] == "redis://127.0.0.1:1/0"
    assert "INFERQ_REDIS_URL" not in gl.child_env(None, "q1")


def test_the_scenario_is_registered_under_gl() -> None:
    assert "GL" in ALL
