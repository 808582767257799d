"""The HTTP load generator: submits jobs to a gateway and collects every one of them, with strict accounting.

Two shapes:

- :func:`closed_loop` (S2, S3): ``loops`` clients, each submits a job, waits for it with ``GET ?wait=`` until it
  is terminal, then submits the next. Latency is ``queue_to_done``: submit start -> terminal job in the client's
  hands.
- :func:`burst` (S1): ``concurrency`` clients submit all jobs as fast as the gateway accepts them, then the same
  clients collect every job with ``GET ?wait=``. Throughput is first submit -> last job terminal (the server's
  ``finished_at``, same clock: loopback) and first submit -> last result in the client's hands.

Accounting: a job counts as done only when the client holds it in state ``succeeded`` with a 200 result. Anything
else — a refused submit, a transport error, a 404 (lost), ``failed``/``cancelled``/``expired``, a job still not
terminal when the run's deadline passes — is an error with a message, and :attr:`LoadResult.ok` is false.
Loopback only: :func:`check_loopback` refuses any other host. Bounded: ``n_jobs`` and ``deadline_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .clients import TRANSPORT_ERRORS, Client, ClientPool, pool_of
from .clients import RawClient as RawClient  # what --client raw names

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "expired"})
MAX_ERRORS_KEPT = 50

Progress = Callable[[int], None]


def job_body(latency_ms: int = 0, text: str = "ping") -> dict[str, Any]:
    return {"body": {"model": "mock", "messages": [{"role": "user", "content": text}], "max_tokens": 8,
                     "mock": {"latency_ms": latency_ms}}}


@dataclass
class JobRecord:
    index: int
    job_id: str | None = None
    t_submit: float | None = None  # perf_counter, submit start
    t_accepted: float | None = None  # 202 in hand
    t_done: float | None = None  # terminal job in hand
    status: str | None = None  # last status seen
    error: str | None = None
    created_at: float | None = None  # server clock (Unix seconds), from the final job object
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        return self.error is None and self.status == "succeeded" and self.t_done is not None


@dataclass
class LoadResult:
    name: str
    n_jobs: int
    records: list[JobRecord]
    perf0: float  # perf_counter at the start of the run
    wall0: float  # time.time() at the same instant (maps the server's Unix times onto perf_counter)
    elapsed_s: float = 0.0
    timed_out: bool = False
    errors: list[str] = field(default_factory=list)
    error_count: int = 0
    client_cpu_s: float = 0.0  # filled in by the caller that owns the process
    cpu_by_role: dict[str, float] = field(default_factory=dict)  # likewise, from the stack's processes
    io_calls_by_role: dict[str, float] = field(default_factory=dict)  # likewise: read/write system calls
    commandstats: dict[str, Any] = field(default_factory=dict)  # likewise: Valkey's INFO commandstats delta

    def fail(self, record: JobRecord | None, message: str) -> None:
        if record is not None and record.error is None:
            record.error = message
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS_KEPT:
            self.errors.append(message)

    @property
    def done(self) -> int:
        return sum(1 for r in self.records if r.done)

    @property
    def ok(self) -> bool:
        return self.done == self.n_jobs and self.error_count == 0 and len(self.records) == self.n_jobs

    def latencies_ms(self) -> list[float]:
        return sorted((r.t_done - r.t_submit) * 1000 for r in self.records
                      if r.done and r.t_done is not None and r.t_submit is not None)

    def summary(self) -> dict[str, Any]:
        done = [r for r in self.records if r.done]
        submitted = [r for r in self.records if r.t_submit is not None]
        accepted = [r for r in self.records if r.t_accepted is not None]
        first = min((r.t_submit for r in submitted if r.t_submit is not None), default=None)
        ended_badly = [r for r in self.records if not r.done and r.t_done is not None]
        out: dict[str, Any] = {
            "jobs": self.n_jobs, "done": len(done), "accepted": len(accepted),
            "refused": self.n_jobs - len(accepted),  # never submitted, or not answered 202
            "failed": len(ended_badly),  # terminal in hand, but not succeeded with a 200 result
            "lost": len(accepted) - len(done) - len(ended_badly),  # accepted, never terminal in the client's hands
            "errors": self.error_count, "error_messages": self.errors[:MAX_ERRORS_KEPT], "ok": self.ok,
            "timed_out": self.timed_out, "elapsed_s": round(self.elapsed_s, 4),
        }
        if first is not None and accepted:
            span = max(r.t_accepted for r in accepted if r.t_accepted is not None) - first
            out["submit_per_s"] = len(accepted) / span if span > 0 else None
        if first is not None and done:
            span = max(r.t_done for r in done if r.t_done is not None) - first
            out["jobs_per_s"] = len(done) / span if span > 0 else None
            finished = [r.finished_at for r in done if r.finished_at is not None]
            if finished:  # the server's clock, mapped onto ours: first submit -> last job terminal
                server_span = (max(finished) - self.wall0) - (first - self.perf0)
                out["jobs_per_s_to_last_finish"] = len(done) / server_span if server_span > 0 else None
        lat = self.latencies_ms()
        out["queue_to_done_ms"] = distribution(lat)
        waits = sorted((r.started_at - r.created_at) * 1000 for r in done
                       if r.started_at is not None and r.created_at is not None)
        runs = sorted((r.finished_at - r.started_at) * 1000 for r in done
                      if r.finished_at is not None and r.started_at is not None)
        out["server_queue_wait_ms"] = distribution(waits)
        out["server_run_ms"] = distribution(runs)
        return out


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) on an already sorted list."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def distribution(sorted_values: list[float]) -> dict[str, float | int | None]:
    if not sorted_values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None, "mean": None}
    return {"n": len(sorted_values), "p50": percentile(sorted_values, 50), "p95": percentile(sorted_values, 95),
            "p99": percentile(sorted_values, 99), "max": sorted_values[-1],
            "mean": sum(sorted_values) / len(sorted_values)}


def _short(response: Any) -> str:
    return response.text[:200].replace("\n", " ")


async def _submit(client: Client, result: LoadResult, record: JobRecord, body: dict[str, Any]) -> bool:
    record.t_submit = time.perf_counter()
    try:
        response = await client.post("/v1/jobs", json=body)
    except TRANSPORT_ERRORS as exc:
        result.fail(record, f"job #{record.index}: submit failed: {type(exc).__name__}: {exc}")
        return False
    if response.status_code != 202:
        result.fail(record, f"job #{record.index}: submit answered {response.status_code}: {_short(response)}")
        return False
    try:
        job = response.json()
        record.job_id = str(job["id"])
        record.status = str(job["status"])
    except (ValueError, KeyError, TypeError):
        result.fail(record, f"job #{record.index}: submit answered 202 without a job object: {_short(response)}")
        return False
    record.t_accepted = time.perf_counter()
    return True


async def _collect(client: Client, result: LoadResult, record: JobRecord, wait_s: float,
                   deadline: float) -> bool:
    """Long-poll one accepted job until it is terminal (or the deadline passes); judge it."""
    assert record.job_id is not None
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            result.fail(record, f"job {record.job_id}: still {record.status} at the run's deadline (lost)")
            return False
        wait = max(0.0, min(wait_s, left - 0.5))
        asked = time.perf_counter()
        try:
            response = await client.get(f"/v1/jobs/{record.job_id}", params={"wait": f"{wait:g}"},
                                        timeout=wait + 10.0)
        except TRANSPORT_ERRORS as exc:
            result.fail(record, f"job {record.job_id}: poll failed: {type(exc).__name__}: {exc}")
            return False
        if response.status_code == 404:
            result.fail(record, f"job {record.job_id}: 404 after it was accepted (lost)")
            return False
        if response.status_code != 200:
            result.fail(record, f"job {record.job_id}: poll answered {response.status_code}: {_short(response)}")
            return False
        try:
            job = response.json()
            status = str(job["status"])
        except (ValueError, KeyError, TypeError):
            result.fail(record, f"job {record.job_id}: poll answered 200 without a job object: {_short(response)}")
            return False
        record.status = status
        if status not in TERMINAL:
            # a real ?wait= answers a live job only when the wait is over; one answered early must not spin hot
            early = time.perf_counter() - asked < wait / 2
            await asyncio.sleep(0.01 if early else 0)
            continue
        record.t_done = time.perf_counter()
        record.created_at = job.get("created_at")
        record.started_at = job.get("started_at")
        record.finished_at = job.get("finished_at")
        if job.get("id") != record.job_id:
            result.fail(record, f"job {record.job_id}: poll answered another job {job.get('id')!r}")
            return False
        if status != "succeeded":
            result.fail(record, f"job {record.job_id}: ended {status}: {job.get('error')}")
            return False
        code = (job.get("result") or {}).get("status_code")
        if code != 200:
            result.fail(record, f"job {record.job_id}: succeeded with result status {code!r}")
            return False
        return True


async def _bounded(result: LoadResult, tasks: list[asyncio.Task[Any]], deadline: float) -> None:
    """Run the workers until they finish or the deadline passes; at the deadline, cancel them."""
    try:
        async with asyncio.timeout(max(0.0, deadline - time.perf_counter()) + 1.0):
            await asyncio.gather(*tasks)
    except TimeoutError:
        result.timed_out = True
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)


def _finalise(result: LoadResult) -> LoadResult:
    """Whatever is not judged yet is lost; every job the run was asked for has a record."""
    result.elapsed_s = time.perf_counter() - result.perf0
    for record in result.records:
        if record.done or record.error is not None:
            continue
        if record.t_submit is None:
            result.fail(record, f"job #{record.index}: never submitted before the run's deadline")
        else:
            result.fail(record, f"job {record.job_id or '#' + str(record.index)}: not terminal in the client's "
                                f"hands at the run's end (last seen {record.status}) (lost)")
    return result


def _new_result(name: str, n_jobs: int) -> LoadResult:
    perf0, wall0 = time.perf_counter(), time.time()
    return LoadResult(name, n_jobs, [JobRecord(i) for i in range(n_jobs)], perf0, wall0)


async def closed_loop(
    clients: Client | ClientPool,
    n_jobs: int,
    loops: int,
    body: dict[str, Any],
    *,
    name: str = "closed_loop",
    wait_s: float = 20.0,
    deadline_s: float = 120.0,
    progress: Progress | None = None,
    bodies: Sequence[dict[str, Any]] = (),
) -> LoadResult:
    """``loops`` clients, each: submit, wait for the terminal state, next. With ``bodies``, job ``i`` is
    ``bodies[i % len(bodies)]`` instead of ``body`` (a load spread over several models)."""
    pool = pool_of(clients)
    result = _new_result(name, n_jobs)
    deadline = result.perf0 + deadline_s
    counter = itertools.count()

    async def loop(client: Client) -> None:
        while (i := next(counter)) < n_jobs and time.perf_counter() < deadline:
            record = result.records[i]
            if await _submit(client, result, record, bodies[i % len(bodies)] if bodies else body):
                await _collect(client, result, record, wait_s, deadline)
            if progress is not None:
                progress(1)

    await _bounded(result, [asyncio.create_task(loop(pool.pick(i))) for i in range(loops)], deadline)
    return _finalise(result)


async def burst(
    clients: Client | ClientPool,
    n_jobs: int,
    concurrency: int,
    body: dict[str, Any],
    *,
    name: str = "burst",
    wait_s: float = 20.0,
    deadline_s: float = 300.0,
    progress: Progress | None = None,
) -> LoadResult:
    """Submit all ``n_jobs`` with ``concurrency`` clients, then collect every accepted one."""
    pool = pool_of(clients)
    result = _new_result(name, n_jobs)
    deadline = result.perf0 + deadline_s
    submits = itertools.count()

    async def submitter(client: Client) -> None:
        while (i := next(submits)) < n_jobs and time.perf_counter() < deadline:
            if not await _submit(client, result, result.records[i], body) and progress is not None:
                progress(1)  # a refused job is finished with (as an error)

    await _bounded(result, [asyncio.create_task(submitter(pool.pick(i))) for i in range(concurrency)], deadline)
    accepted = iter([r for r in result.records if r.t_accepted is not None])

    async def collector(client: Client) -> None:
        for record in accepted:
            await _collect(client, result, record, wait_s, deadline)
            if progress is not None:
                progress(1)

    await _bounded(result, [asyncio.create_task(collector(pool.pick(i))) for i in range(concurrency)], deadline)
    return _finalise(result)
