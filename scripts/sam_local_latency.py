"""Latency of requests through `sam local start-api` (docs/benchmarks.md, "sam local"): run `make sam-local`
(with or without `ARGS="--warm-containers LAZY"`), then

    .venv/bin/python scripts/sam_local_latency.py [--requests 20] [--data-dir .inferq/sam-local]

It sends sequential requests to the running stack's API (GET /v1/jobs/<id> with the stack's key, one job submitted
first) and prints the first request's time and the median, p90 and max of the rest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--data-dir", type=Path, default=Path(".inferq/sam-local"))
    args = parser.parse_args(argv)
    state_file = args.data_dir / "sam-local.json"
    if not state_file.exists():
        print(f"no running `make sam-local` with --data-dir {args.data_dir}", file=sys.stderr)
        return 1
    state = json.loads(state_file.read_text())
    headers = {"Authorization": f"Bearer {state['api_key']}"}
    body = {"body": {"model": "mock", "messages": [{"role": "user", "content": "latency"}]}}
    times = []
    with httpx.Client(base_url=state["api"], headers=headers, timeout=120) as client:
        started = time.perf_counter()
        submitted = client.post("/v1/jobs", json=body)
        times.append(time.perf_counter() - started)
        submitted.raise_for_status()
        job = submitted.json()["id"]
        for _ in range(args.requests - 1):
            started = time.perf_counter()
            client.get(f"/v1/jobs/{job}").raise_for_status()
            times.append(time.perf_counter() - started)
    rest = sorted(times[1:])
    p90 = rest[min(len(rest) - 1, int(0.9 * len(rest)))]
    print(f"first {times[0] * 1000:.0f} ms; then {len(rest)} requests: median {statistics.median(rest) * 1000:.0f} "
          f"ms, p90 {p90 * 1000:.0f} ms, max {rest[-1] * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
