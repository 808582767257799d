"""Scenario B: one OpenAI batch end to end through ``inferq up`` (``make bench``; ``--only B``).

Each run uploads a JSONL file of no-op chat lines (mock 0 ms) with ``POST /v1/files``, creates the batch, polls
``GET /v1/batches/{id}`` until it ends, and reads the output file back to check that every ``custom_id`` was
answered once. Reported: the wall time from create to ``completed`` and lines/s over it (median of the runs,
min-max), the upload's time, and the gateway's peak RSS (``VmHWM``: the most it ever held, the whole stack's life),
so a batch's size is seen not to grow the gateway's memory. Plain HTTP (httpx), as the ``openai`` client sends it.

With it, no stack: the batch driver's validation and expansion of large input files (:data:`LARGE_FILES`, made on
the fly in a temporary directory, each measured in a fresh process): peak RSS and time, against the scaler
Lambda's 256 MB and a step's deadline.
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


# ---------------------------------------------------------------------- large input files (no stack)

LAMBDA_MEMORY_MB = 256
"""The scaler Lambda's memory (template.yaml), where the driver validates and expands batches."""
LAMBDA_CPU_SHARE = 256 / 1769
"""Lambda gives a function CPU in proportion to its memory: a full vCPU at 1,769 MB."""
LARGE_FILES = {
    # name: (what, bytes (about), lines)
    "50k_lines": ("200 MB, 50,000 lines of 4 KB", 200_000_000, 50_000),
    "one_line": ("one 200 MB line", 200_000_000, 1),
    "million_tiny": ("1,000,000 tiny lines (over INFERQ_BATCH_MAX_LINES: refused)", 0, 1_000_000),
    "duplicates": ("50,000 lines, 2 custom_ids (refused: duplicates; error file written)", 0, 50_000),
}


def write_large_file(kind: str, path: Path, scale: float = 1.0) -> int:
    """One of :data:`LARGE_FILES` at ``path`` (``scale`` < 1 for a quick run), written a line at a time; its size."""
    _, size, count = LARGE_FILES[kind]
    count = max(1, int(count * scale))
    size = int(size * scale)
    with path.open("wb") as out:
        if kind == "one_line":
            head = b'{"custom_id":"big","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":' \
                   b'[{"role":"user","content":"'
            out.write(head)
            block = b"x" * (1 << 20)
            for _ in range(size // len(block)):
                out.write(block)
            out.write(b'"}]}}\n')
        else:
            filler = "x" * (size // count - 120) if size else ""
            for i in range(count):
                custom_id = f"c{i % 2}" if kind == "duplicates" else f"c{i}"
                out.write(json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                                      "body": {"model": "m", "messages": [{"role": "user", "content": filler}]}},
                                     separators=(",", ":")).encode() + b"\n")
    return path.stat().st_size


