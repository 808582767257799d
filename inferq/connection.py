"""Redis connections: one standalone or cluster client per process, with short timeouts (G8)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff

from .faults import RECONNECT_ERRORS
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
        # every long-poll waiter holds a connection while it blocks: a small pool would turn waits into 503s
        "max_connections": settings.redis_max_connections,
    }
    if settings.redis_auth_secret:
        username, password = auth_from_secret(settings.redis_auth_secret)
        options.update(username=username, password=password)
    if cluster:
        return RedisCluster.from_url(url, **options)
    options["retry"] = Retry(EqualJitterBackoff(cap=0.5, base=0.05), retries=1)
    options["retry_on_error"] = list(RECONNECT_ERRORS)  # a demoted primary: reconnect, reach the new one
    return Redis.from_url(url, **options)


@cache
def auth_from_secret(secret_id: str) -> tuple[str | None, str]:
    """The cache's AUTH token from Secrets Manager (JSON ``{"username": ..., "token": ...}`` or a bare string),
    fetched once per process, so the token never sits in plain text in a Lambda or task definition."""
    import boto3  # only processes that use a secret pay for the import

    raw = boto3.client("secretsmanager").get_secret_value(SecretId=secret_id)["SecretString"]
    try:
        value = json.loads(raw)
    except ValueError:
        return None, raw
    if isinstance(value, dict):
        return value.get("username") or None, value.get("token") or value.get("password") or ""
    return None, str(value)
