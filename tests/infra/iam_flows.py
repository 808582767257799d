"""The flows each role of the deployed stack runs, in one list: tests/infra/test_iam_flows.py runs every one with
the role's policy enforced and evaluates every AWS call it makes.

A flow is an async function of a :class:`~tests.infra.iam_stack.Stack`, registered with :func:`flow` under the role
it is about. Inside, ``with stack.acting(role):`` runs code as that role: its environment from the template, its
credentials, its calls recorded under it (a flow may act as several roles: the gateway submits, a worker runs). It
drives the role's real code (the gateway app, the scaler's handler, the batch driver, the worker) and asserts that
the work got done; the test checks every recorded call against the role's policy and lists the grants no flow used.

To add a flow (a new AWS call of a role, e.g. the scaler's daily usage export under ``usage/``): write it here
with ``@flow("scaler", "usage export")``, doing the work the way the deployed process does it; if it makes a call
the test has no rule for, add the rule to ``AUTHORIZATION`` in tests/infra/iam_calls.py; then grant the call in
the template, as narrowly as the flow needs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from .iam_calls import ACCOUNT, REGION
from .iam_stack import API_KEY, BUCKET, CLUSTER, EDGE_ORIGIN, TASK_ID, TENANT, Stack

A = {"Authorization": f"Bearer {API_KEY}"}
FlowFunction = Callable[[Stack], Coroutine[Any, Any, None]]


@dataclass(frozen=True)
class Flow:
    role: str
    name: str
    run: FlowFunction

    @property
    def id(self) -> str:
        return f"{self.role}: {self.name}"


FLOWS: list[Flow] = []


def flow(role: str, name: str) -> Callable[[FlowFunction], FlowFunction]:
    def register(function: FlowFunction) -> FlowFunction:
        FLOWS.append(Flow(role, name, function))
        return function

    return register


# ---------------------------------------------------------------------- the processes, as the stack runs them


@asynccontextmanager
async def gateway(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app built from its environment (keys from the API keys secret, the cache credentials from its
    secret, the scaler woken through Lambda), as its Lambda builds it; calls through it are the gateway's."""
    from functions.gateway.api import create_app

    with stack.acting("gateway"):
        app = create_app()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://gateway")
    try:
        yield client
    finally:
        with stack.acting("gateway"):
            await client.aclose()
            await app.state.gateway.aclose()


async def as_gateway(stack: Stack, call: Awaitable[httpx.Response]) -> httpx.Response:
    with stack.acting("gateway"):
        return await call


def start_task(stack: Stack) -> dict[str, str]:
    """ECS starting the GPU task: the agent reads each container's ``Secrets`` with the task execution role and
    hands them to that container alone. The worker's environment, with its secrets."""
    import boto3

    env = dict(stack.roles["worker"].env)
    with stack.acting("task-execution"):
        client = boto3.client("secretsmanager")
        for secret in json.loads(stack.values["worker.Secrets"]):
            env[secret["Name"]] = client.get_secret_value(SecretId=secret["ValueFrom"])["SecretString"]
    return env


def ecs_agent(stack: Stack) -> httpx.MockTransport:
    """The ECS agent's task protection endpoint: it calls ``UpdateTaskProtection`` for the task with the task
    role's credentials (the worker's), as the agent does."""
    import boto3

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        client = boto3.client("ecs")
        kwargs: dict[str, Any] = {"cluster": CLUSTER, "tasks": [TASK_ID],
                                  "protectionEnabled": bool(body["ProtectionEnabled"])}
        if "ExpiresInMinutes" in body:
            kwargs["expiresInMinutes"] = int(body["ExpiresInMinutes"])
        client.update_task_protection(**kwargs)
        return httpx.Response(200, json={"protection": {"ProtectionEnabled": body["ProtectionEnabled"]}})

    return httpx.MockTransport(handle)


