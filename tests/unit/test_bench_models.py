"""Scenario M's parts (bench.models): the closed loops name the models in turn, the registry it writes is one the
processes accept, and two models over one is the ratio of the medians with the run pairs' spread."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from bench import clients, load, models
from inferq.config.registry import load as load_registry
from inferq.config.settings import Settings

from .test_bench_load import FakeGateway


class RecordingGateway(FakeGateway):
    def __init__(self) -> None:
        super().__init__()
        self.models: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["method"] == "POST":
            message = await receive()
            self.models.append(json.loads(message["body"])["body"]["model"])
        await super().__call__(scope, receive, send)


async def test_the_closed_loops_jobs_name_each_model_in_turn() -> None:
    app = RecordingGateway()
    bodies = [{"body": {**load.job_body()["body"], "model": m}} for m in models.MODELS]
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with clients.ClientPool([clients.make_client("http://127.0.0.1:1", "k", 8, transport=transport)]) as pool:
        result = await load.closed_loop(pool, 40, 4, load.job_body(), bodies=bodies)
    assert result.ok and result.done == 40
    assert sorted(app.models) == sorted(["chat", "embed"] * 20)


def test_the_registry_it_writes_has_both_models_on_their_own_queues(tmp_path: Path) -> None:
    path = models.write_registry(tmp_path)
    registry = load_registry(Settings(models=str(path)))
    assert registry is not None
    assert [(m.name, m.queue) for m in registry.models] == [("chat", "chat"), ("embed", "embed")]
    assert registry.primary.name == "chat"


def entry(jobs_per_s: list[float], p95: list[float]) -> dict[str, Any]:
    runs = [{"jobs_per_s": j, "queue_to_done_ms": {"p95": p}} for j, p in zip(jobs_per_s, p95, strict=True)]
    return {"runs": runs, "aggregate": {"jobs_per_s": {"median": sorted(jobs_per_s)[1]},
                                        "queue_to_done_ms.p95": {"median": sorted(p95)[1]}}}


def test_two_over_one_is_the_ratio_of_medians_with_the_pairs_spread() -> None:
    one = entry([100.0, 110.0, 90.0], [50.0, 40.0, 60.0])
    two = entry([95.0, 110.0, 99.0], [50.0, 44.0, 60.0])
    found = models.ratios(one, two)
    assert found["jobs_per_s_ratio"]["median"] == 99.0 / 100.0
    assert (found["jobs_per_s_ratio"]["min"], found["jobs_per_s_ratio"]["max"]) == (0.95, 1.1)
    assert found["p95_ratio"]["median"] == 1.0 and found["p95_ratio"]["max"] == 1.1
    assert found["target"]["met"] is True
    slower = models.ratios(one, entry([80.0, 85.0, 70.0], [50.0, 40.0, 60.0]))
    assert slower["target"]["met"] is False
    assert "two/one: jobs/s 0.80 (0.77-0.80)x, p95 1.00x" in models.fmt_ratios(slower)
