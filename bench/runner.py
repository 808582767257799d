"""One ``python -m bench`` invocation: the scenario families in order, then the table, the plots and
results.json."""

from __future__ import annotations

import asyncio
import time
import traceback
from typing import Any

from . import report
from .batch_scenario import BatchScenario
from .http_scenarios import HttpScenarios
from .models import ModelScenarios
from .process_scenarios import ProcessScenarios
from .standalone import StandaloneParts


class Bench(HttpScenarios, ModelScenarios, ProcessScenarios, BatchScenario, StandaloneParts):
    """The scenario families of :mod:`bench.__main__`'s docstring over one :class:`bench.session.Session`."""

    async def run_async(self) -> None:
        if {"F", "S1", "S2", "S3", "G", "W", "L"} & self.only or self.args.scale:
            await self._guard("HTTP scenarios", self.http_scenarios())
        if "M" in self.only:
            await self._guard("M models", self.models_scenario())
        if {"C", "D"} & self.only:
            await self._guard("worker cold start / drain", self.cold_and_drain())
        if "B" in self.only:
            await self._guard("B batch", self.batch_scenario())

    async def _guard(self, what: str, coro: Any) -> None:
        try:
            await coro
        except Exception as exc:
            self.fail(f"{what}: {type(exc).__name__}: {exc}")
            self.report.setdefault("tracebacks", {})[what] = traceback.format_exc()

    def run(self) -> int:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console()
        if self.console.width < 160:
            self.console = Console(width=160)
        self.logs.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=self.console, transient=False) as progress:
            self.progress = progress
            if "C" in self.only:
                self.gateway_cold_import()
            try:
                import uvloop

                uvloop.run(self.run_async())
            except ImportError:
                asyncio.run(self.run_async())
            self.others()
        self.report["duration_s"] = round(time.monotonic() - started, 1)
        for scenario in self.report["scenarios"].values():
            if scenario["config"]["kind"] == "burst":
                agg = scenario["aggregate"]["jobs_per_s_to_last_finish"]
                workers = scenario["config"]["workers"]
                scenario["per_worker_jobs_per_s"] = (agg["median"] / workers) if agg["median"] else None
                scenario["target"] = {"text": ">= 3,000/s per worker on the core path: see D (HTTP caps S1 at G)",
                                      "met": None}
        self.report["ok"] = not self.report["failures"]
        paths = report.write(self.report, self.out)
        try:
            paths["plots"] = ", ".join(report.plots(self.report, self.latencies, self.out))
        except Exception as exc:
            self.fail(f"plots: {type(exc).__name__}: {exc}")
        (self.out / "results.json").write_text(__import__("json").dumps(self.report, indent=2, default=str))
        self.console.print(report.terminal_table(self.report))
        if self.report.get("scale"):
            self.console.print("scale-out (--scale): " + self.report["scale"]["setup"], highlight=False)
            self.console.print(self.report["scale"]["markdown"], highlight=False, markup=False)
        for caveat in self.report["caveats"]:
            self.console.print(f"[dim]note: {caveat}[/]")
        if self.report.get("missing_parts"):
            self.console.print(f"[yellow]not present, skipped:[/] {', '.join(self.report['missing_parts'])}")
        self.console.print(f"written: {paths}  ({self.report['duration_s']} s)")
        if self.report["failures"]:
            self.console.print(f"[red]{len(self.report['failures'])} failure(s):[/]")
            for failure in self.report["failures"]:
                self.console.print(f"  - {failure}", highlight=False)
            return 1
        return 0
