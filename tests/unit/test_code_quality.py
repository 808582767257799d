"""ruff and mypy clean, as docs/development.md asks: checked in the suite so CI holds the line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_ruff_is_clean() -> None:
    proc = subprocess.run([str(BIN / "ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_clean() -> None:
    packages = [p for p in ("inferq", "functions", "gpu_worker", "emulator") if (ROOT / p).exists()]
    proc = subprocess.run([sys.executable, "-m", "mypy", *packages], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
