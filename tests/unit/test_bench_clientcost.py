"""bench.clientcost (part of K): the client's CPU per Redis round trip, inferq's client against asyncio streams and
hiredis on a real Valkey. Checked for what it measures (both read the same record), not for any figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import clientcost
from emulator.valkey import ValkeyProcess


def test_it_measures_both_clients_reading_the_same_record(tmp_path: Path) -> None:
    with ValkeyProcess(tmp_path) as server:
        figures = clientcost.measure(server.url, server.host, server.port, n=200, repeats=2)
    assert figures["inferq_us"]["median"] > 0 and figures["floor_us"]["median"] > 0
    assert figures["ratio"] == pytest.approx(figures["inferq_us"]["median"] / figures["floor_us"]["median"])
    assert "uvloop" in figures["method"]
    assert clientcost.render(figures).startswith("client CPU per Redis round trip (the gateway's job read): ")


async def test_the_floor_must_answer_what_inferqs_client_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clientcost.hiredis, "pack_command", lambda args: b"PING\r\n")  # a floor reading nothing
    with ValkeyProcess(tmp_path) as server, pytest.raises(RuntimeError, match="does not answer"):
        await clientcost._measure(server.url, server.host, server.port, 10, 1)


@pytest.mark.timeout(900)  # callgrind runs Python some 50x slower: about 3 min of CPU, more on a shared machine
def test_client_instructions_count_a_round_trip_of_each_client() -> None:
    counted = clientcost.instructions(small=20, large=120)
    k = counted["kinstructions_per_round_trip"]
    assert set(k) == {"inferq", "inferq_cluster", "floor", "inferq_pipeline", "floor_pipeline"}
    assert all(value > 0 for value in k.values())
    assert k["floor"] < k["inferq"]  # redis-py, however lean, does more than a bare stream and parser
    assert k["floor_pipeline"] < k["inferq_pipeline"]
    assert counted["ratio_to_floor"] == pytest.approx(k["inferq"] / k["floor"], abs=0.01)
    assert counted["pipeline_ratio_to_floor"] == pytest.approx(k["inferq_pipeline"] / k["floor_pipeline"], abs=0.01)
    figures = {"inferq_us": {"median": 2.0, "min": 1.0, "max": 3.0}, "floor_us": {"median": 1.0, "min": 1.0,
               "max": 1.0}, "ratio": 2.0, "instructions": counted}
    assert "in client instructions (callgrind, repeatable): inferq " in clientcost.render(figures)
    assert "(the worker's start): inferq " in clientcost.render(figures)


def test_a_failed_callgrind_run_is_an_error_not_a_figure() -> None:
    with pytest.raises(RuntimeError, match="callgrind run of inferq failed"):
        clientcost._collected("inferq", "redis://127.0.0.1:1/0", 1)  # nothing listens there
