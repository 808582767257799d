"""py-spy profiles (``--profile``): recorded from the stack's processes for one run, and summarised: where the
samples' time goes, by category and by frame."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

# Where a sample's time goes, by the innermost frame that matches (first match wins, checked from the leaf up).
CATEGORIES = (
    ("logging (uvicorn access log, log records)", ("logging/", "pythonjsonlogger", "aws_lambda_powertools/logging")),
    ("json encode/decode", ("json/",)),
    ("pydantic validation/serialisation", ("pydantic",)),
    ("redis-py client (commands, pool, parser)", ("redis/", "hiredis")),
    ("inferq queue code", ("inferq/",)),
    ("gateway code (auth, edge, models, telemetry)", ("functions/gateway/",)),
    ("worker code", ("gpu_worker/",)),
    ("FastAPI/Starlette (middleware, routing, dependencies, responses)", ("fastapi/", "starlette/")),
    ("uvicorn HTTP protocol (httptools)", ("uvicorn/",)),
    ("prometheus metrics", ("prometheus_client/",)),
    ("asyncio/uvloop, sockets, timeouts", ("asyncio/", "uvloop", "runners.py")),
)


def _category(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, needles in CATEGORIES:
            if any(needle in frame for needle in needles):
                return name
    return "other"


def profile_summary(path: Path, top: int = 40) -> str:
    """Categories, then self and inclusive shares of the hottest frames, of a py-spy raw (collapsed stacks) file."""
    total = 0
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    categories: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
        category = _category(frames)
        categories[category] = categories.get(category, 0) + n
    if not total:
        return "no samples\n"
    out = [f"{total} samples (idle excluded)", "", "by category (innermost matching frame):"]
    out += [f"{100 * v / total:5.1f}%  {k}" for k, v in sorted(categories.items(), key=lambda kv: -kv[1])]
    out += ["", "self:"]
    out += [f"{100 * v / total:5.1f}%  {k}" for k, v in sorted(own.items(), key=lambda kv: -kv[1])[:top]]
    out += ["", "inclusive:"]
    out += [f"{100 * v / total:5.1f}%  {k}" for k, v in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top * 2]]
    return "\n".join(out) + "\n"


def start_profilers(tool: str, pids: dict[str, list[int]], folder: Path, key: str
                    ) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """py-spy (``tool``) on the gateway and each worker of ``pids`` (by role): collapsed stacks in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    started = []
    for role, role_pids in pids.items():
        if role not in ("gateway", "worker"):
            continue
        for k, pid in enumerate(role_pids):
            path = folder / f"{key.replace('/', '-')}-{role}{k}.txt"
            process = subprocess.Popen([tool, "record", "-p", str(pid), "-o", str(path), "-f", "raw", "-r", "200",
                                        "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            started.append((process, path))
    time.sleep(0.5)  # py-spy attaches
    return started


def stop_profilers(profilers: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    """Stop each recording and write its summary beside it (``.top.txt``)."""
    for process, path in profilers:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        if path.exists():
            path.with_suffix(".top.txt").write_text(profile_summary(path))
