"""Redis connections: one standalone or cluster client per process, with short timeouts (G8)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff

from .settings import Settings


def connect(settings: Settings, *, cluster: bool | None = None, socket_timeout: float | None = None) -> Any:
    """A client for ``INFERQ_REDIS_URL``. ``cluster`` forces cluster mode (ElastiCache Serverless); by default a
    URL with ``?cluster=true`` selects it. Timeouts are short so an unreachable server is an error in seconds,
    never a hang."""
    url = settings.redis_url
    if cluster is None:
        cluster = "cluster=true" in url.lower()
        url = url.replace("?cluster=true", "").replace("&cluster=true", "")
    timeout = socket_timeout if socket_timeout is not None else settings.redis_timeout_s
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": timeout,
        "socket_connect_timeout": min(timeout, 2.0),
        "health_check_interval": 30,
    }
    if cluster:
        return RedisCluster.from_url(url, **options)
    options["retry"] = Retry(EqualJitterBackoff(cap=0.5, base=0.05), retries=1)
    return Redis.from_url(url, **options)
