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
