"""The cache's ACL users, one per role: what each process may send to Valkey, and on which keys.

The one place these rules are written. infra/cache.yaml carries them as the access strings of its ElastiCache and
MemoryDB users (``python scripts/gen_cache_acl.py`` writes them there; tests/infra/test_cache_acl.py checks that
the template says what this module says, and runs each role's work on a real Valkey as a user with these rules).

Every role is confined to the queue's keys (``inferq:*``) and to pub/sub channels named like them (``&inferq:*``,
after ``resetchannels`` so that it is the only channel rule). Pub/sub has one use: sharded pub/sub of a job's
output, whose channel is exactly its output stream's key name (``inferq:{Q}:out:<id>``, which hashes to the queue's
slot like the keys): inferq/queue/scripts/appendoutput.lua and closeoutput.lua SPUBLISH on it, and the gateway
SSUBSCRIBEs to it (and SUNSUBSCRIBEs) on a pub/sub connection of its own to follow the stream. Every role starts
from ``-@all``: only the commands listed are allowed. None of them is an administrative or dangerous one (no FLUSH*,
CONFIG, KEYS, DEBUG, MODULE, SCRIPT FLUSH/KILL, MONITOR, SHUTDOWN, ACL, CLIENT KILL, FUNCTION, EVAL of arbitrary
text, PUBLISH, SUBSCRIBE, PSUBSCRIBE). A command a Lua script sends is checked against the caller's rules too (its
channel as well as its keys), so every role that runs the scripts may send the commands they call
(:data:`SCRIPT_COMMANDS`, which the test compares with inferq/queue/scripts/).

What ElastiCache and MemoryDB accept (checked against their documentation; infra/cache.yaml cites it too):

- the rule syntax is Valkey's ACL syntax ("For information about the syntax of the ACL rules, see ACL"), less a
  password (the user resource holds it) and ``reset`` (it would drop that password); ``on``, ``~<pattern>``,
  ``-@all``, ``+<command>``, ``+<command>|<subcommand>`` (the ``|`` form from Redis OSS 7.0) and channel rules
  (``&``, ``resetchannels``: Redis OSS 6.2 and later) are all standard rules of it, and ElastiCache's own
  examples use ``on ~app::* -@all +@read``: ElastiCache, "Role-Based Access Control (RBAC)",
  https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/Clusters.RBAC.html#Access-string; MemoryDB,
  "Authenticating users with Access Control Lists",
  https://docs.aws.amazon.com/memorydb/latest/devguide/clusters.acls.html#access-string;
- an access string may not name a command the service restricts ("If you specify a forbidden or a renamed
  command, an exception will be thrown"). None of :func:`commands` is restricted on node-based ElastiCache or
  MemoryDB (https://docs.aws.amazon.com/memorydb/latest/devguide/restrictedcommands.html), but ElastiCache
  Serverless also restricts ``WAIT`` and does not list ``CLIENT SETINFO`` among the commands it supports
  ("Supported and restricted Valkey, Memcached, and Redis OSS commands",
  https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/SupportedCommands.html): the serverless users' rules
  (:func:`access_string` with ``serverless=True``) leave out :data:`NOT_SERVERLESS`. Neither is needed there:
  INFERQ_REDIS_WAIT_REPLICAS must stay 0 with a serverless cache (the template refuses anything else), and
  redis-py ignores a refused CLIENT SETINFO on connect. Sharded pub/sub (SPUBLISH, SSUBSCRIBE, SUNSUBSCRIBE; Valkey
  and Redis OSS 7.0+) is the pub/sub ElastiCache recommends in cluster mode, and its serverless caches run even the
  classic pub/sub commands as sharded ones internally ("Overall best practices", "Use sharded pub/sub",
  https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/WorkingWithRedis.html).
"""

from __future__ import annotations

KEY_PATTERN = "inferq:*"
"""Every key of every queue (``inferq:{Q}:...``); nothing else in the cache is any role's."""

CHANNEL_PATTERN = "inferq:*"
"""The only pub/sub channels any role may use: named like the queue's keys (a job's output is published on
``inferq:{Q}:out:<id>``, its output stream's key name)."""

ROLES = ("gateway", "scaler", "worker")

CONNECTION = ("ping", "hello", "client|setinfo", "client|setname", "wait", "multi", "exec")
"""The handshake and health checks a redis-py client sends (HELLO and CLIENT SETINFO on connect, PING when idle),
WAIT for INFERQ_REDIS_WAIT_REPLICAS, and MULTI/EXEC around pipelines that must apply together."""

