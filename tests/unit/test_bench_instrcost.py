"""bench.instrcost (part of K): the protocol's server instructions per job under callgrind. Checked for what it
counts and that it counts the same twice, not for any figure."""

from __future__ import annotations

import pytest

from bench import instrcost


def test_it_counts_every_phase_and_the_floor_and_the_same_again() -> None:
    assert instrcost.available() is None, "valgrind is a Debian package every machine here has"
    first, second = instrcost.measure(100), instrcost.measure(100)
    k = first["kinstructions_per_job"]
    assert set(k) == {"enqueue", "start", "finish", "read", "total"}
    assert all(k[name] > 0 for name in k)
    assert abs(k["total"] - sum(k[name] for name in ("enqueue", "start", "finish", "read"))) < 0.5
    assert first["floor_kinstructions_per_job"] > 0 and first["ratio_to_floor"] > 1  # the floor does less
    contract = first["contract_kinstructions_per_job"]
    assert set(contract) == set(k) and all(contract[name] > 0 for name in contract)
    # the contract's keys written without scripts or checks: more than the floor's commands, less than inferq's
    assert first["ratio_to_floor"] > first["contract_ratio_to_floor"] > 1
    for name, value in k.items():  # instructions, not seconds: the same work counts (nearly) the same
        assert second["kinstructions_per_job"][name] == pytest.approx(value, rel=0.05), name
        assert second["contract_kinstructions_per_job"][name] == pytest.approx(contract[name], rel=0.05), name
    # usage metering off beside on, in the same run: the same phases, the difference its cost
    off = first["metering"]["off_kinstructions_per_job"]
    assert set(off) == set(k) and all(off[name] > 0 for name in off)
    assert first["metering"]["overhead"] == pytest.approx(k["total"] / off["total"] - 1, abs=1e-3)
    assert second["metering"]["off_kinstructions_per_job"]["total"] == pytest.approx(off["total"], rel=0.05)
    assert instrcost.render(first).startswith("server instructions per job (callgrind, repeatable): ")
    assert "usage metering off" in instrcost.render(first)


def test_a_dump_is_read_by_its_totals_line() -> None:
    assert instrcost.total_instructions("version: 1\nevents: Ir\nsummary: 12345\n") == 12345
    assert instrcost.total_instructions("events: Ir\ntotals: 77\n") == 77
    with pytest.raises(ValueError, match="not a callgrind dump"):
        instrcost.total_instructions("events: Ir\n")


def test_without_valgrind_the_figure_is_left_out_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instrcost.shutil, "which", lambda tool: None)
    cost = instrcost.measure(100)
    assert cost == {"skipped": "valgrind, callgrind_control, vgdb not installed (Debian: apt install valgrind)"}
    assert instrcost.render(cost).startswith("server instructions per job: not measured (")
