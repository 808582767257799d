"""Scenario B: one OpenAI batch end to end through ``inferq up`` (``make bench``; ``--only B``).

Each run uploads a JSONL file of no-op chat lines (mock 0 ms) with ``POST /v1/files``, creates the batch, polls
``GET /v1/batches/{id}`` until it ends, and reads the output file back to check that every ``custom_id`` was
answered once. Reported: the wall time from create to ``completed`` and lines/s over it (median of the runs,
min-max), the upload's time, and the gateway's peak RSS (``VmHWM``: the most it ever held, the whole stack's life),
so a batch's size is seen not to grow the gateway's memory. Plain HTTP (httpx), as the ``openai`` client sends it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from . import report
from .stack import Stack

ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
POLL_S = 0.5
RUN_DEADLINE_S = 900.0
"""A 10,000-line batch takes well under a minute here; past this the run is reported as a failure."""


def batch_lines(count: int, latency_ms: int = 0) -> bytes:
    """The input file: ``count`` chat lines with ``custom_id`` ``line-0`` .. ``line-{count-1}``."""
    lines = []
    for i in range(count):
        body = {"model": "mock", "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 8,
                "mock": {"latency_ms": latency_ms}}
        lines.append(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                                 "body": body}, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode()


def answered_once(output: bytes, count: int) -> str | None:
    """Why the output file is not one answer per line (None when it is): every ``custom_id`` of
    :func:`batch_lines` exactly once, each with status 200."""
    seen: dict[str, int] = {}
    for raw in output.splitlines():
        if not raw.strip():
            continue
        line = json.loads(raw)
        seen[line["custom_id"]] = seen.get(line["custom_id"], 0) + 1
        status = (line.get("response") or {}).get("status_code")
        if status != 200:
            return f"{line['custom_id']} answered {status}: {line.get('error')}"
    twice = sorted(k for k, n in seen.items() if n > 1)
    if twice:
        return f"{len(twice)} custom_id(s) answered more than once, e.g. {twice[0]}"
    missing = count - len(seen)
    return f"{missing} line(s) not answered" if missing else None


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median and min-max over the runs of wall time, lines/s and upload time."""
    return {
        "wall_s": report.spread([r.get("wall_s") for r in runs]),
        "lines_per_s": report.spread([r.get("lines_per_s") for r in runs]),
        "upload_s": report.spread([r.get("upload_s") for r in runs]),
    }


def peak_rss_mb(pids: Sequence[int]) -> float | None:
    """The largest peak resident set (``VmHWM``) among ``pids``, in MB; None when none can be read."""
    peaks = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for row in status.splitlines():
            if row.startswith("VmHWM:"):
                peaks.append(int(row.split()[1]) / 1024)
    return max(peaks) if peaks else None


async def run_once(st: Stack, data: bytes, count: int, on_progress: Callable[[int], None]) -> dict[str, Any]:
    """Upload, create, poll to the end, check the output. The figures of one run, or ``error``."""
    async with httpx.AsyncClient(base_url=st.url, headers=st.headers, timeout=60) as http:
        t0 = time.perf_counter()
        uploaded = await http.post("/v1/files", files={"file": ("bench.jsonl", data)}, data={"purpose": "batch"})
        if uploaded.status_code != 200:
            return {"error": f"upload answered {uploaded.status_code}: {uploaded.text[:300]}"}
        t1 = time.perf_counter()
        created = await http.post("/v1/batches", json={"input_file_id": uploaded.json()["id"],
                                                       "endpoint": "/v1/chat/completions", "completion_window": "24h"})
        if created.status_code != 200:
            return {"error": f"create answered {created.status_code}: {created.text[:300]}"}
        batch = created.json()
        done = 0
        while batch["status"] not in ENDED:
            if time.perf_counter() - t1 > RUN_DEADLINE_S:
                return {"error": f"{batch['id']} still {batch['status']} after {RUN_DEADLINE_S:.0f} s"}
            await asyncio.sleep(POLL_S)
            answer = await http.get(f"/v1/batches/{batch['id']}")
            if answer.status_code != 200:
                continue  # a 503 while Redis is busy: poll again
            batch = answer.json()
            counts = batch["request_counts"]
            ended = counts["completed"] + counts["failed"]
            on_progress(ended - done)
            done = ended
        wall = time.perf_counter() - t1
        if batch["status"] != "completed":
            return {"error": f"{batch['id']} ended {batch['status']}: {batch.get('errors')}"}
        output = await http.get(f"/v1/files/{batch['output_file_id']}/content")
        problem = answered_once(output.content, count)
        if problem:
            return {"error": f"{batch['id']}: {problem}"}
        return {"batch": batch["id"], "lines": count, "upload_s": round(t1 - t0, 3), "wall_s": round(wall, 3),
                "lines_per_s": round(count / wall, 1), "request_counts": batch["request_counts"]}