async def work_until_idle(stack: Stack, *, protected: bool = True) -> None:
    """A GPU task's worker (mock model server) runs every job queued, holding scale-in protection meanwhile."""
    from gpu_worker.backends.mock import MockBackend
    from gpu_worker.protection import TaskProtection
    from gpu_worker.worker import Worker
    from inferq.config.settings import Settings
    from inferq.queue.keys import Keys
    from inferq.queue.protocol import Queue

    env = start_task(stack)
    stack.roles["worker"].env = env
    with stack.acting("worker"):
        settings = Settings.from_env()
        queue = Queue.connect(settings)
        await queue.ensure_groups()
        protection = TaskProtection("http://169.254.170.2/api/task", expires_minutes=60,
                                    client=httpx.AsyncClient(transport=ecs_agent(stack)), idle_grace_s=0)
        try:
            await Worker(settings, queue, MockBackend(queue.redis, Keys(settings.queue)), block_ms=50,
                         webhooks=settings.worker_webhooks,  # the task definition's (off: no route to the internet)
                         protection=protection if protected else None, burst=True).run()
        finally:
            await queue.close()


def admin_s3(stack: Stack) -> Any:
    """An S3 client of the test's own (set-up and checks: no role's)."""
    return stack.session(None).client("s3")


def admin_redis(stack: Stack) -> Any:
    import redis.asyncio as aioredis

    return aioredis.Redis(host=stack.valkey.host, port=stack.valkey.port, username="admin", password="admin-pass",
                          decode_responses=True)


def keys_under(stack: Stack, prefix: str) -> set[str]:
    page = admin_s3(stack).list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"] for o in page.get("Contents", [])}


