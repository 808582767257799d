"""Wake on enqueue, drain on SIGTERM, and the emulator's own lifecycle: bad settings stop it at start, SIGTERM
stops everything, and a SIGKILLed emulator still leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from emulator.valkey import free_port
from tests.support.waiting import eventually

from .conftest import ROOT, Emulator, chat, process_group

SLOW_TICK = {
    "INFERQ_SCALER_INTERVAL_S": "60",  # the schedule alone would take a minute
    "INFERQ_CLAIM_IDLE_MS": "20000",  # a reclaim would take 20 s: a quick handover can only be the drain
    "INFERQ_DRAIN_S": "1",
}


def test_a_single_job_at_zero_wakes_the_fleet_long_before_the_next_tick(own_stack: Callable[..., Emulator]) -> None:
    emulator = own_stack(**SLOW_TICK)  # a fleet at zero, whatever ran before
    # the scaler's first (scheduled) evaluation has run: the fleet is at zero and the next tick is a minute away
    eventually(lambda: emulator.scale()["desired"] == 0, what="a first decision of 0", timeout=20, interval=0.2)
    assert not emulator.workers()
    started = time.monotonic()
    job = emulator.submit(chat("wake up"))
    done = emulator.finish(job["id"], timeout=30)
    took = time.monotonic() - started
    print(f"wake latency at zero (submit -> succeeded): {took:.2f}s")
    assert done["status"] == "succeeded"
    assert emulator.scale()["desired"] == 1 and len(emulator.workers()) == 1
    # what scaled the fleet up was the gateway's wake, not the schedule (whose next tick is a minute away)
    scale_ups = [line for line in emulator.logs().splitlines() if "scaler: 0 -> 1 workers" in line]
    assert scale_ups and all('"trigger":"wake"' in line.replace(" ", "") for line in scale_ups), scale_ups


def test_sigterm_to_a_busy_worker_hands_its_work_over_promptly(own_stack: Callable[..., Emulator]) -> None:
    emulator = own_stack(**SLOW_TICK)
    job = emulator.submit(chat("long one", latency_ms=3000))  # its submit wakes the fleet: one worker
    eventually(lambda: emulator.job(job["id"])["status"] == "running", what="the job to run", timeout=30,
               interval=0.05)
    [worker] = emulator.workers()
    logged = len(emulator.logs())
    signalled = time.monotonic()
    os.kill(worker, signal.SIGTERM)
    done = emulator.finish(job["id"], timeout=60)
    took = time.monotonic() - signalled
    assert done["status"] == "succeeded"
    print(f"SIGTERM -> succeeded on the replacement: {took:.2f}s")
    # drain 1 s, then the signalled worker released the job (the replacement took it at once, not by a reclaim
    # after the 20 s claim-idle)
    assert "releasing 1 unfinished jobs" in emulator.logs()[logged:], emulator.logs()[logged:][-3000:]
    eventually(lambda: worker not in emulator.processes(), what="the signalled worker to exit", timeout=10)
    assert "exited on its own (exit 0); replacing it\n" in emulator.logs()  # drained, then replaced like on ECS


def test_ctrl_c_stops_everything_in_order_and_leaves_no_process(own_stack: Callable[..., Emulator]) -> None:
    emulator = own_stack(**SLOW_TICK)
    job = emulator.submit(chat("wake one worker"))
    assert emulator.finish(job["id"], timeout=30)["status"] == "succeeded"
    before = emulator.processes()
    assert any("valkey-server" in c for c in before.values()) and any("uvicorn" in c for c in before.values())
    assert len(emulator.workers()) == 1  # running, so that its drain is part of the stop
    for pid, cmd in before.items():
        if pid != emulator.pid:  # every child blocks SIGINT: the supervisor alone decides the stopping order
            assert sigint_blocked(pid), cmd
    # a terminal's Ctrl-C reaches the whole foreground process group, children included
    os.killpg(emulator.pid, signal.SIGINT)
    assert emulator.process is not None
    assert emulator.process.wait(45) == 0
    assert process_group(emulator.pid) == {}
    logs = emulator.logs()
    # the children ignored the terminal's SIGINT: the worker drained on the supervisor's SIGTERM, Valkey went last
    [stopped] = re.findall(r"stopping (worker-\d+) \(emulator shutting down\): SIGTERM", logs)
    assert f"{stopped} stopped (exit 0)" in logs
    assert logs.rstrip().endswith("inferq: stopped")


def sigint_blocked(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def test_a_sigkilled_emulator_leaves_no_process(own_stack: Callable[..., Emulator]) -> None:
    emulator = own_stack()
    job = emulator.submit(chat("one"))
    assert emulator.finish(job["id"], timeout=30)["status"] == "succeeded"
    roles = emulator.processes().values()
    assert any("gpu_worker" in c for c in roles) and any("valkey-server" in c for c in roles)
    emulator.stop(signal.SIGKILL, timeout=10)
    eventually(lambda: not process_group(emulator.pid), what="every child to die with the emulator", timeout=15)


def _up(args: list[str], env: dict[str, str], data_dir: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    return subprocess.run(
        [sys.executable, "-m", "inferq.cli.main", "up", "--data-dir", str(data_dir), *args], cwd=ROOT,
        env={**base, **env}, capture_output=True, text=True, timeout=30,
    )


def test_a_bad_setting_stops_inferq_up_at_start_naming_the_variable(tmp_path: Path) -> None:
    result = _up(["--port", str(free_port())], {"INFERQ_WINDOW": "lots"}, tmp_path)
    assert result.returncode == 2
    assert "INFERQ_WINDOW" in result.stderr
    assert "ready" not in result.stdout


def test_a_port_in_use_stops_inferq_up_at_start(stack: Emulator, tmp_path: Path) -> None:
    result = _up(["--port", str(stack.port), "--valkey-port", "0"], {}, tmp_path)
    assert result.returncode == 1
    assert f"{stack.port} is already in use" in result.stderr


def test_a_taken_default_valkey_port_does_not_stop_a_second_stack(tmp_path: Path) -> None:
    """With no --valkey-port, 6380 is preferred (sam local finds it there) but a busy one falls back to a free port."""
    import socket

    from emulator.up import DEFAULT_VALKEY_PORT

    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", DEFAULT_VALKEY_PORT))
        holder.listen()
    except OSError:
        pass  # already taken by something else: the case under test all the same
    emulator = Emulator(tmp_path / "data", {}, valkey_args=())
    try:
        emulator.start()
        assert emulator.client.get("/readyz").status_code == 200
    finally:
        emulator.stop()
        holder.close()


def test_the_dev_key_is_kept_in_the_data_dir_and_reused(stack: Emulator) -> None:
    from emulator.up import dev_api_key

    key = (stack.data_dir / "dev-api-key").read_text().strip()
    assert key in stack.logs()
    assert dev_api_key(stack.data_dir) == key
    assert (stack.data_dir / "dev-api-key").stat().st_mode & 0o777 == 0o600


def test_a_second_inferq_up_on_the_same_data_dir_is_refused(stack: Emulator) -> None:
    result = _up(["--port", str(free_port()), "--valkey-port", "0"], {}, stack.data_dir)
    assert result.returncode == 1
    assert f"another inferq up is using {stack.data_dir}" in result.stderr
    assert stack.client.get("/readyz").status_code == 200  # the first one is untouched


def test_a_child_that_cannot_start_stops_inferq_up_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from emulator import up

    spawn = up.Supervisor._spawn

    async def broken_gateway(self: up.Supervisor, role: str, argv: list[str], env: dict[str, str] | None = None) -> Any:
        if role == "gateway":
            argv = [sys.executable, "-c", "print('cannot start'); raise SystemExit(3)"]
        return await spawn(self, role, argv, env)

    monkeypatch.setattr(up.Supervisor, "_spawn", broken_gateway)
    for name in [k for k in os.environ if k.startswith("INFERQ_")]:
        monkeypatch.delenv(name)
    code = up.main(["--port", str(free_port()), "--data-dir", str(tmp_path), "--valkey-port", "0"])
    out = capsys.readouterr().out
    assert code == 1
    # stopped by the gateway's exit (not the 60 s readiness timeout, which says so), started once (no restart loop)
    assert out.count("gateway  | cannot start") == 1, out
    assert "did not answer 200 on /readyz" not in out, out
    assert "inferq: could not start: gateway exited with 3 while starting" in out
    assert "inferq: ready" not in out and out.rstrip().endswith("inferq: stopped")


def test_a_reader_that_stops_reading_never_stalls_the_stack(tmp_path: Path) -> None:
    """Harnesses often read until the ready line and then leave stdout alone: a full pipe must not block the
    supervisor (and with it every log line of the gateway), only cost dropped log lines."""
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferq.cli.main", "up", "--port", str(port), "--data-dir", str(tmp_path),
         "--valkey-port", "0"], cwd=ROOT, env=base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline().decode()
            if line.startswith("inferq: ready on http://"):
                assert line.strip() == f"inferq: ready on http://127.0.0.1:{port}"
                break
        else:
            raise AssertionError("no ready line")
        import httpx

        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            for _ in range(1500):  # each request logs a JSON line: ~1500 lines overflow a 64 KiB pipe buffer
                assert client.get("/healthz").status_code == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
