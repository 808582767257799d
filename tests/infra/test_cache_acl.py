"""Least privilege on the cache (issue 40, point 6): one ACL user per role, with the rules of inferq/redis/acl.py.

The template carries exactly those rules (ElastiCache and MemoryDB users, each role's password in its own secret),
and a real Valkey enforces them: each role does its whole job as a user created with ``ACL SETUSER`` and those
rules (the gateway accepts, reads, waits for, cancels and redrives jobs; a worker takes, retries, finishes and
dead-letters them; the scaler's handler observes the queue and sizes the service), and is refused outside it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
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
from tests.support.tls import HttpsReceiver, private_ca

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
    for role in acl.ROLES:
        admin.execute_command("ACL", "SETUSER", role, *acl.access_string(role).split(), f">{secrets[role]}")
        # the rules an ElastiCache Serverless cache's users take (infra/cache.yaml, ServerlessRules)
        admin.execute_command("ACL", "SETUSER", f"{role}-serverless",
                              *acl.access_string(role, serverless=True).split(), f">{secrets[role]}")
    admin.execute_command("ACL", "SETUSER", "admin", "on", f">{ADMIN_PASSWORD}", "~*", "&*", "+@all")
    admin.execute_command("ACL", "SETUSER", "default", "off")
    admin.close()
    yield server, secrets
    server.stop()


def role_settings(role_valkey: tuple[ValkeyProcess, dict[str, str]], role: str, queue: str, *,
                  serverless: bool = False) -> Settings:
    """A role's settings as the stack gives them: the worker its credentials in INFERQ_REDIS_AUTH (an ECS secret
    of its container), the functions theirs from their own secret (here: in the URL, as the secret's reader
    would hand them to redis-py). ``serverless``: as the user with the serverless cache's rules."""
    server, secrets = role_valkey
    user = f"{role}-serverless" if serverless else role
    if role == "worker":
        auth = json.dumps({"username": user, "token": secrets[role]})
        return Settings(redis_url=server.url, redis_auth=auth, queue=queue, retry_base_ms=0)
    return Settings(redis_url=f"redis://{user}:{secrets[role]}@{server.host}:{server.port}/0", queue=queue,
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
    expected = {role: {"Rules": acl.access_string(role), "ServerlessRules": acl.access_string(role, serverless=True)}
                for role in acl.ROLES}
    assert rules == expected, "infra/cache.yaml is out of date: python scripts/gen_cache_acl.py"
    resources = cache["Resources"]
    for kind in ("AWS::ElastiCache::User", "AWS::MemoryDB::User"):
        users = {name: r["Properties"] for name, r in resources.items() if r["Type"] == kind}
        roles = {_role_of(u["AccessString"]) for u in users.values() if u["AccessString"] != "off -@all"}
        assert roles == set(acl.ROLES), kind
        # each role's password is the token of its own secret
        for name, user in users.items():
            if user["AccessString"] == "off -@all":
                continue
            role = _role_of(user["AccessString"])
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


def _role_of(access: Any) -> str:
    """The role whose rules a user's AccessString takes: MemoryDB's a plain FindInMap of Rules, ElastiCache's
    ServerlessRules on a serverless cache and Rules otherwise."""
    if "Fn::If" in access:
        condition, serverless, nodes = access["Fn::If"]
        assert condition == "IsServerless" and serverless["Fn::FindInMap"][2] == "ServerlessRules"
        assert nodes["Fn::FindInMap"][2] == "Rules" and serverless["Fn::FindInMap"][1] == nodes["Fn::FindInMap"][1]
        return str(nodes["Fn::FindInMap"][1])
    assert access["Fn::FindInMap"][2] == "Rules"
    return str(access["Fn::FindInMap"][1])


def test_every_rule_is_one_elasticache_and_memorydb_accept() -> None:
    """Issue 40 leftovers, point 2 (the documents are cited in inferq/redis/acl.py and infra/cache.yaml): only the rule
    forms their access strings take, no password and no ``reset``, no command either service restricts, and on
    ElastiCache Serverless neither WAIT (restricted) nor CLIENT SETINFO (not supported)."""
    restricted = {"acl", "bgrewriteaof", "bgsave", "cluster", "config", "debug", "migrate", "module", "psync",
                  "replicaof", "save", "slaveof", "shutdown", "sync"}
    restricted_serverless = restricted | {
        "client|caching", "client|getredir", "client|id", "client|info", "client|kill", "client|list",
        "client|no-evict", "client|pause", "client|tracking", "client|trackinginfo", "client|unblock",
        "client|unpause", "commandlog", "fcall", "fcall_ro", "function", "keys", "lastsave", "latency", "memory",
        "monitor", "move", "object", "pfdebug", "pfselftest", "psubscribe", "punsubscribe", "script|kill",
        "slowlog", "swapdb", "wait",
    }
    serverless_supported_client = {"client|getname", "client|reply", "client|setname"}
    for role in acl.ROLES:
        for serverless in (False, True):
            rules = acl.access_string(role, serverless=serverless).split()
            head = ["on", f"~{acl.KEY_PATTERN}", "resetchannels", f"&{acl.CHANNEL_PATTERN}", "-@all"]
            assert rules[:5] == head, rules[:5]
            allowed = [r[1:] for r in rules[5:]]
            assert all(r.startswith("+") and re.fullmatch(r"[a-z_]+(\|[a-z-]+)?", r[1:]) for r in rules[5:])
            assert not any(r.startswith((">", "<", "#", "!")) or r in ("reset", "nopass") for r in rules)
            banned = restricted_serverless if serverless else restricted
            for command in allowed:
                assert command not in banned and command.split("|")[0] not in banned, (role, serverless, command)
                if serverless and command.startswith("client|"):
                    assert command in serverless_supported_client, (role, command)
        assert set(acl.commands(role)) - set(acl.commands(role, serverless=True)) == set(acl.NOT_SERVERLESS)
        # and every one is among the commands ElastiCache Serverless documents as supported: a command added to
        # inferq/redis/acl.py must be checked against that page (and added here) first
        missing = set(acl.commands(role, serverless=True)) - SERVERLESS_SUPPORTED
        assert not missing, (role, sorted(missing))


SERVERLESS_SUPPORTED = {
    # transcribed from "Supported and restricted Valkey, Memcached, and Redis OSS commands" (ElastiCache), the
    # families inferq uses: https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/SupportedCommands.html
    "auth", "client|getname", "client|reply", "client|setname", "echo", "hello", "ping", "quit", "reset", "select",
    "copy", "del", "dump", "exists", "expire", "expireat", "expiretime", "persist", "pexpire", "pexpireat",
    "pexpiretime", "pttl", "randomkey", "rename", "renamenx", "restore", "scan", "sort", "sort_ro", "touch", "ttl",
    "type", "unlink",
    "hdel", "hexists", "hget", "hgetall", "hincrby", "hincrbyfloat", "hkeys", "hlen", "hmget", "hmset",
    "hrandfield", "hscan", "hset", "hsetnx", "hstrlen", "hvals",
    "blmove", "blmpop", "blpop", "brpop", "brpoplpush", "lindex", "linsert", "llen", "lmove", "lmpop", "lpop",
    "lpos", "lpush", "lpushx", "lrange", "lrem", "lset", "ltrim", "rpop", "rpoplpush", "rpush", "rpushx",
    "eval", "eval_ro", "evalsha", "evalsha_ro", "script|exists", "script|flush", "script|load",
    "time",
    "bzmpop", "bzpopmax", "bzpopmin", "zadd", "zcard", "zcount", "zdiff", "zdiffstore", "zincrby", "zinter",
    "zintercard", "zinterstore", "zlexcount", "zmpop", "zmscore", "zpopmax", "zpopmin", "zrandmember", "zrange",
    "zrangebylex", "zrangebyscore", "zrangestore", "zrank", "zrem", "zremrangebylex", "zremrangebyrank",
    "zremrangebyscore", "zrevrange", "zrevrangebylex", "zrevrangebyscore", "zrevrank", "zscan", "zscore", "zunion",
    "zunionstore",
    "xack", "xadd", "xautoclaim", "xclaim", "xdel", "xgroup|create", "xgroup|createconsumer", "xgroup|delconsumer",
    "xgroup|destroy", "xgroup|setid", "xinfo|consumers", "xinfo|groups", "xinfo|stream", "xlen", "xpending",
    "xrange", "xread", "xreadgroup", "xrevrange", "xtrim",
    "append", "decr", "decrby", "get", "getdel", "getex", "getrange", "getset", "incr", "incrby", "incrbyfloat",
    "lcs", "mget", "mset", "msetnx", "psetex", "set", "setex", "setnx", "setrange", "strlen", "substr",
    "discard", "exec", "multi",
    # sharded pub/sub (a job's output): "Overall best practices", "Use sharded pub/sub" recommends it and says that
    # serverless caches run even the classic pub/sub commands as sharded ones internally:
    # https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/WorkingWithRedis.html
    "spublish", "ssubscribe", "sunsubscribe",
}


def test_no_role_may_send_an_administrative_or_dangerous_command() -> None:
    for role in acl.ROLES:
        allowed = set(acl.commands(role))
        for banned in ("flushall", "flushdb", "keys", "config", "debug", "module", "script|flush", "script|kill",
                       "monitor", "shutdown", "acl", "client|kill", "eval", "function", "scan", "rename",
                       "publish", "subscribe", "psubscribe", "pubsub"):
            assert banned not in allowed, (role, banned)
        assert acl.access_string(role).startswith(
            f"on ~{acl.KEY_PATTERN} resetchannels &{acl.CHANNEL_PATTERN} -@all +")
        # sharded pub/sub of jobs' output: the scripts publish (every role runs them), only the gateway subscribes
        assert "spublish" in allowed
        subscribing = {"ssubscribe", "sunsubscribe"} & allowed
        assert subscribing == ({"ssubscribe", "sunsubscribe"} if role == "gateway" else set()), role


def test_every_command_a_script_sends_is_allowed_to_every_role() -> None:
    from pathlib import Path

    sent = set()
    for script in Path(acl.__file__).parent.parent.joinpath("queue", "scripts").rglob("*.lua"):
        # rcall('CMD' ...) and pcall(rcall, 'CMD' ...) (a refused command there is an error the script swallows);
        # a command with subcommands as the ACL names it (xinfo|groups)
        for command, sub in re.findall(r"(?:redis\.call|rcall)(?:\(|,)\s*['\"](\w+)['\"](?:\s*,\s*['\"](\w+)['\"])?",
                                       script.read_text()):
            with_sub = command.upper() in ("XINFO", "XGROUP", "CLIENT")
            sent.add(f"{command}|{sub}".lower() if with_sub else command.lower())
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
        await Worker(settings, queue, backend, webhooks=False, burst=True).run()
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


# --- a job's output followed over sharded pub/sub: the scripts publish on its stream's key name, the gateway listens


PUBLISH_OUTPUT = "return redis.call('SPUBLISH', KEYS[1], ARGV[1])"
"""What appendoutput.lua and closeoutput.lua do with a job's output (the channel is its stream's key, declared)."""
PUBLISH_ANYWHERE = "return redis.call('SPUBLISH', ARGV[1], ARGV[2])"
"""The same with an undeclared channel: whether a script's SPUBLISH is held to the caller's channel rule too."""


def role_client(role_valkey: tuple[ValkeyProcess, dict[str, str]], role: str, *, serverless: bool) -> redis.Redis:
    server, secrets = role_valkey
    user = f"{role}-serverless" if serverless else role
    return redis.Redis(host=server.host, port=server.port, username=user, password=secrets[role],
                       decode_responses=True)


def next_sharded(pubsub: Any, kind: str) -> dict[str, Any]:
    """The next message of ``kind`` the subscription gets, waiting on the connection for it (at most 10 s)."""
    until = time.monotonic() + 10
    while (left := until - time.monotonic()) > 0:
        message = pubsub.get_sharded_message(ignore_subscribe_messages=False, timeout=left)
        if message is not None and message["type"] == kind:
            return dict(message)
    raise AssertionError(f"no {kind} within 10 s")


@pytest.mark.parametrize("serverless", [False, True], ids=["node-based", "serverless-rules"])
def test_the_gateway_follows_a_jobs_output_that_a_workers_script_publishes_and_no_other_channel(
    role_valkey: tuple[ValkeyProcess, dict[str, str]], admin: redis.Redis, serverless: bool
) -> None:
    """A gateway user SSUBSCRIBEs to a job's output channel (its stream's key name) and gets what a worker user's
    script SPUBLISHes there; SUNSUBSCRIBE and PING on that connection are allowed. Outside ``inferq:*`` the gateway
    may neither subscribe nor publish (SPUBLISH, a script command, is every role's directly too, on ``inferq:*``
    only), no script may publish there for a worker, and no role may use classic pub/sub; only the gateway
    subscribes."""
    channel = "inferq:{q}:out:job_x"
    publish = admin.script_load(PUBLISH_OUTPUT)
    anywhere = admin.script_load(PUBLISH_ANYWHERE)
    gateway = role_client(role_valkey, "gateway", serverless=serverless)
    worker = role_client(role_valkey, "worker", serverless=serverless)
    pubsub = gateway.pubsub()
    try:
        pubsub.ssubscribe(channel)
        assert next_sharded(pubsub, "ssubscribe")["channel"] == channel
        assert worker.evalsha(publish, 1, channel, "chunk-1") == 1  # one subscriber got it
        got = next_sharded(pubsub, "smessage")
        assert (got["channel"], got["data"]) == (channel, "chunk-1")
        pubsub.ping()
        assert next_sharded(pubsub, "pong") is not None
        pubsub.sunsubscribe(channel)
        assert next_sharded(pubsub, "sunsubscribe")["channel"] == channel

        # outside the queue's channels: refused to the gateway's subscription, its SPUBLISH and a worker's script
        elsewhere = "tenant-data:{q}:out:job_x"
        with pytest.raises(redis.exceptions.NoPermissionError, match="access a channel"):
            gateway.execute_command("SSUBSCRIBE", elsewhere)
        with pytest.raises(redis.exceptions.NoPermissionError, match="access a channel"):
            gateway.spublish(elsewhere, "x")
        assert gateway.spublish(channel, "x") == 0  # nobody listening now; allowed on the queue's channels
        with pytest.raises(redis.exceptions.ResponseError, match=r"ACL failure in script: .* access a channel"):
            worker.evalsha(anywhere, 0, elsewhere, "x")
        assert worker.evalsha(anywhere, 0, channel, "x") == 0
    finally:
        pubsub.close()
        gateway.close()
        worker.close()
    for role in acl.ROLES:
        for command in (("PUBLISH", channel, "x"), ("SUBSCRIBE", channel), ("PSUBSCRIBE", "inferq:*")):
            assert "no permissions" in dry_run(admin, role, *command), (role, command)
        if role != "gateway":
            assert "no permissions" in dry_run(admin, role, "SSUBSCRIBE", channel), role
    # the server refused exactly those (and, with the serverless rules, redis-py's CLIENT SETINFO on connect)
    suffix = "-serverless" if serverless else ""
    refused = set(refusals(admin))
    assert refused == {(f"gateway{suffix}", elsewhere), (f"worker{suffix}", elsewhere),
                       *((f"{role}{suffix}", "client|setinfo") for role in ("gateway", "worker") if serverless)}


# --- every other flow of each role, as its own user (issue 40 leftovers, point 1) ---

BUCKET = "inferq-acl-flows"
WEBHOOK_SECRET = "whsec_dGVzdCBrZXk="


@pytest.fixture
def hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpsReceiver]:
    """A loopback HTTPS webhook receiver (the API takes https URLs only) whose private CA the senders trust
    through SSL_CERT_FILE, as a deployment with a company CA would."""
    from inferq.webhooks import guarded_http

    ca_path, server_tls = private_ca(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_path))
    guarded_http._verifying_context.cache_clear()  # read once per process
    receiver = HttpsReceiver(server_tls)
    yield receiver
    receiver.close()
    monkeypatch.undo()
    guarded_http._verifying_context.cache_clear()


