"""Redis connections: one standalone or cluster client per process, with short timeouts (G8), authenticated with a
token that may be rotated while the process runs.

The cache's token lives in Secrets Manager (``INFERQ_REDIS_AUTH_SECRET``). Every new connection asks a
:class:`SecretCredentialProvider` for it (redis-py's credential-provider hook), which keeps the value for
:data:`TOKEN_TTL_S` and then reads the secret again. A connection whose AUTH the server refuses (``WRONGPASS``:
the token was rotated since it was read) makes the provider read the secret at once and tries the handshake once
more, so a rotation never needs a restart. Connections already open stay authenticated; only new ones ask.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import cache
from typing import Any

import redis.credentials
import redis.exceptions
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff

from inferq.config.settings import Settings
from inferq.redis.fastpack import use_hiredis_packing
from inferq.redis.faults import RECONNECT_ERRORS

log = logging.getLogger(__name__)

TOKEN_TTL_S = 300.0
"""How long a token read from Secrets Manager is used before it is read again (new connections only)."""
RETRY_READ_AFTER_S = 10.0
"""After a failed read with a token still in hand, how long that token is used before the next read is tried."""

Credentials = tuple[str] | tuple[str, str]


def connect(settings: Settings, *, cluster: bool | None = None, socket_timeout: float | None = None) -> Any:
    """A client for ``INFERQ_REDIS_URL``. ``cluster`` forces cluster mode (ElastiCache Serverless); by default a
    URL with ``?cluster=true`` selects it. Timeouts are short so an unreachable server is an error in seconds,
    never a hang. Commands are packed by hiredis (:mod:`inferq.redis.fastpack`)."""
    client = _client(settings, cluster=cluster, socket_timeout=socket_timeout)
    if settings.redis_auth_secret:
        _reauthenticate_on_refusal(client)
    use_hiredis_packing(client)  # after: it subclasses whatever connection class the pool (or the nodes) have by then
    return client


def _client(settings: Settings, *, cluster: bool | None, socket_timeout: float | None) -> Any:
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
        options["credential_provider"] = provider_for(settings.redis_auth_secret)
    elif settings.redis_auth:
        # Given in the environment (an ECS secret of the worker container alone): fixed for the process's life.
        options["credential_provider"] = static_provider(settings.redis_auth)
    if cluster:
        return RedisCluster.from_url(url, **options)
    options["retry"] = Retry(EqualJitterBackoff(cap=0.5, base=0.05), retries=1)
    options["retry_on_error"] = list(RECONNECT_ERRORS)  # a demoted primary: reconnect, reach the new one
    return Redis.from_url(url, **options)


async def pipelined(client: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """``commands`` in one write through redis-py's non-transactional pipeline (other clients' commands may run
    between them), every reply parsed by redis-py's callbacks, an error reply returned in its command's place."""
    if not commands:
        return []
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(await pipe.execute(raise_on_error=False))


# --- the token: Secrets Manager behind redis-py's credential provider ---


def credentials_from_secret(raw: str) -> Credentials:
    """A secret's value as AUTH arguments: JSON ``{"username": ..., "token": ...}`` (``password`` is accepted for
    ``token``) gives ``(username, token)``, a bare string or JSON without a username gives ``(token,)``."""
    try:
        value = json.loads(raw)
    except ValueError:
        return (raw,)
    if isinstance(value, dict):
        token = str(value.get("token") or value.get("password") or "")
        username = value.get("username")
        return (str(username), token) if username else (token,)
    return (str(value),)


def static_provider(raw: str) -> redis.credentials.UsernamePasswordCredentialProvider:
    """Credentials given as a secret's value itself (``INFERQ_REDIS_AUTH``), in the shapes
    :func:`credentials_from_secret` reads."""
    credentials = credentials_from_secret(raw)
    if len(credentials) == 2:
        return redis.credentials.UsernamePasswordCredentialProvider(credentials[0], credentials[1])
    return redis.credentials.UsernamePasswordCredentialProvider(password=credentials[0])


class SecretCredentialProvider(redis.credentials.CredentialProvider):
    """The cache's AUTH credentials, read from a Secrets Manager secret through Powertools' parameters utility and
    kept for ``ttl_s`` (:class:`inferq.aws.CachedSecret`).

    One provider per secret and process (:func:`provider_for`) serves every client, so a process reads the secret
    about once per ``ttl_s`` however many connections it opens. A failed read keeps a token already in hand, read
    again every :data:`RETRY_READ_AFTER_S` (a Secrets Manager outage must not take the cache with it: the server
    itself refuses a token rotated out). Thread-safe: the read is a blocking boto3 call, which an asyncio caller
    makes on a worker thread."""

    def __init__(self, secret_id: str, *, ttl_s: float = TOKEN_TTL_S, client: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from inferq.aws import CachedSecret  # no AWS SDK until a secret is read

        self.secret_id = secret_id
        self.ttl_s = ttl_s
        self.secret = CachedSecret(secret_id, ttl_s, max_stale_s=math.inf, retry_after_s=RETRY_READ_AFTER_S,
                                   client=client, clock=clock)

    @property
    def reads(self) -> int:
        """Secrets Manager reads so far (tests and diagnostics; never the value)."""
        return self.secret.reads

    def forget_client(self) -> None:
        self.secret.forget_client()

    def get_credentials(self, *, wait: bool = True) -> Credentials:
        from inferq.aws import SecretUnavailable

        try:
            return credentials_from_secret(self.secret.get(wait=wait))
        except SecretUnavailable as exc:
            log.warning("cache token: %s", exc)
            # a ConnectionError is what every caller already treats as "Redis unreachable, retry later" (G8)
            raise redis.exceptions.ConnectionError(f"cache token secret unreadable: {exc}") from exc

    async def get_credentials_async(self) -> Credentials:
        if self.secret.cached():
            return self.get_credentials(wait=False)  # the common case: from the cache, no thread hop
        return await asyncio.to_thread(self.get_credentials)

    def refresh(self, refused: Credentials) -> bool:
        """The server refused ``refused``: read the secret again now. True when it holds other credentials than
        the refused ones (worth another try); False when it does not or cannot be read."""
        from inferq.aws import SecretUnavailable

        def rotated(raw: str) -> bool:  # another connection has already read the rotated token
            return credentials_from_secret(raw) != refused

        try:
            raw = self.secret.read_now(unless=rotated)
        except SecretUnavailable as exc:
            log.warning("cache token: %s", exc)
            return False
        return rotated(raw)

    async def refresh_async(self, refused: Credentials) -> bool:
        return await asyncio.to_thread(self.refresh, refused)


@cache
def provider_for(secret_id: str) -> SecretCredentialProvider:
    """The process's one provider for a secret."""
    return SecretCredentialProvider(secret_id)


