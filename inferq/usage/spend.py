"""What one attempt spent, as a worker reports it with the write that ends the attempt (finish, retry, release), and
how a worker splits its busy time among the jobs it runs at once (:class:`BusyShare`).

GPU time is what a tenant pays for, and a worker runs several jobs at once on one model server: each job is charged
its share of the time the worker was busy, ``dt / n`` for every moment ``dt`` it shared the worker with ``n - 1``
others, so the shares of the jobs of one busy second add up to one second, whoever's they are. A multi-GPU worker
charges each second times its GPUs (a GPU-hour is what the price is per).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spend:
    """One attempt's run time, its share of the worker's busy GPU time, and its tokens (the model server's
    ``usage``; 0 for an attempt without a result)."""

    run_ms: int = 0
    gpu_ms: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def with_tokens(self, usage: Any) -> Spend:
        """This spend with the tokens of an OpenAI ``usage`` object (``prompt_tokens``, ``completion_tokens``);
        anything else (absent, malformed) counts none."""
        return Spend(self.run_ms, self.gpu_ms, _count(usage, "prompt_tokens"), _count(usage, "completion_tokens"))


NONE = Spend()


def _count(usage: Any, name: str) -> int:
    value = usage.get(name) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53 else 0


def tokens_of(result: Any) -> Any:
    """The ``usage`` object of a job's result (``{"status_code", "body": <the model server's response>}``)."""
    body = result.get("body") if isinstance(result, dict) else None
    return body.get("usage") if isinstance(body, dict) else None


class BusyShare:
    """Integrates ``1 / concurrency`` over each running job: :meth:`begin` when a job starts running on the model
    server, :meth:`end` when it stops, which answers the job's run and GPU milliseconds. ``gpus``: the GPUs the
    worker's model server uses (each busy second is that many GPU-seconds). The clock is injected (seconds,
    monotonic)."""

    def __init__(self, gpus: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.gpus = gpus
        self.clock = clock
        self._began: dict[Hashable, float] = {}
        self._share: dict[Hashable, float] = {}
        self._at = clock()

    def _advance(self) -> None:
        now = self.clock()
        if self._share:
            each = (now - self._at) / len(self._share)
            for job in self._share:
                self._share[job] += each
        self._at = now

    def begin(self, job: Hashable) -> None:
        self._advance()
        self._began[job] = self._at
        self._share[job] = 0.0

    def end(self, job: Hashable) -> Spend:
        """The job's run time and GPU share since :meth:`begin` (nothing for a job never begun)."""
        if job not in self._share:
            return NONE
        self._advance()
        share = self._share.pop(job)
        began = self._began.pop(job)
        return Spend(run_ms=round((self._at - began) * 1000), gpu_ms=round(share * self.gpus * 1000))

    def __contains__(self, job: Hashable) -> bool:
        return job in self._share

    @property
    def running(self) -> int:
        return len(self._share)


_STATUS_COLUMN = {"succeeded": 0, "failed": 1, "cancelled": 2, "expired": 3}


class UsageRows:
    """The usage of the jobs of one finish call, added up per row (tenant, lane, model) as ``finish.lua`` takes it:
    the script writes each row once, and takes a job it does not end back out of its row (``includes/meter.lua``)."""

    def __init__(self, metering: bool) -> None:
        self.metering = metering
        self._rows: dict[str, list[int]] = {}
        self._positions: dict[str, int] = {}

    def add(self, delivery: Any, status: Any, spend: Spend) -> list[Any]:
        """Count one job (a :class:`~inferq.queue.consumer.Delivery` ending in ``status``); answers its arguments:
        its row's position and what it added."""
        if not self.metering:
            return [0, ""]
        model, run_ms, gpu_ms = delivery.spent
        row_name = f"{delivery.job.tenant}|{delivery.lane.value}|{model}"
        row = self._rows.get(row_name)
        if row is None:
            row = self._rows[row_name] = [0] * 8
            self._positions[row_name] = len(self._positions) + 1
        run_ms, gpu_ms = run_ms + spend.run_ms, gpu_ms + spend.gpu_ms
        row[_STATUS_COLUMN[status.value]] += 1
        row[4] += spend.prompt_tokens
        row[5] += spend.completion_tokens
        row[6] += run_ms
        row[7] += gpu_ms
        return [self._positions[row_name], f"{run_ms} {gpu_ms} {spend.prompt_tokens} {spend.completion_tokens}"]

    def args(self) -> list[Any]:
        """The rows' arguments: their number, then each row's name and its eight sums separated by spaces."""
        out: list[Any] = [len(self._rows)]
        for name, row in self._rows.items():
            out += [name, " ".join(map(str, row))]
        return out
