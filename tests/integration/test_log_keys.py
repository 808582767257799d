"""Every process logs JSON with the same keys (Powertools Logger's): the gateway Lambda, the scaler as the emulator
runs it, and a worker, each a real process. Lines from our packages' module loggers (``inferq.*``,
``functions.*``, ``gpu_worker.*``) carry the same keys as the Powertools loggers' own, and no line carries the
prompt or the webhook secret."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from emulator.valkey import free_port
from inferq.config.settings import Settings
from inferq.queue.jobs import JobRequest
from inferq.queue.protocol import Queue

from .worker.support import REPO, TENANT, chat, submit, terminal, worker_env, worker_processes

KEYS = {"level", "location", "message", "timestamp", "service", "name"}
PROMPT = "the-patient-record-7f3a9"
SECRET = "whsec-never-logged-51d2"

GATEWAY = """
import json, logging, sys, types
from tests.conftest import load_event
import functions.gateway.app as app
context = types.SimpleNamespace(aws_request_id="req-1", function_name="gw", memory_limit_in_mb=128,
                                invoked_function_arn="arn:aws:lambda:us-east-1:1:function:gw")
event = load_event("apiGatewayProxyV2SubmitJob.json")
event["body"] = json.dumps({"body": {"model": "m", "messages": [{"role": "user", "content": sys.argv[1]}]}})
event["isBase64Encoded"] = False
event["headers"]["authorization"] = "Bearer wrong-key"
print(app.handler(event, context)["statusCode"], file=sys.stderr)
# a module logger of ours, as errors.py logs a full store: routed through Powertools' handler at import
logging.getLogger("functions.gateway.errors").warning("the queue store is full: probe")
"""


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{") and '"_aws"' not in line]


def gateway_lines(settings: Settings) -> list[dict[str, Any]]:
    env = worker_env(settings, INFERQ_API_KEYS="acme:right-key-0123456789", INFERQ_WEBHOOK_SECRET=SECRET)
    done = subprocess.run([sys.executable, "-c", GATEWAY, PROMPT], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stderr.strip().endswith("401"), done.stderr[-2000:]
    assert PROMPT not in done.stdout + done.stderr and SECRET not in done.stdout + done.stderr
    return json_lines(done.stdout)


async def scaler_lines(settings: Settings, queue: Queue) -> list[dict[str, Any]]:
    """``python -m emulator.scaler`` with ECS unreachable (a warning per tick) and a cancelled job whose webhook
    URL is refused (a warning of the webhook sender, a module logger)."""
    job, _ = await queue.enqueue(TENANT, JobRequest(body=chat(PROMPT), webhook_url="https://127.0.0.1/hook"))
    await queue.cancel(TENANT, job.id)
    closed = free_port()
    env = worker_env(settings, INFERQ_ECS_CLUSTER="inferq", INFERQ_ECS_SERVICE="gpu-workers",
                     INFERQ_SCALER_INTERVAL_S="0.5", INFERQ_WEBHOOK_SECRET=SECRET,
                     AWS_ENDPOINT_URL_ECS=f"http://127.0.0.1:{closed}", AWS_DEFAULT_REGION="us-east-1",
                     AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", POWERTOOLS_METRICS_DISABLED="true")
    process = subprocess.Popen([sys.executable, "-m", "emulator.scaler", "--wake-port", str(free_port())],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    try:
        async def both_warnings() -> None:  # until a tick has warned of ECS and the sender of the refused URL
            while not (any("ECS unreachable" in line for line in seen) and any("inferq.webhooks" in line
                                                                               for line in seen)):
                line = await asyncio.to_thread(process.stdout.readline)  # type: ignore[union-attr]
                assert line, "the scaler exited: " + "".join(seen)[-2000:]
                seen.append(line)

        await asyncio.wait_for(both_warnings(), 60)
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=30)
    out = "".join(seen) + out
    assert PROMPT not in out and SECRET not in out
    return json_lines(out)


async def worker_lines(settings: Settings, queue: Queue, tmp_path: Path) -> list[dict[str, Any]]:
    with worker_processes(settings, tmp_path) as spawn:
        worker = spawn("keys")
        job = await submit(queue, chat(PROMPT, fatal=True), traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-"
                                                                           "00f067aa0ba902b7-01")
        await terminal(queue, job.id, timeout=15)
        worker.terminate()
        assert await worker.wait() == 0
    assert PROMPT not in worker.output()
    return worker.log_lines()


async def test_gateway_scaler_and_worker_lines_carry_the_same_keys(
    settings: Settings, queue: Queue, tmp_path: Path
) -> None:
    lines = {"gateway": gateway_lines(settings), "scaler": await scaler_lines(settings, queue),
             "worker": await worker_lines(settings, queue, tmp_path)}
    for process, found in lines.items():
        assert found, f"{process}: no JSON line"
        for line in found:
            assert set(line) >= KEYS, f"{process}: {line}"
    services = {process: {line["service"] for line in found} for process, found in lines.items()}
    assert services == {"gateway": {"inferq-gateway"}, "scaler": {"inferq-scaler"}, "worker": {"inferq-worker"}}

    access = [line for line in lines["gateway"] if line["message"] == "request"]
    assert access and access[0]["status"] == 401 and access[0]["level"] == "INFO"
    assert any(line["name"] == "functions.gateway.errors" for line in lines["gateway"])
    assert any("ECS unreachable" in line["message"] for line in lines["scaler"])
    refused = [line for line in lines["scaler"] if line["name"] == "inferq.webhooks"]
    assert refused and all(line["level"] == "WARNING" for line in refused)
    failed = [line for line in lines["worker"] if line.get("job_id")]
    assert failed and failed[0]["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert failed[0]["worker_id"] == "keys"