# --- a refused handshake re-reads the secret and tries once more ---


class _ReauthenticatingConnection:
    """Mixed into redis-py's connection classes: the handshake's AUTH refused with the provider's credentials
    (``WRONGPASS``) re-reads the secret and, when it changed, runs the handshake once more on the same socket (the
    server keeps a connection open after a refused AUTH)."""

    credential_provider: Any

    async def _handshake(self, run: Callable[[], Awaitable[None]]) -> None:
        provider = self.credential_provider
        if not isinstance(provider, SecretCredentialProvider):
            await run()
            return
        used = await provider.get_credentials_async()
        try:
            await run()
        except redis.exceptions.AuthenticationError:
            if not await provider.refresh_async(used):
                raise
            log.info("cache token: refused; secret %s re-read, authenticating again", provider.secret_id)
            await run()

    async def on_connect(self) -> None:
        if _HANDSHAKE_WITH_HEALTH:
            await super().on_connect()  # type: ignore[misc]  # runs on_connect_check_health, wrapped below
        else:
            await self._handshake(super().on_connect)  # type: ignore[misc]

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        parent = super().on_connect_check_health  # type: ignore[misc]
        await self._handshake(lambda: parent(check_health=check_health))


# redis-py 6 and later run the handshake as on_connect_check_health; 5.x as on_connect.
_HANDSHAKE_WITH_HEALTH = hasattr(Connection, "on_connect_check_health")


class ReauthenticatingConnection(_ReauthenticatingConnection, Connection):
    pass


class ReauthenticatingSSLConnection(_ReauthenticatingConnection, SSLConnection):
    pass


def _reauthenticating(connection_class: type) -> type:
    return ReauthenticatingSSLConnection if issubclass(connection_class, SSLConnection) else ReauthenticatingConnection


def _reauthenticate_on_refusal(client: Any) -> None:
    """Give a client's future connections the re-reading handshake. A standalone pool's ``connection_class`` is
    public; the cluster client builds its nodes from ``nodes_manager.connection_kwargs`` (plus the startup nodes
    made in its constructor), which it offers no parameter for, so those are set here. Clients connect lazily:
    no connection exists yet."""
    if isinstance(client, RedisCluster):
        kwargs = client.nodes_manager.connection_kwargs
        kwargs["connection_class"] = _reauthenticating(kwargs["connection_class"])
        nodes = [*client.nodes_manager.startup_nodes.values(), *client.nodes_manager.nodes_cache.values()]
        for node in nodes:
            node.connection_class = _reauthenticating(node.connection_class)
        return
    pool = client.connection_pool
    pool.connection_class = _reauthenticating(pool.connection_class)
