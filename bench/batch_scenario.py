"""Scenario B: an OpenAI batch through the Files and Batches API on ``inferq up`` (the only stack with a files
bucket: moto's S3), then large input files validated and expanded by the driver's steps (:mod:`bench.batch`)."""

from __future__ import annotations

import asyncio
from typing import Any

from . import batch, report
from .session import Session

BATCH_LINES = 10_000
BATCH_LINES_QUICK = 1_000
BATCH_WORKERS = 2
BATCH_WINDOW = 32


class BatchScenario(Session):
    async def batch_scenario(self) -> None:
        """Scenario B (bench.batch). Always on ``inferq up``: only the emulator has the files bucket (moto's S3)."""
        count = BATCH_LINES_QUICK if self.args.quick else BATCH_LINES
        data = batch.batch_lines(count)
        repeats = self.sizes.repeats
        task = self.progress.add_task(f"B batch of {count:,} lines x{repeats}", total=count * repeats)
        runs: list[dict[str, Any]] = []
        with self.stack("batch", BATCH_WORKERS, BATCH_WINDOW, mode="emulator") as st:
            rss_before = batch.peak_rss_mb(st.pids()["gateway"])
            for _ in range(repeats):
                result = await batch.run_once(st, data, count, lambda k: self.advance(task, k))
                if "error" in result:
                    self.fail(f"B: {result['error']}")
                runs.append(result)
            rss_peak = batch.peak_rss_mb(st.pids()["gateway"])
            described = st.describe()
        self.progress.update(task, visible=False)
        ok = [r for r in runs if "error" not in r]
        summary = batch.summarize(ok)
        self.report["batch"] = {"lines": count, "input_bytes": len(data), "workers": BATCH_WORKERS,
                                "window": BATCH_WINDOW, "stack": described, "runs": runs, "aggregate": summary,
                                "gateway_peak_rss_mb": {"after_start": rss_before, "after_runs": rss_peak}}
        rss = ("" if rss_peak is None else
               f"; gateway peak RSS {rss_peak:.0f} MB (at start {rss_before or 0:.0f} MB)")
        self.report["extra_rows"].append({
            "what": "B batch (Files + Batches API)",
            "setup": f"{count:,} lines x{len(ok)}, {len(data) / 1e6:.1f} MB, {BATCH_WORKERS} workers, window "
                     f"{BATCH_WINDOW}, mock 0 ms, inferq up",
            "figures": f"create -> completed {report.fmt_spread(summary['wall_s'], 1)} s, "
                       f"{report.fmt_spread(summary['lines_per_s'])} lines/s; upload "
                       f"{report.fmt_spread(summary['upload_s'], 2)} s{rss}"})

        from inferq.batches.driver import STEP_MAX_S

        task = self.progress.add_task("B large input files", total=len(batch.LARGE_FILES))
        large = await asyncio.to_thread(batch.large_files, 0.1 if self.args.quick else 1.0,
                                        lambda _: self.advance(task, 1))
        self.progress.update(task, visible=False)
        for kind, result in large.items():
            if "error" in result:
                self.fail(f"B large file {kind}: {result['error'][-300:]}")
        self.report["batch_large_files"] = large
        self.report["extra_rows"].append(batch.large_files_row(large, STEP_MAX_S))
