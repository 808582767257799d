"""Gateway figures: cold import of the Lambda module, and submit throughput through uvicorn.

- cold import: the median wall time of N fresh ``python -c 'import functions.gateway.app'`` processes (bytecode
  compiled by a first, unmeasured run), next to a bare ``python -c``; the difference is what the module adds to a
  Lambda cold start before the first request. Each child ends with ``os._exit`` (teardown is not part of a cold
  start) and also reports the import timed from inside. CPU time (user + sys of the child) is reported too: on a
  shared machine it moves less than wall time. The third-party floor (fastapi, mangum, redis, powertools imported
  alone) is measured the same way.
- first invocation: import, then the handler called twice with the v2 submit event (cold and warm).
- submit throughput: ``uvicorn functions.gateway.app:app`` with 1 process (uvloop, httptools, access log off; the
  app's own JSON request log on, to /dev/null), on loopback, against an embedded Valkey (AOF everysec), driven by
  an httpx client with C concurrent connections sending N ``POST /v1/jobs``. The client runs on the same machine
  and competes for its CPUs, so the figure is a floor.

``python -m bench.gateway [--quick]``
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from emulator.valkey import ValkeyProcess, free_port

ROOT = Path(__file__).resolve().parents[1]
MODULE = "functions.gateway.app"
BENCH_KEY = "bench-key-0000000001"
REQUEST = {"body": {"model": "m", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}}


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"INFERQ_API_KEYS": f"bench:{BENCH_KEY}", "PYTHONPATH": str(ROOT)}, **extra)
    return env


def _timed_child(code: str, env: dict[str, str]) -> tuple[float, float, str]:
    """Wall and CPU (user + sys) seconds of one fresh interpreter running ``code``, and what it printed."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = child.communicate(timeout=120)
    wall = time.perf_counter() - started
    if child.returncode != 0:
        raise RuntimeError(f"{code!r} failed: {err.decode()}")
    return wall, _child_cpu(), out.decode()


_cpu_seen = 0.0


def _child_cpu() -> float:
    """CPU of the child just reaped: the growth of RUSAGE_CHILDREN (children are reaped one at a time here)."""
    global _cpu_seen
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = usage.ru_utime + usage.ru_stime
    spent, _cpu_seen = total - _cpu_seen, total
    return spent


# Each child prints how long the import itself took and leaves with os._exit: interpreter teardown (about 0.1 s
# after FastAPI, spent finalising modules) is no part of a Lambda cold start, which never exits the process.
_EXIT = "sys.stdout.write(str(time.perf_counter() - t)); sys.stdout.flush(); os._exit(0)"
IMPORT_TIMED = f"import os, sys, time; t = time.perf_counter(); import {MODULE}; {_EXIT}"
BARE = f"import os, sys, time; t = time.perf_counter(); {_EXIT}"
DEPS = "fastapi, mangum, redis.asyncio, aws_lambda_powertools.logging"
DEPS_TIMED = f"import os, sys, time; t = time.perf_counter(); import {DEPS}; {_EXIT}"
"""The floor: the third-party packages the module cannot do without, imported alone."""


def cold_import(runs: int = 15) -> dict[str, Any]:
    env = _child_env()
    _timed_child(f"import {MODULE}", env)  # compiles and caches bytecode
    _child_cpu()  # the baseline
    module = [_timed_child(IMPORT_TIMED, env) for _ in range(runs)]
    bare = [_timed_child(BARE, env) for _ in range(runs)]
    deps = [_timed_child(DEPS_TIMED, env) for _ in range(runs)]
    wall = statistics.median(w for w, _, _ in module)
    cpu = statistics.median(c for _, c, _ in module)
    inside = statistics.median(float(out) for _, _, out in module)
    bare_wall = statistics.median(w for w, _, _ in bare)
    bare_cpu = statistics.median(c for _, c, _ in bare)
    return {
        "method": f"median of {runs} fresh `python -c 'import {MODULE}'` (bytecode present) vs a bare `python -c`, "
                  "each ended by os._exit (teardown excluded); in_process_s is the import alone, timed inside",
        "import_wall_s": round(wall, 4),
        "bare_interpreter_wall_s": round(bare_wall, 4),
        "module_wall_s": round(wall - bare_wall, 4),
        "in_process_s": round(inside, 4),
        "dependencies_in_process_s": round(statistics.median(float(out) for _, _, out in deps), 4),
        "import_cpu_s": round(cpu, 4),
        "module_cpu_s": round(cpu - bare_cpu, 4),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "target_s": 0.5,
    }


