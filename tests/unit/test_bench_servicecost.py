"""bench.servicecost (part of K): the gateway's and a worker's instructions per job under callgrind. Checked for
what it counts and that it counts the same twice, not for any figure."""

from __future__ import annotations

import pytest

from bench import servicecost


def test_it_counts_the_gateway_and_a_worker_and_the_same_again() -> None:
    assert servicecost.available() is None, "valgrind is a Debian package every machine here has"
    first = servicecost.measure(loops=8, n=150, warm=30)
    k = first["kinstructions_per_job"]
    assert set(k) == {"gateway", "worker"}
    # a job is two HTTP requests and a few Redis round trips for the gateway, a start and a finish for the worker:
    # each costs some hundreds of thousands of instructions, far more than nothing and far less than a second's worth
    assert all(100 < k[role] < 20_000 for role in k), k
    again = servicecost._counted("gateway", 8, 150, 30) / 1000
    assert again == pytest.approx(k["gateway"], rel=0.05)
    assert servicecost.render(first).startswith("gateway and worker instructions per job (callgrind, S3's shape")


def test_without_valgrind_the_figure_is_left_out_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(servicecost, "available", lambda: "valgrind not installed")
    cost = servicecost.measure()
    assert cost == {"skipped": "valgrind not installed"}
    assert servicecost.render(cost) == "gateway and worker instructions per job: not measured (valgrind not installed)"