SCRIPTING = ("evalsha", "script|load")
"""Scripts by SHA only, loaded once; never EVAL of arbitrary text, never SCRIPT FLUSH or KILL."""

SCRIPT_COMMANDS = (
    "del", "exists", "expire", "expireat", "get", "hdel", "hexists", "hget", "hgetall", "hincrby", "hlen", "hmget",
    "hset", "hsetnx", "hstrlen", "persist", "pexpire", "pexpireat", "pttl", "rpush", "set", "time", "xack", "xadd",
    "spublish", "xclaim", "xdel", "xinfo|groups", "xlen", "xpending", "xrange", "xrevrange", "xtrim", "zadd", "zcard",
    "zcount", "zpopmax", "zrange", "zrangebyscore", "zrem", "zremrangebylex", "zremrangebyscore", "zscore",
)
"""What inferq/queue/scripts/*.lua call (redis.call): allowed to every role, which all run scripts (SPUBLISH: a job's
output, on its channel in :data:`CHANNEL_PATTERN`)."""

_BATCHES = ("expireat", "hdel", "hgetall", "hset", "hsetnx", "zadd", "zcard", "zinter", "zintercard", "zrem",
            "zrevrangebyscore", "zscore")
"""inferq/batches/records.py, which the gateway (the Batches API) and the scaler (the batch driver) both run, and the
batch driver's own reads and writes (inferq/batches/driver.py, output.py)."""
_WEBHOOKS = ("hincrby", "xack", "xclaim", "xgroup|create", "xgroup|delconsumer", "xinfo|consumers", "xpending",
             "xreadgroup", "hsetnx")
"""inferq.webhooks: the sender's consumer group on the events stream (the scaler and the workers deliver)."""

DIRECT_COMMANDS: dict[str, tuple[str, ...]] = {
    # Accepts, reads, waits for and cancels jobs; idempotency, events feed, DLQ view (its per-tenant index: ZRANGEBYLEX
    # and ZREM of stale members), wake guard (SET NX EX), files and batches records, the file quotas' counts
    # (ZRANGEBYSCORE: expired uploads), the stats history it shows; follows jobs' output on a pub/sub connection of
    # its own (SSUBSCRIBE/SUNSUBSCRIBE of their channels, PING). Never takes a job off a stream.
    "gateway": (
        *_BATCHES, "blmove", "del", "expire", "get", "hget", "hmget", "lindex", "lrange", "pexpire", "set",
        "ssubscribe", "sunsubscribe", "xrange", "xread", "xrevrange", "zrangebylex", "zrangebyscore",
    ),
    # Observes the queue, records decisions and history, delivers webhooks, drives batches, recounts the file quotas'
    # counts (HGETALL, SET NX PX, ZADD NX, ZRANGEBYSCORE).
    "scaler": (
        *_BATCHES, *_WEBHOOKS, "del", "expire", "get", "hget", "hmget", "lindex", "lpush", "lrange", "ltrim",
        "pexpire", "set", "zrange", "zrangebyscore",
    ),
    # Takes jobs (its consumer group), renews and reclaims leases, heartbeats, delivers webhooks, finishes jobs
    # through the scripts.
    "worker": (
        *_WEBHOOKS, "hdel", "hgetall", "hkeys", "hset", "xautoclaim", "zrangebyscore",
    ),
}


NOT_SERVERLESS = ("client|setinfo", "wait")
"""What ElastiCache Serverless restricts or does not support among :data:`CONNECTION` (WAIT is restricted; CLIENT
SETINFO is not among its supported commands): left out of the serverless users' rules."""


def commands(role: str, *, serverless: bool = False) -> tuple[str, ...]:
    """Every command ``role`` may send, sorted, each once (on ElastiCache Serverless: less :data:`NOT_SERVERLESS`)."""
    allowed = set(CONNECTION) | set(SCRIPTING) | set(SCRIPT_COMMANDS) | set(DIRECT_COMMANDS[role])
    if serverless:
        allowed -= set(NOT_SERVERLESS)
    return tuple(sorted(allowed))


def access_string(role: str, *, serverless: bool = False) -> str:
    """The ACL rules of ``role`` as ElastiCache, MemoryDB and ``ACL SETUSER`` take them (no password: the cache's
    user resource holds that, and ``reset`` is refused by ElastiCache)."""
    return " ".join(["on", f"~{KEY_PATTERN}", "resetchannels", f"&{CHANNEL_PATTERN}", "-@all",
                     *(f"+{c}" for c in commands(role, serverless=serverless))])
