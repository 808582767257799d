"""Scenario V's request set and verdicts (bench/efficiency.py), without a model server."""

from __future__ import annotations

from typing import Any

from bench.efficiency import aggregate, request_set, verdicts


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
