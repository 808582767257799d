"""``inferq interrupt``: interrupt a worker of ``inferq up`` as EC2 Spot interrupts an instance.

ECS drains a Spot instance on its two-minute interruption notice: the task gets SIGTERM (SIGKILL after its stop
timeout or the notice), stops counting as running, and the service starts its replacement at once. The emulator's
ECS agent does the same for the worker named (by default the longest-running one), through its control endpoint,
``POST /interrupt`` on the agent's address that ``inferq up`` writes into ``--data-dir/endpoints.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx

NOTICE_S = 120.0


class InterruptError(Exception):
    """Nothing to interrupt, or no emulator to ask; printed as one line."""


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="inferq interrupt", description=__doc__.split("\n")[0])
    parser.add_argument("worker", nargs="?", help="the worker id (worker-1, ...; default: the longest-running one)")
    parser.add_argument("--notice", type=float, default=NOTICE_S,
                        help=f"seconds before the worker is killed, at most (default {NOTICE_S:g}, EC2's notice; "
                        "its stop timeout is shorter when INFERQ_DRAIN_S is)")
    parser.add_argument("--data-dir", type=Path, default=Path(".inferq"), help="inferq up's --data-dir")
    args = parser.parse_args(argv)
    if not 0 <= args.notice <= 3600:
        parser.error("--notice must be from 0 to 3600 seconds")
    return args


def agents(data_dir: Path) -> dict[str, str]:
    """Each fleet's agent (service name -> URL), from the running emulator's endpoints file."""
    try:
        endpoints = json.loads((data_dir / "endpoints.json").read_text())
    except FileNotFoundError:
        raise InterruptError(f"no running `inferq up` with --data-dir {data_dir} (no endpoints.json there)") from None
    found = endpoints.get("agents") or {}
    if not found:
        raise InterruptError("this `inferq up` runs no ECS agent (start it again with this version)")
    return dict(found)


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    try:
        reply = httpx.post(url, json=body, timeout=5.0)
        return reply.status_code, dict(reply.json())
    except (httpx.HTTPError, ValueError) as exc:
        raise InterruptError(f"cannot reach the emulator's ECS agent at {url} ({exc}); is `inferq up` running?") \
            from None


def interrupt(argv: list[str]) -> int:
    args = parse(argv)
    for service, url in agents(args.data_dir).items():
        status, answer = _post(f"{url}/interrupt", {"worker": args.worker, "notice_s": args.notice})
        if status == 200:
            print(f"interrupted {answer['worker']} (pid {answer['pid']}, service {service}): SIGTERM now, SIGKILL "
                  f"after {answer['kill_after_s']:g}s at most; its replacement is starting")
            return 0
        if status != 404:
            raise InterruptError(f"the agent of {service} answered {status}: {answer.get('error', answer)}")
    which = f"worker {args.worker}" if args.worker else "worker"
    raise InterruptError(f"no live {which} to interrupt")