def big(text: str, size: int = 4096) -> str:
    """A message larger than the stack's inline bound in these tests (INFERQ_INLINE_MAX_BYTES): claim-checked."""
    return (text + " ") * (size // (len(text) + 1) + 1)


def chat(content: str) -> dict[str, Any]:
    return {"body": {"model": "m", "messages": [{"role": "user", "content": content}]}}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def batch_line(custom_id: str, content: str) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", **chat(content)}


async def upload_file(client: httpx.AsyncClient, data: bytes) -> str:
    answer = await client.post("/v1/files", headers=A, files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


# ---------------------------------------------------------------------- authorizer


@flow("authorizer", "checks a key against the API keys secret")
async def authorizer_checks_a_key(stack: Stack) -> None:
    from functions.authorizer.check import Authorizer
    from functions.authorizer.edge import HEADER, OriginCheck
    from functions.gateway.auth import key_store
    from inferq.config.settings import Settings

    with stack.acting("authorizer"):
        settings = Settings.from_env()
        assert settings.edge_origin_secret  # the stack's edge is on: the origin header is checked too
        authorizer = Authorizer(key_store(settings), OriginCheck.of(settings.edge_origin_secret))
        event = {"headers": {"authorization": f"Bearer {API_KEY}", HEADER: EDGE_ORIGIN}, "rawPath": "/v1/jobs",
                 "requestContext": {"http": {"method": "POST"}}}
        direct = {**event, "headers": {"authorization": f"Bearer {API_KEY}"}}
        try:
            answer = await asyncio.to_thread(authorizer, event)
            refused = await asyncio.to_thread(authorizer, direct)
        finally:
            authorizer.close()
    assert answer["isAuthorized"] is True and refused == {"isAuthorized": False}, (answer, refused)


# ---------------------------------------------------------------------- gateway


@flow("gateway", "readiness")
async def gateway_readiness(stack: Stack) -> None:
    async with gateway(stack) as client:
        answer = await as_gateway(stack, client.get("/readyz"))
    assert answer.status_code == 200, answer.text


@flow("gateway", "jobs with claim checks")
async def gateway_jobs_with_claim_checks(stack: Stack) -> None:
    async with gateway(stack) as client:
        # a large body is stored in S3 before the job is queued; one cancelled while queued has its body deleted
        large = await as_gateway(stack, client.post("/v1/jobs", headers=A, json=chat(big("large"))))
        assert large.status_code == 202, large.text
        dropped = await as_gateway(stack, client.post("/v1/jobs", headers=A, json=chat(big("dropped"))))
        cancel = await as_gateway(stack, client.post(f"/v1/jobs/{dropped.json()['id']}/cancel", headers=A))
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled", cancel.text
        # a worker reads the body back, stores its large result, deletes the body
        await work_until_idle(stack)
        # the gateway gives the result inline (read from S3) and, in the feed, by presigned URL
        job = await as_gateway(stack, client.get(f"/v1/jobs/{large.json()['id']}", headers=A))
        assert job.json()["status"] == "succeeded" and job.json()["result"]["body"]["choices"], job.text[:300]
        feed = await as_gateway(stack, client.get("/v1/events?limit=10", headers=A))
        urls = [j["result"].get("body_url") for j in feed.json()["data"] if j["status"] == "succeeded"]
        assert urls and all(urls), feed.text[:300]
        # a body whose object expired (the lifecycle rule) before a worker took the job: S3's 404 fails it at once
        with stack.acting(None):
            before = keys_under(stack, "claims/requests/")
        expired = await as_gateway(stack, client.post("/v1/jobs", headers=A, json=chat(big("expired"))))
        with stack.acting(None):
            [gone] = keys_under(stack, "claims/requests/") - before
            admin_s3(stack).delete_object(Bucket=BUCKET, Key=gone)
        await work_until_idle(stack)
        failed = await as_gateway(stack, client.get(f"/v1/jobs/{expired.json()['id']}", headers=A))
        assert failed.json()["status"] == "failed" and failed.json()["attempts"] == 1, failed.text


@flow("gateway", "files")
async def gateway_files(stack: Stack) -> None:
    async with gateway(stack) as client:
        with stack.acting("gateway"):
            file_id = await upload_file(client, jsonl([batch_line("a", "hi")]))
            listed = await client.get("/v1/files", headers=A)
            assert file_id in {f["id"] for f in listed.json()["data"]}, listed.text
            assert (await client.get(f"/v1/files/{file_id}", headers=A)).status_code == 200
            content = await client.get(f"/v1/files/{file_id}/content", headers=A)
            assert content.status_code == 200 and b'"custom_id": "a"' in content.content
            deleted = await client.delete(f"/v1/files/{file_id}", headers=A)
            assert deleted.status_code == 200, deleted.text


@flow("gateway", "uploads")
async def gateway_uploads(stack: Stack) -> None:
    data = jsonl([batch_line(f"line-{i}", "hello") for i in range(4)])
    async with gateway(stack) as client:
        with stack.acting("gateway"):
            for outcome in ("completed", "part gone", "cancelled"):
                opened = await client.post("/v1/uploads", headers=A, json={
                    "filename": "in.jsonl", "purpose": "batch", "bytes": len(data), "mime_type": "application/jsonl"})
                assert opened.status_code == 200, opened.text
                upload_id = opened.json()["id"]
                parts = []
                for chunk in (data[: len(data) // 2], data[len(data) // 2:]):
                    part = await client.post(f"/v1/uploads/{upload_id}/parts", headers=A,
                                             files={"data": ("blob", chunk)})
                    assert part.status_code == 200, part.text
                    parts.append(part.json()["id"])
                if outcome == "completed":
                    done = await client.post(f"/v1/uploads/{upload_id}/complete", headers=A,
                                             json={"part_ids": parts})
                    assert done.status_code == 200 and done.json()["file"]["bytes"] == len(data), done.text
                    continue
                if outcome == "part gone":  # removed behind the gateway's back: the completion fails, and aborts
                    with stack.acting(None):
                        [gone] = keys_under(stack, f"uploads/{TENANT}/{upload_id}/{parts[1]}")
                        admin_s3(stack).delete_object(Bucket=BUCKET, Key=gone)
                    failed = await client.post(f"/v1/uploads/{upload_id}/complete", headers=A,
                                               json={"part_ids": parts})
                    assert failed.status_code == 503, failed.text
                cancelled = await client.post(f"/v1/uploads/{upload_id}/cancel", headers=A)
                assert cancelled.status_code == 200, cancelled.text


@flow("gateway", "wakes the scaler")
async def gateway_wakes_the_scaler(stack: Stack) -> None:
    from inferq.queue.keys import Keys

    with stack.acting(None):  # no wake-up in the last seconds (an earlier flow's submit may have made one)
        redis = admin_redis(stack)
        try:
            await redis.delete(Keys(stack.roles["gateway"].env.get("INFERQ_QUEUE", "default")).wake)
        finally:
            await redis.aclose()
    async with gateway(stack) as client:
        # the fleet is at zero (no decision yet): a submit wakes the scaler by an asynchronous invoke
        answer = await as_gateway(stack, client.post("/v1/jobs", headers=A, json=chat("wake up")))
        assert answer.status_code == 202, answer.text
    woken = [c for c in stack.recorder.calls if c.flow == stack.recorder.flow and c.operation == "Invoke"]
    assert woken, "no wake-up invoke"
    await work_until_idle(stack, protected=False)


@flow("gateway", "webhook secrets")
async def gateway_webhook_secrets(stack: Stack) -> None:
    from inferq.queue.keys import tenant_webhook_secret

    async with gateway(stack) as client:
        with stack.acting("gateway"):
            first = await client.get("/v1/webhooks/secret", headers=A)
            assert first.status_code == 200, first.text
            rotated = await client.post("/v1/webhooks/secret/rotate", headers=A)
            assert rotated.status_code == 200, rotated.text
    assert rotated.json()["previous"]["secret"] == first.json()["secret"]
    with stack.acting(None):  # what the cache holds is sealed: neither secret is in it
        redis = admin_redis(stack)
        try:
            stored = await redis.hgetall(tenant_webhook_secret(TENANT))
        finally:
            await redis.aclose()
    assert stored["secret"].startswith("enc1.kms.") and stored["previous"].startswith("enc1.kms."), stored
    assert first.json()["secret"] not in json.dumps(stored) and rotated.json()["secret"] not in json.dumps(stored)


# ---------------------------------------------------------------------- scaler


@flow("scaler", "ticks: observes and sizes the service, delivers webhooks")
async def scaler_ticks(stack: Stack) -> None:
    from functions.scaler import app as scaler_app
    from tests.integration.scaler.test_handler import LambdaContext, scheduled

    async with gateway(stack) as client:
        for i in range(3):  # a backlog: the scaler sizes the service up
            answer = await as_gateway(stack, client.post("/v1/jobs", headers=A, json=chat(f"tick {i}")))
            assert answer.status_code == 202, answer.text
        hooked = await as_gateway(stack, client.post("/v1/jobs", headers=A, json={
            **chat("hooked"), "webhook_url": stack.values["webhook_url"]}))
        assert hooked.status_code == 202, hooked.text
        secret = (await as_gateway(stack, client.get("/v1/webhooks/secret", headers=A))).json()
    with stack.acting("scaler"):
        scaler_app.reset()
        try:
            ticked = scaler_app.handler(scheduled(), LambdaContext(remaining_ms=500))
        finally:
            scaler_app.reset()
    assert ticked["errors"] == [] and ticked["desired"] >= 1 and ticked["changes"] >= 1, ticked
    await work_until_idle(stack, protected=False)  # the GPU task's workers send no webhook
    assert not stack.receiver.requests
    with stack.acting("scaler"):  # the next tick delivers it, signed with the tenant's secret (opened by KMS)
        scaler_app.reset()
        try:
            ticked = scaler_app.handler(scheduled(), LambdaContext(remaining_ms=500))
        finally:
            scaler_app.reset()
    from inferq.webhooks.signing import verify_webhook

    [(headers, body)] = stack.receiver.requests
    assert verify_webhook(secret["secret"], headers, body)["id"] == hooked.json()["id"]


@flow("scaler", "Spot is short: an on-demand stand-in on the fallback service")
async def scaler_stands_in_for_spot(stack: Stack) -> None:
    from moto.ecs.models import ecs_backends

    from functions.scaler import app as scaler_app
    from tests.integration.scaler.test_handler import LambdaContext, scheduled

    from .iam_stack import FALLBACK, SERVICE

    async with gateway(stack) as client:
        answer = await as_gateway(stack, client.post("/v1/jobs", headers=A, json=chat("waits for Spot")))
        assert answer.status_code == 202, answer.text
    with stack.acting(None):  # ECS asked for one Spot task and found no instance for it (moto reports it pending)
        spot = ecs_backends[ACCOUNT][REGION].services[f"{CLUSTER}:{SERVICE}"]
        spot.desired_count, spot.running_count, spot.pending_count = 1, 0, 1
    with stack.acting("scaler"):
        scaler_app.reset()
        try:
            ticked = scaler_app.handler(scheduled(), LambdaContext(remaining_ms=500))
        finally:
            scaler_app.reset()
    assert ticked["errors"] == [], ticked
    with stack.acting(None):
        fallback = ecs_backends[ACCOUNT][REGION].services[f"{CLUSTER}:{FALLBACK}"]
        assert fallback.desired_count == 1  # the stand-in
        fallback.desired_count = spot.desired_count = spot.pending_count = 0
    await work_until_idle(stack, protected=False)


async def killed_finalisation(stack: Stack, batch_id: str) -> None:
    """What a finalising try killed after it completed the batch's error file leaves: the file's id in the batch's
    record and the file in S3. The next try, which finds no error line, deletes it."""
    from functions.storage import FileStore
    from inferq.batches.records import new_file_id
    from inferq.queue.keys import Keys

    with stack.acting(None):
        error_id = new_file_id()
        redis = admin_redis(stack)
        try:
            await redis.hset(Keys(stack.roles["scaler"].env.get("INFERQ_QUEUE", "default")).batch(batch_id),
                             "final_error_id", error_id)
        finally:
            await redis.aclose()
        store = FileStore(BUCKET, client=admin_s3(stack))
        store.put(TENANT, error_id, b"{}\n", f"{batch_id}_error.jsonl", "batch_output")


@flow("scaler", "the batch driver")
async def scaler_batch_driver(stack: Stack) -> None:
    from functions.storage import FileStore
    from inferq.batches.driver import BatchDriver
    from inferq.config.registry import load as load_registry
    from inferq.config.settings import Settings
    from inferq.queue.protocol import Queue

    lines = [batch_line("small", "hello"), batch_line("large", big("large line")),
             batch_line("refused", "x")]
    lines[2]["body"]["max_tokens"] = 0  # refused before the batch runs: an error line
    async with gateway(stack) as client:
        with stack.acting("gateway"):
            ran = await upload_file(client, jsonl(lines[:2]))
            failed = await upload_file(client, jsonl(lines))
            cancelled = await upload_file(client, jsonl([batch_line("c1", big("cancelled line"))]))
            batches = []
            for file_id in (ran, failed, cancelled):
                made = await client.post("/v1/batches", headers=A, json={
                    "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
                assert made.status_code == 200, made.text
                batches.append(made.json()["id"])
        with stack.acting("scaler"):
            settings = Settings.from_env()
            queue = Queue.connect(settings)
            driver = BatchDriver(queue, FileStore(settings.files_bucket or ""), settings, load_registry(settings))
        try:
            with stack.acting("scaler"):
                for _ in range(3):  # validates, then expands: a large line's body is claim-checked
                    await driver.run_once()
            with stack.acting("gateway"):
                running = (await client.get(f"/v1/batches/{batches[2]}", headers=A)).json()
                assert running["status"] == "in_progress", running
                assert (await client.post(f"/v1/batches/{batches[2]}/cancel", headers=A)).status_code == 200
            await killed_finalisation(stack, batches[0])
            for _ in range(4):
                with stack.acting("scaler"):
                    await driver.run_once()  # cancels the cancelled batch's line (its claimed body deleted)
                await work_until_idle(stack, protected=False)
                with stack.acting("scaler"):
                    await driver.run_once()  # finalises: output files written, claimed results read back
                with stack.acting("gateway"):
                    states = [(await client.get(f"/v1/batches/{b}", headers=A)).json() for b in batches]
                if all(s["status"] in ("completed", "failed", "cancelled") for s in states):
                    break
        finally:
            with stack.acting("scaler"):
                await queue.close()
        assert [s["status"] for s in states] == ["completed", "failed", "cancelled"], states
        with stack.acting("gateway"):
            output = await client.get(f"/v1/files/{states[0]['output_file_id']}/content", headers=A)
        assert output.status_code == 200 and len(output.content.splitlines()) == 2, output.text[:300]


@flow("scaler", "recounts the file quotas' counts from S3")
async def scaler_recounts_files(stack: Stack) -> None:
    """The scaler's recount (inferq/queue/storage.py): the tenants with files found by one LIST of ``files/``, each
    tenant's files listed; a file the lifecycle rule expired stops counting."""
    from functions.scaler.app import recount_files
    from inferq.config.settings import Settings
    from inferq.queue.protocol import Queue
    from inferq.queue.storage import Storage

    async with gateway(stack) as client:
        with stack.acting("gateway"):
            await upload_file(client, jsonl([batch_line("kept", "hi")]))
            expired = await upload_file(client, jsonl([batch_line("expired", "hi")]))
    with stack.acting(None):
        [key] = [k for k in keys_under(stack, "files/") if k.endswith(expired)]
        admin_s3(stack).delete_object(Bucket=BUCKET, Key=key)  # the lifecycle rule's delete
    with stack.acting("scaler"):
        settings = Settings.from_env()
        queue = Queue.connect(settings)
        try:
            await queue.redis.delete(queue.keys.storage_scan)  # a fresh interval: the tenants are looked for
            await queue.redis.zadd(queue.keys.storage_due, {TENANT: 0})  # due
            before = await Storage(queue).stored(TENANT)
            await recount_files(settings, queue, budget_s=30)
            after = await Storage(queue).stored(TENANT)
        finally:
            await queue.close()
    assert after.files == before.files - 1, (before, after)


@flow("scaler", "usage export")
async def scaler_usage_export(stack: Stack) -> None:
    """The scaler's usage pass (functions/scaler/usage.py): each day's usage put under ``usage/``, nothing else."""
    import logging
    import time

    from functions.scaler.usage import SETTLE_S, usage_pass
    from inferq.config.settings import Settings
    from inferq.redis.connection import connect
    from inferq.usage.export import day_key
    from inferq.usage.periods import DAY_S, HOUR_S, hour_start

    async with gateway(stack) as client:
        answer = await as_gateway(stack, client.post("/v1/jobs", headers=A, json=chat("metered")))
        assert answer.status_code == 202, answer.text
    await work_until_idle(stack, protected=False)
    now = time.time()
    with stack.acting("scaler"):
        settings = Settings.from_env()
        redis = connect(settings)
        try:
            # once this hour has settled: it is exported, its day's object written
            await usage_pass(settings, [(None, settings)], redis, logging.getLogger("iam.usage"),
                             now=hour_start(now) + HOUR_S + SETTLE_S + 1)
        finally:
            await redis.aclose()
    day = hour_start(now) - hour_start(now) % DAY_S
    assert day_key(day) in keys_under(stack, "usage/"), keys_under(stack, "usage/")
