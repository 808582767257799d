"""``python -m bench`` (``make bench``): start the stack, run the scenarios, print the table, write bench/out/.

Scenarios (``--only`` takes a comma-separated subset):

- F   the floor: a bare Redis Streams queue with S3's shape (bench.floor); S3 and S2 are reported as ratios to it
- S1  throughput: no-op jobs (mock 0 ms) by concurrent clients, fleet fixed at 1 and 2 workers
- S2  latency, the reference: 80 jobs, mock 5 ms, 4 closed loops, 1 worker, window 4
- S3  latency under load: 2,000 jobs, mock 5 ms, 32 closed loops, 1 worker, window 32
- G   the gateway alone: submits/s into one uvicorn process, no workers (reported; not a target: the deployed
      gateway is the Lambda, GL)
- M   several models against one (bench.models): S3's shape on one queue with 2 workers x window 16, and split
      over two models of a registry, 1 worker x window 16 each; jobs/s, p95 and two over one
- W   throughput vs window: S3's shape at windows 1, 4, 8, 32 (1 run each)
- L   the default log level (INFO, as make up runs) against WARNING: S3's shape, two stacks, runs alternated
- GL  the gateway as Lambda runs it (bench.lambda_gateway): cold start (fresh interpreter, import + first submit
      through the handler) and warm submit/get per invocation in billed ms, beside a minimal FastAPI + Mangum app
- C   cold start: gateway module import and worker process start -> first job taken
- D   worker drain, the core path without HTTP: pre-loaded jobs, 1 and 2 worker processes (bench.worker too,
      when present)
- K   core ceiling (bench.core)
- E   elasticity simulation (bench.simulate, when present)
- R   the simulator against the real loop (bench.sim_realloop): a short bursty trace on `inferq up` with an
      emulated GPU boot (real scaler, moto ECS, the emulator's agent, mock service times) beside the
      simulator's prediction for the same trace: worker-seconds and p95 wait, and whether they agree
- T   a worker's boot with vLLM CPU and the tiny model (bench.sim_boot): task start -> first job, split into
      process start and imports, the engine's start and model load, warm-up, /health and the worker's part;
      the worker after /health (as the ECS task runs) and beside the server (skipped without the vllm venv)
- B   one OpenAI batch of 10,000 lines (--quick: 1,000), mock 0 ms, 2 workers, window 32, through the Files and
      Batches API of `inferq up` (bench.batch): wall time create -> completed, lines/s, the gateway's peak RSS;
      then the batch driver on large input files (200 MB / 50,000 lines, one 200 MB line, 1,000,000 lines,
      duplicate ids; --quick: a tenth of each): peak RSS and time against the scaler Lambda's 256 MB
- V   efficiency against the real vLLM on CPU (bench.efficiency): output tokens/s straight to the server at its
      best concurrency vs through inferq with static windows and INFERQ_WINDOW=auto
- ST  streaming (bench.streaming): Valkey instructions of a streamed 500-token job (its output followed by a
      reader) beside an unstreamed one (callgrind), and the time to first token through inferq beside vLLM
      streamed directly (the real vLLM on CPU; skipped without the vllm venv)
- FS  fair share inside a lane (bench.fairshare), beside first come, first served in the same run: one job behind
      another tenant's backlog of 5,000, a light tenant's p95 queue wait beside a 10x backlog, GPU shares of three
      tenants weighted 1:2:4, and the Valkey instructions per job with fair share on and off (callgrind)

Every HTTP scenario (and F) reports CPU per job by role and gateway + workers + Valkey as one figure, and
Valkey's command time per job by command (bench.valkeystats). ``--scale`` adds the scale-out grid (bench.scale).

Every job is accounted for (bench.load); any error, lost job or crashed scenario is printed and the exit status
is 1. A missed target is reported, not an error.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from . import scale
from .runner import Bench
from .stack import ROOT

ALL = ("F", "S1", "S2", "S3", "G", "W", "L", "C", "D", "K", "E", "B", "V", "M", "GL", "R", "T", "ST", "FS")


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.startswith(("INFERQ_", "UVICORN_")):
        raise argparse.ArgumentTypeError(f"expected INFERQ_NAME=VALUE, got {text!r}")
    return name, value


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small counts, 1 repeat")
    parser.add_argument("--repeats", type=int, help="runs per scenario (default 3; --quick 1)")
    parser.add_argument("--only", type=lambda s: [p.strip().upper() for p in s.split(",") if p.strip()],
                        default=list(ALL), help=f"comma-separated subset of {','.join(ALL)} (S1 covers both fleets)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out", help="output folder (bench/out)")
    parser.add_argument("--stack", choices=("emulator", "direct"), default="emulator",
                        help="emulator: inferq up (default); direct: Valkey + uvicorn + workers without it")
    parser.add_argument("--log-level", default=None,
                        help="INFERQ_LOG_LEVEL of the stack under test, for comparisons (default: the stack's own "
                             "default, INFO, as make up runs it; scenario L measures INFO against WARNING)")
    parser.add_argument("--log-debug", action="store_true",
                        help="L also measures INFERQ_LOG_LEVEL=DEBUG (an access line per request) against WARNING")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="load generator's HTTP client: raw (bench.load.RawClient, keep-alive, light: the "
                             "default) or httpx (AsyncClient, ~1 ms CPU per request here)")
    parser.add_argument("--env", action="append", default=[], type=_env_pair, metavar="INFERQ_NAME=VALUE",
                        help="extra setting for the stack under test (repeatable); the caller's own INFERQ_* "
                             "environment is not passed on")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy the gateway and workers during the first run of each HTTP scenario "
                             "(out/profiles/)")
    parser.add_argument("--py-spy", help="path of py-spy (default: on PATH)")
    parser.add_argument("--scale", nargs="?", const="auto", default=None, metavar="GxWxL,...",
                        help="scale-out grid after the scenarios: gateways (uvicorn --workers) x worker processes x "
                             "load generator processes on the direct stack, e.g. 1x1x1,2x2x2,4x2x4 (no value: the "
                             "issue's grid cut to this machine's cores); off by default")
    args = parser.parse_args(argv)
    if args.scale is not None:
        try:
            auto = args.scale == "auto"
            args.scale = scale.default_grid(os.cpu_count() or 1) if auto else scale.parse_grid(args.scale)
        except ValueError as exc:
            parser.error(f"--scale: {exc}")
    unknown = set(args.only) - set(ALL)
    if unknown:
        parser.error(f"unknown scenario(s) {sorted(unknown)}; choose from {','.join(ALL)}")
    return args


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds the ``with Stack`` blocks: every stack started is stopped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    signal.signal(signal.SIGTERM, _terminate)
    return Bench(args).run()


if __name__ == "__main__":
    raise SystemExit(main())
