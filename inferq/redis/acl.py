"""The cache's ACL users, one per role: what each process may send to Valkey, and on which keys.

The one place these rules are written. infra/cache.yaml carries them as the access strings of its ElastiCache and
MemoryDB users (``python scripts/gen_cache_acl.py`` writes them there; tests/infra/test_cache_acl.py checks that
the template says what this module says, and runs each role's work on a real Valkey as a user with these rules).

Every role is confined to the queue's keys (``inferq:*``; no channels) and starts from ``-@all``: only the
commands listed are allowed. None of them is an administrative or dangerous one (no FLUSH*, CONFIG, KEYS, DEBUG,
MODULE, SCRIPT FLUSH/KILL, MONITOR, SHUTDOWN, ACL, CLIENT KILL, FUNCTION, EVAL of arbitrary text). A command a
Lua script sends is checked against the caller's rules too, so every role that runs the scripts may send the
commands they call (:data:`SCRIPT_COMMANDS`, which the test compares with inferq/queue/scripts/).
"""

from __future__ import annotations

KEY_PATTERN = "inferq:*"
"""Every key of every queue (``inferq:{Q}:...``); nothing else in the cache is any role's."""

ROLES = ("gateway", "scaler", "worker")

CONNECTION = ("ping", "hello", "client|setinfo", "client|setname", "wait", "multi", "exec")
"""The handshake and health checks a redis-py client sends (HELLO and CLIENT SETINFO on connect, PING when idle),
WAIT for INFERQ_REDIS_WAIT_REPLICAS, and MULTI/EXEC around pipelines that must apply together."""

SCRIPTING = ("evalsha", "script|load")
"""Scripts by SHA only, loaded once; never EVAL of arbitrary text, never SCRIPT FLUSH or KILL."""

SCRIPT_COMMANDS = (
    "del", "expire", "expireat", "get", "hdel", "hget", "hgetall", "hincrby", "hmget", "hset", "persist", "rpush",
    "set", "time", "xack", "xadd", "xclaim", "xdel", "xlen", "xrange", "zadd", "zcard", "zcount", "zrem",
    "zremrangebylex", "zscore",
)
"""What inferq/queue/scripts/*.lua call (redis.call): allowed to every role, which all run scripts."""

_BATCHES = ("expireat", "hdel", "hgetall", "hset", "hsetnx", "zadd", "zcard", "zinter", "zintercard", "zrem",
            "zrevrangebyscore", "zscore")
"""inferq/batches/records.py, which the gateway (the Batches API) and the scaler (the batch driver) both run, and the
batch driver's own reads and writes (inferq/batches/driver.py, output.py)."""
_WEBHOOKS = ("hincrby", "xack", "xclaim", "xgroup|create", "xgroup|delconsumer", "xinfo|consumers", "xpending",
             "xreadgroup", "hsetnx")
"""inferq.webhooks: the sender's consumer group on the events stream (the scaler and the workers deliver)."""

DIRECT_COMMANDS: dict[str, tuple[str, ...]] = {
    # Accepts, reads, waits for and cancels jobs; idempotency, events feed, DLQ view (its per-tenant index: ZRANGEBYLEX
    # and ZREM of stale members), wake guard (SET NX EX),
    # files and batches records, the stats history it shows. Never takes a job off a stream.
    "gateway": (
        *_BATCHES, "blmove", "del", "expire", "get", "hget", "hmget", "lindex", "lrange", "pexpire", "set",
        "xrange", "xread", "xrevrange", "zrangebylex",
    ),
    # Observes the queue, records decisions and history, delivers webhooks, drives batches.
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


def commands(role: str) -> tuple[str, ...]:
    """Every command ``role`` may send, sorted, each once."""
    return tuple(sorted(set(CONNECTION) | set(SCRIPTING) | set(SCRIPT_COMMANDS) | set(DIRECT_COMMANDS[role])))


def access_string(role: str) -> str:
    """The ACL rules of ``role`` as ElastiCache, MemoryDB and ``ACL SETUSER`` take them (no password: the cache's
    user resource holds that, and ``reset`` is refused by ElastiCache)."""
    return " ".join(["on", f"~{KEY_PATTERN}", "resetchannels", "-@all", *(f"+{c}" for c in commands(role))])
