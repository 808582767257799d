"""``python -m bench`` (what ``make bench`` runs) as a process: a scenario that needs no stack runs end to end
and writes its report; a scenario name it does not know stops it with a usage error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_the_elasticity_scenario_runs_and_writes_the_report(tmp_path: Path) -> None:
    done = bench("--quick", "--only", "E", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["ok"] and results["failures"] == []
    assert results["part_elasticity"] and (tmp_path / "results.md").exists()
    assert any(row["what"] == "E bench.simulate" for row in results["extra_rows"])


def test_an_unknown_scenario_is_a_usage_error_naming_the_choices(tmp_path: Path) -> None:
    done = bench("--only", "S9", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "unknown scenario(s) ['S9']" in done.stderr and "F,S1,S2,S3,G,W,L,C,D,K,E,B,V" in done.stderr
    assert not (tmp_path / "results.json").exists()


def test_the_floor_scenario_runs_against_its_own_valkey_and_accounts_for_every_job(tmp_path: Path) -> None:
    done = bench("--quick", "--only", "F", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    floor = results["scenarios"]["F"]
    assert results["ok"] and floor["config"]["jobs"] == 400 and (tmp_path / "latency.png").exists()
    assert [run["done"] for run in floor["runs"]] == [400] and floor["valkey"]["total_calls_per_job"] > 0
    http = results["scenarios"]["FH"]  # the HTTP floor, its runs alternated with the floor's
    assert [run["done"] for run in http["runs"]] == [400] and http["runs"][0]["cpu_ms_per_job_by_role"]["gateway"] > 0


def test_the_reference_latency_scenario_runs_through_a_direct_stack(tmp_path: Path) -> None:
    """S2 through Valkey, uvicorn and a worker process: warm-up, the measured run and the script sample."""
    done = bench("--quick", "--only", "S2", "--stack", "direct", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    s2 = results["scenarios"]["S2"]
    assert results["ok"] and [run["done"] for run in s2["runs"]] == [80]
    assert s2["stack"]["mode"] == "direct" and "script_sample" in s2["valkey"]


def test_the_models_scenario_runs_s3s_shape_on_one_model_and_over_two(tmp_path: Path) -> None:
    """M: two emulator stacks, the second with a registry the bench writes and a fleet per model; every job of
    both is accounted for, and the ratio row is reported."""
    done = bench("--quick", "--only", "M", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    one, two = results["scenarios"]["M/one"], results["scenarios"]["M/two"]
    assert results["ok"] and [run["done"] for run in one["runs"]] == [run["done"] for run in two["runs"]] == [400]
    assert two["config"]["models"] == ["chat", "embed"] and "INFERQ_MODELS" in two["stack"]["env"]
    assert "INFERQ_MODELS" not in one["stack"]["env"]
    assert results["models_ratio"]["jobs_per_s_ratio"]["median"] > 0
    assert any(row["what"] == "M two models vs one" for row in results["extra_rows"])