class LocalFile:
    """The store protocol's reading side over one local file (the driver's reads, without S3)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def chunks(self, tenant: str, file_id: str, start: int = 0) -> Any:
        from functions.storage import READ_CHUNK_BYTES

        with self.path.open("rb") as f:
            f.seek(start)
            while chunk := f.read(READ_CHUNK_BYTES):
                yield chunk


def measure_file(path: Path) -> dict[str, Any]:
    """In this process (a fresh one per file): validate the file as the driver does, then expand it (every chunk
    read, parsed and encoded as for enqueueing, without Redis) or, refused, write its error file to nowhere; the
    peak RSS and the time of each."""
    import resource

    from inferq.batches import driver as batch_driver
    from inferq.batches.lines import Validator, parse_line, scan_lines, validate
    from inferq.batches.records import error_line
    from inferq.batches.store import line_custom_id, read_lines
    from inferq.config.settings import Settings
    from inferq.queue import claimcheck

    settings = Settings()
    store = LocalFile(path)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    checked = validate(store.chunks("t", "f"), "/v1/chat/completions", settings.batch_max_lines,
                       settings.max_body_bytes)
    validate_s = time.perf_counter() - t0
    after_validate = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t1 = time.perf_counter()
    lines = 0
    if checked.too_many or checked.count == 0:
        outcome = "refused: " + (checked.errors[-1].code if checked.errors else "empty_file")
    elif checked.bad:
        outcome = f"refused: {checked.bad} invalid lines; error file of every line written"
        again = Validator("/v1/chat/completions", settings.batch_max_lines)
        for line in scan_lines(store.chunks("t", "f"), 0, settings.max_body_bytes):
            error = again.check(line)
            entry = error_line(line_custom_id(line), error.code if error else "batch_failed",
                               error.message if error else "not run")
            json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode()  # written to nowhere
            lines += 1
    else:
        outcome = f"{checked.count} request(s) expanded"
        offset = 0
        while True:
            chunk = read_lines(store, "t", "f", offset, batch_driver.CHUNK_LINES, max_line=settings.max_body_bytes,
                               max_bytes=batch_driver.CHUNK_BYTES)
            if not chunk:
                break
            for line in chunk:
                if line.data is not None:
                    request, _ = parse_line(line.data, "/v1/chat/completions", 0)
                    if request is not None:
                        claimcheck.encode(request["body"])
                lines += 1
            offset = chunk[-1].end
    second_s = time.perf_counter() - t1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"outcome": outcome, "validate_s": round(validate_s, 2), "expand_or_error_file_s": round(second_s, 2),
            "lines_after": lines, "rss_at_start_mb": round(base, 1), "peak_rss_validate_mb": round(after_validate, 1),
            "peak_rss_mb": round(peak, 1)}


def large_files(scale: float = 1.0, on_file: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Each of :data:`LARGE_FILES` generated in a temporary directory and measured in a process of its own."""
    import subprocess
    import sys
    import tempfile

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="inferq-bench-batch-") as tmp:
        for kind, (what, _, _) in LARGE_FILES.items():
            if on_file is not None:
                on_file(what)
            path = Path(tmp) / f"{kind}.jsonl"
            size = write_large_file(kind, path, scale)
            run = subprocess.run(
                [sys.executable, "-c", "import json, sys; from pathlib import Path; from bench.batch import "
                 "measure_file; print(json.dumps(measure_file(Path(sys.argv[1]))))", str(path)],
                capture_output=True, text=True, timeout=900, check=False)
            path.unlink()
            if run.returncode != 0:
                results[kind] = {"what": what, "bytes": size, "error": run.stderr[-2000:]}
                continue
            figures = json.loads(run.stdout.strip().splitlines()[-1])
            seconds = figures["validate_s"] + figures["expand_or_error_file_s"]
            results[kind] = {"what": what, "bytes": size, **figures,
                             "lambda_s_estimate": round(seconds / LAMBDA_CPU_SHARE, 1)}
    return results


def large_files_row(results: dict[str, Any], step_s: float) -> dict[str, str]:
    """The report's row: peak RSS and time per file, against the scaler Lambda's memory and a step's deadline."""
    parts = []
    for r in results.values():
        if "error" in r:
            parts.append(f"{r['what']}: ERROR")
            continue
        parts.append(f"{r['what']} ({r['bytes'] / 1e6:.0f} MB): peak RSS {r['peak_rss_mb']:.0f} MB "
                     f"(start {r['rss_at_start_mb']:.0f}), validate {r['validate_s']:.1f} s + "
                     f"{r['expand_or_error_file_s']:.1f} s, {r['outcome']}; ~{r['lambda_s_estimate']:.0f} s at "
                     f"Lambda's {LAMBDA_MEMORY_MB} MB CPU share")
    worst = max((r.get("peak_rss_mb", 0) for r in results.values()), default=0)
    return {"what": "B' large batch input files (driver's validation and expansion, no S3)",
            "setup": f"files made on the fly; the scaler Lambda has {LAMBDA_MEMORY_MB} MB and a step "
                     f"{step_s:.0f} s at most",
            "figures": "; ".join(parts) + f". Limit: memory is flat ({worst:.0f} MB peak of {LAMBDA_MEMORY_MB}); "
                       "time is what bounds a file: validation must fit one step"}
