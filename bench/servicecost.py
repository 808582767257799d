"""The gateway's and a worker's own cost per job in instructions, counted by callgrind (part of K).

S3's CPU per role moves by up to 2x from one hour to the next on a shared machine, by more than most changes to the
gateway or the worker move it, so a change there cannot be judged by it in one run. An instruction count can: the
same code doing the same work executes nearly the same instructions whatever else runs. Here the S3 stack (Valkey,
one gateway under the gateway's uvicorn settings, one worker:
:class:`bench.stack.Stack`'s direct stack, the mock backend at 5 ms) serves ``loops`` closed
loops of S3's load generator (submit, then long-poll the job to its end), once with the gateway under ``valgrind
--tool=callgrind`` and once with the worker under it. Callgrind starts counting after a warm-up
(``callgrind_control --instr=on``, zeroed), counts ``n`` jobs and dumps; the total divided by the jobs is the
figure. The kernel's work (socket system calls) is not counted.

Callgrind runs its process some 50 times slower, so the counted process is the bottleneck: requests and replies
that arrive together share turns of the event loop (and writes) more than at full speed. The figure is for
comparing trees, run the same way; it repeats within about 2% here.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from . import clients, load
from .instrcost import available, total_instructions
from .stack import Stack

ROLES = ("gateway", "worker")


class _CountedStack(Stack):
    """The direct stack (Valkey, one uvicorn gateway, one worker), with ``role``'s process under callgrind."""

    def __init__(self, role: str, out_dir: Path) -> None:
        super().__init__(workers=1, window=32, mode="direct", log_dir=out_dir, name=f"servicecost-{role}")
        self.role = role
        self.out_dir = out_dir

    def _popen(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        if ("uvicorn" in argv) == (self.role == "gateway"):
            argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                    f"--callgrind-out-file={self.out_dir}/callgrind.%p", *argv]
        return super()._popen(argv, env)


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, text=True, timeout=300, check=True)


def _jobs(url: str, api_key: str, loops: int, n: int) -> None:
    async def run() -> None:
        pool = clients.ClientPool([clients.RawClient(url, api_key) for _ in range(loops)])
        try:
            result = await load.closed_loop(pool, n, loops, load.job_body(5), name="servicecost", deadline_s=600)
        finally:
            await pool.aclose()
        if not result.ok:
            raise RuntimeError(f"servicecost: {result.error_count} job(s) failed: {result.errors[:3]}")

    asyncio.run(run())


def _counted(role: str, loops: int, n: int, warm: int) -> float:
    """Instructions per job of ``role`` (a process of its own under callgrind) over ``n`` jobs."""
    with tempfile.TemporaryDirectory(prefix="servicecost-") as tmp_name:
        tmp = Path(tmp_name)
        with _CountedStack(role, tmp) as stack:
            (counted,) = [p for p in stack.processes if "valgrind" in stack.argv[p.pid]]
            _jobs(stack.url, stack.api_key, loops, warm)  # the worker is up and warm, the scripts loaded
            _control(counted.pid, "--instr=on")
            _control(counted.pid, "--zero")
            _jobs(stack.url, stack.api_key, loops, n)
            before = set(tmp.glob("callgrind.*"))
            _control(counted.pid, "--dump")
            dumps = set(tmp.glob("callgrind.*")) - before
            total = sum(total_instructions(dump.read_text()) for dump in dumps)
    if not dumps or total <= 0:
        raise RuntimeError(f"servicecost: no callgrind dump of the {role}")
    return total / n


def measure(loops: int = 32, n: int = 1000, warm: int = 100) -> dict[str, Any]:
    """Thousands of instructions per job of the gateway and of a worker, or why not measured."""
    why = available()
    if why:
        return {"skipped": why}
    per_job = {role: round(_counted(role, loops, n, warm) / 1000, 1) for role in ROLES}
    return {
        "method": f"S3's stack and load generator ({loops} loops, mock 5 ms, window 32), {n} jobs after {warm}, "
                  "each role counted in a run of its own under valgrind --tool=callgrind; thousands of "
                  "instructions per job",
        "kinstructions_per_job": per_job,
    }


def render(cost: dict[str, Any]) -> str:
    if "skipped" in cost:
        return f"gateway and worker instructions per job: not measured ({cost['skipped']})"
    k = cost["kinstructions_per_job"]
    return (f"gateway and worker instructions per job (callgrind, S3's shape, repeatable): gateway "
            f"{k['gateway']:,.0f} k, worker {k['worker']:,.0f} k")
