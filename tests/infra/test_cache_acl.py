"""Least privilege on the cache (issue 40, point 6): one ACL user per role, with the rules of inferq/redis/acl.py.

The template carries exactly those rules (ElastiCache and MemoryDB users, each role's password in its own secret),
and a real Valkey enforces them: each role does its whole job as a user created with ``ACL SETUSER`` and those
rules (the gateway accepts, reads, waits for, cancels and redrives jobs; a worker takes, retries, finishes and
dead-letters them; the scaler's handler observes the queue and sizes the service), and is refused outside it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis

from emulator.valkey import ValkeyProcess
from functions.gateway.api import create_app
from functions.scaler import app as scaler_app
from gpu_worker.backends.mock import MockBackend
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.keys import Keys
from inferq.queue.protocol import Queue
from inferq.redis import acl
from tests.integration.scaler.test_handler import (  # noqa: F401  (fixtures)
    LambdaContext,
    ecs,
    scaler_env,
    scheduled,
)
from tests.support.ecs import CLUSTER, SERVICE, desired_count

from .cfn import NESTED, Resolver, load

KEYS = {"key-tenant-a-0001": "tenant-a"}
A = {"Authorization": "Bearer key-tenant-a-0001"}
DANGEROUS = [
    ("FLUSHALL",), ("FLUSHDB",), ("KEYS", "*"), ("CONFIG", "GET", "maxmemory"), ("DEBUG", "SLEEP", "0"),
    ("SCRIPT", "FLUSH"), ("EVAL", "return 1", "0"), ("MODULE", "LIST"), ("ACL", "LIST"), ("CLIENT", "LIST"),
    ("SHUTDOWN",), ("MONITOR",), ("FUNCTION", "FLUSH"), ("SCAN", "0"), ("RENAME", "inferq:a", "inferq:b"),
]


ADMIN_PASSWORD = uuid.uuid4().hex


def passwords() -> dict[str, str]:
    return {role: uuid.uuid4().hex for role in acl.ROLES}


@pytest.fixture(scope="module")
def role_valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ValkeyProcess, dict[str, str]]]:
    """A Valkey with one user per role, created from inferq.redis.acl's rules, and the default user disabled as in AWS
    (a client that does not authenticate as its role gets nowhere); the test's own setup and checks use an
    ``admin`` user."""
    server = ValkeyProcess(tmp_path_factory.mktemp("valkey-acl")).start()
    secrets = passwords()
    admin = redis.Redis(host=server.host, port=server.port, decode_responses=True)
    for role, password in secrets.items():
        admin.execute_command("ACL", "SETUSER", role, *acl.access_string(role).split(), f">{password}")
    admin.execute_command("ACL", "SETUSER", "admin", "on", f">{ADMIN_PASSWORD}", "~*", "&*", "+@all")
    admin.execute_command("ACL", "SETUSER", "default", "off")
    admin.close()
    yield server, secrets
    server.stop()


def role_settings(role_valkey: tuple[ValkeyProcess, dict[str, str]], role: str, queue: str) -> Settings:
    """A role's settings as the stack gives them: the worker its credentials in INFERQ_REDIS_AUTH (an ECS secret
    of its container), the functions theirs from their own secret (here: in the URL, as the secret's reader
    would hand them to redis-py)."""
    server, secrets = role_valkey
    if role == "worker":
        auth = json.dumps({"username": role, "token": secrets[role]})
        return Settings(redis_url=server.url, redis_auth=auth, queue=queue, retry_base_ms=0)
    return Settings(redis_url=f"redis://{role}:{secrets[role]}@{server.host}:{server.port}/0", queue=queue,
                    retry_base_ms=0)


@pytest.fixture
def admin(role_valkey: tuple[ValkeyProcess, dict[str, str]]) -> Iterator[redis.Redis]:
    server, _ = role_valkey
    client = redis.Redis(host=server.host, port=server.port, username="admin", password=ADMIN_PASSWORD,
                         decode_responses=True)
    client.execute_command("ACL", "LOG", "RESET")
    yield client
    print("refused:", sorted(set(refusals(client))))  # shown with a failure
    client.close()


def refusals(admin: redis.Redis) -> list[tuple[str, str]]:
    """What the server refused since the test began: (user, command or key)."""
    return [(entry["username"], entry["object"]) for entry in admin.execute_command("ACL", "LOG")]


# --- the template says what inferq.redis.acl says ---


def test_every_cache_user_of_the_template_has_its_roles_rules() -> None:
    cache = load(NESTED["cache"])
    rules = cache["Mappings"]["AccessStrings"]
    assert rules == {role: {"Rules": acl.access_string(role)} for role in acl.ROLES}, (
        "infra/cache.yaml is out of date: python scripts/gen_cache_acl.py"
    )
    resources = cache["Resources"]
    for kind in ("AWS::ElastiCache::User", "AWS::MemoryDB::User"):
        users = {name: r["Properties"] for name, r in resources.items() if r["Type"] == kind}
        roles = {u["AccessString"]["Fn::FindInMap"][1] for u in users.values() if "Fn::FindInMap" in
                 (u["AccessString"] if isinstance(u["AccessString"], dict) else {})}
        assert roles == set(acl.ROLES), kind
        # each role's password is the token of its own secret
        for name, user in users.items():
            if user["AccessString"] == "off -@all":
                continue
            role = user["AccessString"]["Fn::FindInMap"][1]
            secret = f"{role.capitalize()}AuthSecret"
            assert user["AuthenticationMode"]["Passwords"] == [
                {"Fn::Sub": f"{{{{resolve:secretsmanager:${{{secret}}}:SecretString:token}}}}"}
            ], name
    # the secret names the user its token belongs to
    for mode in ("replication-group", "serverless", "memorydb"):
        resolver = Resolver(cache, overrides={"Mode": mode})
        for role in acl.ROLES:
            template = resources[f"{role.capitalize()}AuthSecret"]["Properties"]["GenerateSecretString"]
            name = json.loads(resolver.value(template["SecretStringTemplate"]))["username"]
            assert name.startswith(f"inferq-{role}-"), (mode, role, name)
            user = resources[f"MemoryDb{role.capitalize()}User" if mode == "memorydb" else f"{role.capitalize()}User"]
            assert resolver.value(user["Properties"]["UserName"]) == name, (mode, role)


def test_no_role_may_send_an_administrative_or_dangerous_command() -> None:
    for role in acl.ROLES:
        allowed = set(acl.commands(role))
        for banned in ("flushall", "flushdb", "keys", "config", "debug", "module", "script|flush", "script|kill",
                       "monitor", "shutdown", "acl", "client|kill", "eval", "function", "scan", "rename"):
            assert banned not in allowed, (role, banned)
        assert acl.access_string(role).startswith(f"on ~{acl.KEY_PATTERN} resetchannels -@all +")


def test_every_command_a_script_sends_is_allowed_to_every_role() -> None:
    from pathlib import Path

    sent = set()
    for script in Path(acl.__file__).parent.parent.joinpath("queue", "scripts").rglob("*.lua"):
        sent |= {c.lower() for c in re.findall(r"(?:redis\.call|rcall)\(\s*['\"](\w+)['\"]", script.read_text())}
    assert sent, "no script found"
    assert sent <= set(acl.SCRIPT_COMMANDS), sorted(sent - set(acl.SCRIPT_COMMANDS))


# --- a real Valkey enforces them ---


@pytest.fixture
def queue_name() -> str:
    return "acl" + uuid.uuid4().hex[:10]


@pytest.fixture
def settings(role_valkey: tuple[ValkeyProcess, dict[str, str]], queue_name: str) -> Settings:
    """The scaler's settings (scaler_env, imported from the scaler's tests, builds its environment from these)."""
    return role_settings(role_valkey, "scaler", queue_name)


@pytest.fixture
async def gateway(role_valkey: tuple[ValkeyProcess, dict[str, str]], queue_name: str) -> AsyncIterator[Any]:
    app = create_app(role_settings(role_valkey, "gateway", queue_name), keys=KEYS, waker=_no_wake)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
    yield client
    await client.aclose()
    await app.state.gateway.aclose()


async def _no_wake() -> None:
    return None


async def work_until_idle(settings: Settings) -> None:
    queue = Queue.connect(settings)
    await queue.ensure_groups()
    backend = MockBackend(queue.redis, Keys(settings.queue))
    try:
        await Worker(settings, queue, backend, webhooks=False).run_until_idle()
    finally:
        await queue.close()


def chat(**mock: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if mock:
        body["mock"] = mock
    return {"body": body}


async def test_each_role_does_its_whole_job_as_its_own_user_and_nothing_is_refused(
    role_valkey: tuple[ValkeyProcess, dict[str, str]], queue_name: str, gateway: httpx.AsyncClient,
    ecs: Any, admin: redis.Redis,  # noqa: F811
) -> None:
    # gateway: health, submit (with an idempotency key, twice), read, cancel
    assert (await gateway.get("/readyz")).status_code == 200
    ok = await gateway.post("/v1/jobs", json=chat(), headers={**A, "Idempotency-Key": "one"})
    assert ok.status_code == 202, ok.text
    assert (await gateway.post("/v1/jobs", json=chat(), headers={**A, "Idempotency-Key": "one"})).status_code == 200
    retried = (await gateway.post("/v1/jobs", json=chat(fail_attempts=1), headers=A)).json()
    fatal = (await gateway.post("/v1/jobs", json=chat(fatal=True), headers=A)).json()
    crashed = (await gateway.post("/v1/jobs", json={**chat(), "priority": "high"}, headers=A)).json()
    cancelled = (await gateway.post("/v1/jobs", json={**chat(), "priority": "low"}, headers=A)).json()
    assert (await gateway.post(f"/v1/jobs/{cancelled['id']}/cancel", headers=A)).status_code == 200
    # scaler: a scheduled tick observes the backlog and sizes the service
    answer = scaler_app.handler(scheduled(), LambdaContext())
    assert answer["errors"] == [] and desired_count(ecs) >= 1, answer
    # worker: takes every job, retries one, fails one (dead-lettered after its attempts)
    await work_until_idle(role_settings(role_valkey, "worker", queue_name).replace(max_attempts=1))
    job = (await gateway.get(f"/v1/jobs/{ok.json()['id']}?wait=1", headers=A)).json()
    assert job["status"] == "succeeded", job
    assert (await gateway.get(f"/v1/jobs/{crashed['id']}", headers=A)).json()["status"] == "succeeded"
    assert (await gateway.get(f"/v1/jobs/{retried['id']}", headers=A)).json()["status"] in ("failed", "succeeded")
    failed = (await gateway.get(f"/v1/jobs/{fatal['id']}", headers=A)).json()
    assert failed["status"] == "failed", failed
    # gateway: the views of a tenant and of the queue
    for path in ("/v1/events?limit=10", "/v1/dlq", "/v1/models", "/v1/scale"):
        answer_ = await gateway.get(path, headers=A)
        assert answer_.status_code == 200, (path, answer_.text)
    dead = (await gateway.get("/v1/dlq", headers=A)).json()["data"]
    if dead:
        assert (await gateway.post(f"/v1/dlq/{dead[0]['id']}/redrive", headers=A)).status_code == 202
        await work_until_idle(role_settings(role_valkey, "worker", queue_name))
    # scaler again, with the work done (scale-down bookkeeping, history)
    assert scaler_app.handler(scheduled(), LambdaContext())["errors"] == []
    assert refusals(admin) == []
    assert (CLUSTER, SERVICE) == ("inferq", "gpu-workers")


def dry_run(admin: redis.Redis, role: str, *command: str) -> str:
    """ACL DRYRUN: whether ``role`` may send ``command``, decided by the server without running it."""
    return str(admin.execute_command("ACL", "DRYRUN", role, *command))


@pytest.mark.parametrize("role", acl.ROLES)
def test_each_role_is_refused_dangerous_commands_and_other_keys(
    role_valkey: tuple[ValkeyProcess, dict[str, str]], role: str, admin: redis.Redis
) -> None:
    for command in DANGEROUS:
        assert "no permissions" in dry_run(admin, role, *command), (role, command)
    assert dry_run(admin, role, "HGETALL", "inferq:{q}:job:x") == "OK"
    server, secrets = role_valkey
    client = redis.Redis(host=server.host, port=server.port, username=role, password=secrets[role],
                         decode_responses=True)
    try:
        assert client.ping()
        admin.set("tenant-data:secret", "x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.get("tenant-data:secret")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.publish("inferq:chan", "x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.flushall()
    finally:
        client.close()


@pytest.mark.parametrize(("role", "command"), [
    ("gateway", ("XREADGROUP", "GROUP", "workers", "g", "COUNT", "1", "STREAMS", "inferq:{q}:stream", ">")),
    ("gateway", ("XAUTOCLAIM", "inferq:{q}:stream", "workers", "g", "0", "0-0")),
    ("scaler", ("XAUTOCLAIM", "inferq:{q}:stream", "workers", "s", "0", "0-0")),
    ("worker", ("BLMOVE", "inferq:{q}:a", "inferq:{q}:b", "LEFT", "LEFT", "0.01")),
    ("worker", ("LPUSH", "inferq:{q}:history", "x")),
])
def test_a_role_cannot_do_another_roles_work(admin: redis.Redis, role: str, command: tuple[str, ...]) -> None:
    """The gateway never takes or reclaims a job, the scaler never reclaims one, a worker never waits on a job's
    result list nor writes the scaler's history."""
    assert "no permissions" in dry_run(admin, role, *command)