async def _upload_in_parts(gateway: httpx.AsyncClient, data: bytes) -> str:
    opened = await gateway.post("/v1/uploads", headers=A, json={
        "filename": "in.jsonl", "purpose": "batch", "bytes": len(data), "mime_type": "application/jsonl"})
    assert opened.status_code == 200, opened.text
    upload_id = opened.json()["id"]
    half = len(data) // 2
    part_ids = []
    for chunk in (data[:half], data[half:]):
        part = await gateway.post(f"/v1/uploads/{upload_id}/parts", headers=A, files={"data": ("blob", chunk)})
        assert part.status_code == 200, part.text
        part_ids.append(part.json()["id"])
    done = await gateway.post(f"/v1/uploads/{upload_id}/complete", headers=A, json={"part_ids": part_ids})
    assert done.status_code == 200, done.text
    return str(done.json()["file"]["id"])


def _batch_line(custom_id: str) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "m", "messages": [{"role": "user", "content": custom_id}]}}).encode()


@pytest.mark.parametrize("serverless", [False, True], ids=["node-based", "serverless-rules"])
async def test_files_batches_webhooks_long_polls_and_reclaims_run_as_each_roles_own_user(
    role_valkey: tuple[ValkeyProcess, dict[str, str]], queue_name: str, ecs: Any,  # noqa: F811
    admin: redis.Redis, hooks: HttpsReceiver, serverless: bool,
) -> None:
    """The flows the first test leaves out, each as the role that runs it in the stack, against the rules
    infra/cache.yaml ships: the gateway uploads a file in parts and another in one request, lists files, creates,
    lists, reads and cancels batches, reads and rotates the tenant's webhook signing secret, submits with a
    webhook, long-polls a job while it runs, reads the feed and the dead letters and redrives one; the scaler's
    batch driver expands and finishes batches and its webhook pass delivers; workers pull, renew a lease, die
    holding a job, reclaim it, finish, dead-letter, and deliver webhooks. Nothing is refused (the server's ACL
    LOG stays empty), and every flow did its work. Run twice: with the node-based cache's rules and with the
    serverless cache's (no WAIT, no CLIENT SETINFO: redis-py's refused SETINFO on connect is not a failure)."""
    import boto3

    from functions.storage import FileStore
    from inferq.batches.driver import BatchDriver
    from inferq.webhooks.sender import WebhookSender, deliver_webhooks

    boto3.client("s3").create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    extra = {"files_bucket": BUCKET, "tenant_max_files": 100, "tenant_max_file_bytes": 10**9,  # quota checks too
             "webhook_allow_private": True, "webhook_secret": WEBHOOK_SECRET}
    as_gateway = role_settings(role_valkey, "gateway", queue_name, serverless=serverless).replace(**extra)
    as_scaler = role_settings(role_valkey, "scaler", queue_name, serverless=serverless).replace(**extra)
    as_worker = role_settings(role_valkey, "worker", queue_name, serverless=serverless).replace(
        **extra, claim_idle_ms=0, max_attempts=1)
    app = create_app(as_gateway, keys=KEYS, waker=_no_wake)
    gateway = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
    scaler = Queue.connect(as_scaler)
    worker_a = Queue.connect(as_worker)
    try:
        # --- gateway: files (in parts and whole), batches, the webhook secret
        lines = b"\n".join(_batch_line(f"line-{i}") for i in range(3)) + b"\n"
        parted = await _upload_in_parts(gateway, lines)
        whole = await gateway.post("/v1/files", headers=A, files={"file": ("in.jsonl", lines)},
                                   data={"purpose": "batch"})
        assert whole.status_code == 200, whole.text
        listed = (await gateway.get("/v1/files", headers=A)).json()["data"]
        assert {f["id"] for f in listed} >= {parted, whole.json()["id"]}
        batches = []
        for file_id in (parted, whole.json()["id"]):
            made = await gateway.post("/v1/batches", headers=A, json={
                "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
            assert made.status_code == 200, made.text
            batches.append(made.json()["id"])
        assert {b["id"] for b in (await gateway.get("/v1/batches", headers=A)).json()["data"]} == set(batches)
        assert (await gateway.post(f"/v1/batches/{batches[1]}/cancel", headers=A)).status_code == 200
        secret = await gateway.get("/v1/webhooks/secret", headers=A)
        assert secret.status_code == 200, secret.text
        rotated = await gateway.post("/v1/webhooks/secret/rotate", headers=A)
        assert rotated.status_code == 200, rotated.text

        # --- gateway: jobs with a webhook; one will be held by a worker that dies
        hook_url = f"https://127.0.0.1:{hooks.port}/hook"
        hooked_answer = await gateway.post("/v1/jobs", json={**chat(), "webhook_url": hook_url}, headers=A)
        assert hooked_answer.status_code == 202, hooked_answer.text
        hooked = hooked_answer.json()
        held = (await gateway.post("/v1/jobs", json=chat(), headers=A)).json()
        doomed = (await gateway.post("/v1/jobs", json=chat(fail_attempts=9), headers=A)).json()  # dead-lettered
        waiting = asyncio.create_task(gateway.get(f"/v1/jobs/{hooked['id']}?wait=20", headers=A))

        # --- scaler: the batch driver expands the batches into jobs (and settles the cancelled one)
        driver = BatchDriver(scaler, FileStore(BUCKET), as_scaler)
        await driver.run_once()

        # --- worker A: pulls one job, renews its lease, then dies holding it
        await worker_a.ensure_groups()
        taken, _ = await worker_a.read("worker-a", 1)
        assert len(taken) == 1
        assert len(await worker_a.renew("worker-a", taken)) == 1

        # --- worker B: reclaims it and runs everything (claim_idle_ms 0: A's job is reclaimable at once)
        await work_until_idle(as_worker)
        answer = await waiting
        assert answer.status_code == 200 and answer.json()["status"] == "succeeded", answer.text
        for job_id in (held["id"], taken[0].job.id):
            assert (await gateway.get(f"/v1/jobs/{job_id}", headers=A)).json()["status"] == "succeeded"
        assert (await gateway.get(f"/v1/jobs/{doomed['id']}", headers=A)).json()["status"] == "failed"
        assert (await scaler.stats()).get("reclaimed", 0) >= 1

        # --- scaler: the driver feeds the batch's lines and finishes it (its output file written) as workers run
        # them, then a webhook pass delivers
        for _ in range(5):
            await driver.run_once()
            await work_until_idle(as_worker)
            done = (await gateway.get(f"/v1/batches/{batches[0]}", headers=A)).json()
            if done["status"] == "completed":
                break
        assert done["status"] == "completed" and done["request_counts"]["completed"] == 3, done
        output = await gateway.get(f"/v1/files/{done['output_file_id']}/content", headers=A)
        assert output.status_code == 200 and len(output.content.splitlines()) == 3
        cancelled = (await gateway.get(f"/v1/batches/{batches[1]}", headers=A)).json()
        assert cancelled["status"] in ("cancelling", "cancelled"), cancelled
        report = await deliver_webhooks(scaler, as_scaler, consumer="scaler", budget_s=10.0)
        # --- a worker's sender delivers too (nothing left, or what the scaler's pass did not take)
        sender = WebhookSender(worker_a, as_worker, "worker-b-webhooks")
        try:
            report_w = await sender.deliver_once(budget_s=10.0)
        finally:
            await sender.aclose()
        delivered = {json.loads(body)["id"] for _, body in hooks.requests}
        assert report.delivered + report_w.delivered >= 1 and hooked["id"] in delivered, delivered

        # --- gateway: the feed, the dead letters and a redrive, then the worker runs the redriven job
        assert (await gateway.get("/v1/events?limit=50", headers=A)).status_code == 200
        dead = (await gateway.get("/v1/dlq", headers=A)).json()["data"]
        assert [d["id"] for d in dead] == [doomed["id"]], dead
        assert (await gateway.post(f"/v1/dlq/{doomed['id']}/redrive", headers=A)).status_code == 202
        await work_until_idle(as_worker)
        assert (await gateway.get("/v1/dlq", headers=A)).json()["data"][0]["id"] == doomed["id"]
    finally:
        await gateway.aclose()
        await app.state.gateway.aclose()
        await scaler.close()
        await worker_a.close()
    refused = refusals(admin)
    if serverless:  # redis-py sends CLIENT SETINFO on connect and carries on when refused, as Serverless refuses it
        assert {command for _, command in refused} == {"client|setinfo"}, refused
        assert {user for user, _ in refused} == {f"{role}-serverless" for role in acl.ROLES}, refused
        refused = []
    assert refused == []
