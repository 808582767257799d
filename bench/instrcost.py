"""The queue protocol's Valkey cost per job in server instructions, counted by callgrind (part of K).

Time on a shared machine is noise: the same code measured an hour apart differs by up to 2x here, and
``INFO commandstats`` is wall time. An instruction count is not: the same binary, inputs and commands execute the
same instructions whatever else runs (repeatable to within about 1% here, run after run). This runs
:mod:`bench.protocost`'s phases (enqueue, start, finish, the gateway's read, and the floor's commands for the same
jobs) against a ``valkey-server`` started under ``valgrind --tool=callgrind`` with the emulator's settings, zeroes
the counters before each phase and dumps them after it (``callgrind_control``), and divides each dump's total by
the jobs. Everything the server does for a phase is counted (reading and parsing the commands, scripts, replies),
but not the kernel's socket work. Valgrind runs the server about 50 times slower, so fewer jobs are measured.

The phases run twice on the same server, with usage metering on (the default, ``INFERQ_USAGE_RETENTION_DAYS`` 400:
the terminal transition counts each job into its tenant's hourly bucket; the finish phase reports each attempt's
time and tokens as a worker does) and off (0), each on a queue of its own: metering's cost is their difference in
the same run.

Needs valgrind (Debian's package, on every machine this project runs on); without it the figure is left out and
the report says why.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue

from . import protocost

_TOTAL = re.compile(r"^(?:summary|totals):\s*(\d+)", re.MULTILINE)


class CallgrindValkey(ValkeyProcess):
    """The emulator's Valkey (same settings, no AOF: the disk's work is not the protocol's) under callgrind."""

    def command(self) -> list[str]:
        return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={self.data_dir}/callgrind.%p",
                *super().command()]

    def vgdb_pid(self) -> int:
        """The pid callgrind_control knows this server by (valgrind's own process, found by its port)."""
        listing = subprocess.run(["vgdb", "-l"], capture_output=True, text=True, timeout=30).stdout
        for line in listing.splitlines():
            match = re.match(r"use --pid=(\d+) for .*valkey-server.* --port (\d+) ", line + " ")
            if match and int(match.group(2)) == self.port:
                return int(match.group(1))
        raise RuntimeError(f"no callgrind run of valkey-server on port {self.port}: {listing!r}")


def total_instructions(dump: str) -> int:
    """The instruction count of one callgrind dump (its ``summary:``/``totals:`` line)."""
    match = _TOTAL.search(dump)
    if match is None:
        raise ValueError("not a callgrind dump: no summary or totals line")
    return int(match.group(1))


def available() -> str | None:
    """None when callgrind can run, else why not."""
    missing = [tool for tool in ("valgrind", "callgrind_control", "vgdb") if shutil.which(tool) is None]
    return f"{', '.join(missing)} not installed (Debian: apt install valgrind)" if missing else None


def phase_counter(server: CallgrindValkey) -> protocost.Phase:
    """A :data:`bench.protocost.Phase` that counts the server instructions of a phase: callgrind's counters zeroed
    before it and dumped after it."""
    pid = server.vgdb_pid()

    def control(*args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(pid)], capture_output=True, text=True, timeout=120,
                       check=True)

    async def phase(q: Queue, work: Callable[[], Awaitable[Any]], sent: frozenset[str]) -> float:
        before = set(server.data_dir.glob(f"callgrind.{pid}.*"))
        await asyncio.to_thread(control, "--zero")
        await work()
        await asyncio.to_thread(control, "--dump")
        (dump,) = set(server.data_dir.glob(f"callgrind.{pid}.*")) - before
        return float(total_instructions(dump.read_text()))

    return phase


async def _counted(server: CallgrindValkey, n: int) -> dict[str, float]:
    phase = phase_counter(server)
    q = Queue.connect(Settings(redis_url=server.url, queue="bench-instr", max_queue_depth=0))
    off = Queue.connect(Settings(redis_url=server.url, queue="bench-instr-unmetered", max_queue_depth=0,
                                 usage_retention_days=0))
    try:
        await q.ensure_groups()
        await protocost._inferq_once(q, min(n, 200))  # warm: scripts loaded, the first allocations made
        out = await protocost._inferq_once(q, n, phase)
        out["floor"] = await protocost._floor_once(q, n, phase)
        await protocost._contract_once(q, min(n, 200))  # warm, as above
        contract = await protocost._contract_once(q, n, phase)
        out.update({f"contract_{name}": value for name, value in contract.items()})
        await off.ensure_groups()
        await protocost._inferq_once(off, min(n, 200))  # warm, as above
        unmetered = await protocost._inferq_once(off, n, phase)
        out.update({f"unmetered_{name}": value for name, value in unmetered.items()})
    finally:
        await q.close()
        await off.close()
    return out


def measure(n: int = 1000) -> dict[str, Any]:
    """Server instructions per job by phase (thousands), the floor's, and their ratio; or why not measured."""
    why = available()
    if why:
        return {"skipped": why}
    with tempfile.TemporaryDirectory() as tmp:
        server = CallgrindValkey(Path(tmp), appendfsync=None)
        server.start(timeout=120)  # valgrind starts slowly
        try:
            counted = asyncio.run(_counted(server, n))
        finally:
            server.stop()
    kilo = {name: round(value / 1000, 1) for name, value in counted.items()}
    contract = {name.removeprefix("contract_"): value for name, value in kilo.items() if name.startswith("contract_")}
    unmetered = {name.removeprefix("unmetered_"): v for name, v in kilo.items() if name.startswith("unmetered_")}
    metered = {k: v for k, v in kilo.items() if k != "floor" and not k.startswith(("contract_", "unmetered_"))}
    return {
        "method": f"{n} jobs, {protocost.BATCH} per round trip, valkey-server under valgrind --tool=callgrind; "
                  "callgrind_control --zero/--dump around each phase; thousands of instructions per job",
        "kinstructions_per_job": metered,
        "metering": {
            "off_kinstructions_per_job": unmetered,
            "overhead": round(metered["total"] / unmetered["total"] - 1, 4),
        },
        "contract_kinstructions_per_job": contract,
        "floor_kinstructions_per_job": kilo["floor"],
        "ratio_to_floor": round(kilo["total"] / kilo["floor"], 2),
        "contract_ratio_to_floor": round(contract["total"] / kilo["floor"], 2),
    }


def render(cost: dict[str, Any]) -> str:
    if "skipped" in cost:
        return f"server instructions per job: not measured ({cost['skipped']})"
    k = cost["kinstructions_per_job"]
    parts = ", ".join(f"{name} {k[name]:.1f}" for name in ("enqueue", "start", "finish", "read"))
    c = cost["contract_kinstructions_per_job"]
    off = cost["metering"]["off_kinstructions_per_job"]
    return (f"server instructions per job (callgrind, repeatable): {k['total']:.1f} k ({parts}) vs the floor's "
            f"{cost['floor_kinstructions_per_job']:.1f} k: {cost['ratio_to_floor']:.1f}x; the contract's keys "
            f"written with plain commands, no script (a lower bound): {c['total']:.1f} k "
            f"({', '.join(f'{name} {c[name]:.1f}' for name in ('enqueue', 'start', 'finish', 'read'))}), "
            f"{cost['contract_ratio_to_floor']:.1f}x; usage metering off: {off['total']:.1f} k "
            f"(finish {off['finish']:.1f}): metering {cost['metering']['overhead']:+.1%}")
