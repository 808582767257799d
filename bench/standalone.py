"""The parts of the bench with a ``run`` function of their own (bench.lambda_gateway, bench.worker, bench.core,
bench.simulate, bench.sim_realloop, bench.sim_boot, bench.efficiency, bench.streaming, bench.fairshare), each run in
turn with its output kept, and its figures (and its goal's verdict, where it states one) added to the table."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from . import report
from .session import Session
from .summary import core_target, dig


class StandaloneParts(Session):
    def others(self) -> None:
        """The other engineers' parts, by their ``run`` functions, when they exist."""
        quick = self.args.quick
        parts: list[tuple[str, str, str]] = [("GL", "bench.lambda_gateway", "lambda_gateway"),
                                             ("D", "bench.worker", "worker"),
                                             ("K", "bench.core", "core"), ("E", "bench.simulate", "elasticity"),
                                             ("R", "bench.sim_realloop", "realloop"),
                                             ("T", "bench.sim_boot", "boot"),
                                             ("V", "bench.efficiency", "efficiency"),
                                             ("ST", "bench.streaming", "streaming"),
                                             ("FS", "bench.fairshare", "fairshare")]
        for key, module_name, section in parts:
            if key not in self.only:
                continue
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name == module_name:
                    self.report.setdefault("missing_parts", []).append(module_name)
                    continue
                raise
            task = self.progress.add_task(f"{key} {module_name}", total=None)
            try:
                params = inspect.signature(module.run).parameters
                kwargs: dict[str, Any] = {"quick": quick} if "quick" in params else {}
                if "out_dir" in params:
                    kwargs["out_dir"] = self.out
                section_report: dict[str, Any] = {}
                with contextlib.redirect_stdout(_Tee(self.logs / f"{section}.txt")):
                    returned = module.run(section_report, **kwargs)
                self.report[f"part_{section}"] = section_report or returned
                text = _elasticity_lines(self.report[f"part_{section}"]) if section == "elasticity" else None
                if text is None and hasattr(module, "render"):
                    with contextlib.suppress(Exception):
                        text = module.render(returned)
                if text is None:
                    text = (self.logs / f"{section}.txt").read_text()[-1500:]
                text = re.sub(r"\s*\[[^\]]*\]", "", text)  # method notes in brackets: kept in results.json
                row = {"what": f"{key} {module_name}", "setup": f"run(report, quick={quick})", "figures": text.strip()}
                if module_name == "bench.worker":
                    part = self.report[f"part_{section}"]
                    target = core_target(dig(part, "mock_0ms_end_to_end.jobs_per_s"))
                    row.update(target=target["text"] + " (mock 0 ms end to end, 1 worker)",
                               verdict=report.verdict(target))
                    by_window = {w: dig(r, "jobs_per_s") for w, r in (part.get("mock_5ms_by_window") or {}).items()}
                    if by_window:
                        self.report["throughput_vs_window"]["bench.worker: mock 5 ms, no HTTP"] = {
                            w: {"median": v, "min": v, "max": v} for w, v in by_window.items() if v is not None}
                if hasattr(module, "target"):  # a part that states its own goal (bench.lambda_gateway)
                    goal = module.target(self.report[f"part_{section}"])
                    row.update(target=goal["text"], verdict=report.verdict(goal))
                self.report["extra_rows"].append(row)
            except Exception as exc:
                self.fail(f"{module_name}.run raised {type(exc).__name__}: {exc}")
                self.report.setdefault("tracebacks", {})[module_name] = traceback.format_exc()
            finally:
                self.progress.update(task, visible=False)


class _Tee:
    """stdout for another part's ``run``: kept in a file and passed through."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("w")
        self.stdout = sys.stdout

    def write(self, text: str) -> int:
        self.file.write(text)
        self.file.flush()
        return self.stdout.write(text)

    def flush(self) -> None:
        self.file.flush()
        self.stdout.flush()


def _elasticity_lines(section: dict[str, Any]) -> str | None:
    section = section.get("elasticity", section)
    targets, results = section.get("targets"), section.get("results", {})
    if not targets:
        return None
    lines = []
    for key, t in targets.items():
        name = results.get(key, {}).get("name", key)
        lines.append(f"{name}: {t['gpu_saving_vs_always_on']:.0%} fewer GPU-minutes than always-on, p95 wait "
                     f"{t['p95_ratio_vs_always_on']:.2f}x always-on; vs {t['against']}: fewer GPU-minutes "
                     f"{t['fewer_gpu_minutes_than_keda']}, p95 not worse {t['p95_not_worse_than_keda']} -> "
                     f"{'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)