FIRST_INVOKE = """
import json, time
t0 = time.perf_counter()
import functions.gateway.app as m
t1 = time.perf_counter()
event = json.load(open("tests/events/apiGatewayProxyV2SubmitJob.json"))
event["headers"]["authorization"] = "Bearer {key}"
class Context:
    aws_request_id = "bench"
reply = m.handler(event, Context())
t2 = time.perf_counter()
assert reply["statusCode"] == 202, reply
reply = m.handler(event, Context())
t3 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "first_submit_s": t2 - t1, "second_submit_s": t3 - t2}}))
"""


def first_invocation(runs: int = 5) -> dict[str, Any]:
    """What a Lambda cold start costs in all: the import, then the first submit (Redis connection, script load,
    the wake check) through the real handler and a v2 event; and a warm submit after it."""
    samples: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp, ValkeyProcess(Path(tmp)) as valkey:
        for i in range(runs):
            env = _child_env(INFERQ_REDIS_URL=valkey.url, INFERQ_QUEUE=f"bench-cold-{i}", INFERQ_LOG_LEVEL="WARNING")
            out = subprocess.run([sys.executable, "-c", FIRST_INVOKE.format(key=BENCH_KEY)], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=60, check=True).stdout
            samples.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "method": f"median of {runs} fresh processes: import, then handler(v2 submit event) twice, embedded Valkey",
        **{name: round(statistics.median(s[name] for s in samples), 4)
           for name in ("import_s", "first_submit_s", "second_submit_s")},
    }


def _wait_listening(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"uvicorn exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError("uvicorn did not listen in time")


async def _drive(base_url: str, total: int, concurrency: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {BENCH_KEY}"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30.0) as client:
        for _ in range(min(50, total)):  # warm up: connections, script load, the wake check
            await client.post("/v1/jobs", json=REQUEST, headers=headers)
        remaining = total

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                response = await client.post("/v1/jobs", json=REQUEST, headers=headers)
                latencies.append(time.perf_counter() - started)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "submits_per_s": round(total / elapsed, 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 2),
        "statuses": statuses,
    }


def submit_throughput(total: int = 3000, concurrency: int = 32) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp, ValkeyProcess(Path(tmp)) as valkey:
        env = _child_env(INFERQ_REDIS_URL=valkey.url, INFERQ_QUEUE=f"bench-gw-{uuid.uuid4().hex[:8]}",
                         INFERQ_MAX_QUEUE_DEPTH="0")
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", f"{MODULE}:app", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--no-access-log", "--log-level", "warning", "--loop", "uvloop", "--http", "httptools"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            _wait_listening(port, server)
            figures = asyncio.run(_drive(f"http://127.0.0.1:{port}", total, concurrency))
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(5)
            if server.stderr:
                server.stderr.close()
    return {
        "method": f"{total} POST /v1/jobs, {concurrency} concurrent keep-alive connections, uvicorn 1 process "
                  "(uvloop, httptools), loopback, embedded Valkey AOF everysec, client on the same machine",
        **figures,
    }


def run(report: dict[str, Any], quick: bool = False) -> dict[str, Any]:
    gateway = {
        "cold_import": cold_import(runs=7 if quick else 21),
        "first_invocation": first_invocation(runs=3 if quick else 7),
        "submit": submit_throughput(total=600 if quick else 5000, concurrency=16 if quick else 32),
    }
    report["gateway"] = gateway
    return gateway


def render(gateway: dict[str, Any]) -> str:
    c, f, s = gateway["cold_import"], gateway["first_invocation"], gateway["submit"]
    return "\n".join([
        f"gateway cold import: {c['import_wall_s'] * 1000:.0f} ms wall, {c['module_wall_s'] * 1000:.0f} ms over a bare "
        f"interpreter of {c['bare_interpreter_wall_s'] * 1000:.0f} ms; the import alone {c['in_process_s'] * 1000:.0f}"
        f" ms (fastapi+mangum+redis+powertools alone {c['dependencies_in_process_s'] * 1000:.0f} ms); CPU "
        f"{c['module_cpu_s'] * 1000:.0f} ms over bare; target < {c['target_s'] * 1000:.0f} ms "
        f"(load {c['load_average_1m']} on {c['cpus']} CPUs)  [{c['method']}]",
        f"gateway first invocation: import {f['import_s'] * 1000:.0f} ms + first submit "
        f"{f['first_submit_s'] * 1000:.0f} ms, then {f['second_submit_s'] * 1000:.1f} ms warm  [{f['method']}]",
        f"gateway submits: {s['submits_per_s']:,.0f}/s, p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms, "
        f"statuses {s['statuses']}  [{s['method']}]",
    ])


if __name__ == "__main__":
    result = run({}, quick="--quick" in sys.argv)
    print(render(result))
    print(json.dumps(result, indent=2))
