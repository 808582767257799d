"""redis-py's standalone asyncio client, less the layers a single command pays for and inferq never uses.

Every command the gateway and the workers send outside a pipeline goes through ``Redis.execute_command`` and the
pool's ``get_connection``/``release``. In redis-py 8 these also record OpenTelemetry-style metrics (three awaited
recorder calls and two pool-name lookups per command, with no meter configured), run a check for ``HIMPORT SET``
on every command, and wrap the call in two closures for the retry. Under callgrind (K: ``bench/clientcost.py``),
the gateway's job read (an HMGET of the record's fields) cost the client 261 k instructions through redis-py, 187 k
through this, and 59 k through bare asyncio streams and hiredis.

What this keeps, unchanged, is everything a fault touches: the connection's own ``Retry`` (inferq's one resend
after a connection or timeout error, and after ``READONLY`` from a demoted primary), the disconnect before each
retry, the pool's connection limit, health checks, the connection-released event (re-authentication with a renewed
token) and redis-py's reply callbacks. Anything unusual (a single-connection client, replies that are not to be
decoded, a command with a fallback reply) takes redis-py's own path. The check that a connection handed out is
open and holds no stray reply is stricter than redis-py's (:func:`_clean`); an open, clean connection skips
redis-py's connect step (a no-op for it, wrapped in the retry's closures), and a released one the
released-connection event when its one listener has nothing to do: 205 k -> 187 k client instructions per job
read, 271 k -> 251 k per worker start (callgrind, K). Writes are :class:`inferq.fastpack.PromptWrites`' (no task
per write): 158 k per job read, 223 k per worker start.

Pipelines pay more: a worker's start, a script call and the record's read in one redis-py pipeline, cost 396 k
instructions (251 k through :meth:`LeanRedis.pipelined`) against 61 k for the same two commands written at once
and read back. :meth:`LeanRedis.pipelined` (and :func:`pipelined`, which takes any client) sends a list of commands
the way a non-transactional redis-py pipeline does with ``raise_on_error=False``, for the workers' batched
transitions and the waiters' record reads.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.asyncio.connection import ConnectionPool
from redis.client import EMPTY_RESPONSE, NEVER_DECODE
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:  # redis-py 5.1 and later; with an older one connect() keeps redis-py's client
    from redis.event import AsyncAfterConnectionReleasedEvent, AsyncReAuthConnectionListener
except ImportError:  # pragma: no cover - depends on the installed redis-py
    AsyncAfterConnectionReleasedEvent = AsyncReAuthConnectionListener = None  # type: ignore[assignment,misc]

AVAILABLE = AsyncAfterConnectionReleasedEvent is not None and all(
    hasattr(ConnectionPool, name) for name in ("get_available_connection", "ensure_connection"))
"""Whether the installed redis-py has the pool this builds on."""

T = TypeVar("T")


class LeanConnectionPool(ConnectionPool):
    """redis-py's pool without its per-call metric recording (nothing here reads it)."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # the deprecated form: redis-py's own
            return await super().get_connection(*args, **kwargs)
        async with self._lock:
            connection = self.get_available_connection()  # MaxConnectionsError past max_connections, as redis-py
        try:
            if not (connection.is_connected and await _clean(connection)):
                await self.ensure_connection(connection)  # connects; reconnects one that holds data or was closed
            return connection
        except BaseException:
            await self.release(connection)
            raise

    async def release(self, connection: Any) -> None:
        async with self._lock:
            self._in_use_connections.remove(connection)
            if connection.should_reconnect():
                await connection.disconnect()
            self._available_connections.append(connection)
        dispatcher: Any = self._event_dispatcher
        if getattr(connection, "_re_auth_token", _UNKNOWN) is None and _only_re_auth_listens(dispatcher):
            return  # the one listener would re-authenticate a connection that has no new token: nothing to do
        await dispatcher.dispatch_async(AsyncAfterConnectionReleasedEvent(connection))


_UNKNOWN = object()


async def _clean(connection: Any) -> bool:
    """Whether an open connection may be handed out: nothing waits to be read on it and the server has not closed
    it; such a connection is disconnected here. Stricter than redis-py's own check (``ensure_connection``), which
    hands out a connection with data waiting whenever maintenance notifications are on, as they are by default
    ("auto"), in case the data is a RESP3 push notification: inferq asks for no push messages (no client-side
    caching; ElastiCache and MemoryDB send no maintenance notifications), so data waiting is a reply no command
    will read, and it would answer the next command. False when the connection is not open or the check fails
    (then ``ensure_connection`` connects it)."""
    try:
        if not await connection.can_read():
            return True
    except (RedisConnectionError, RedisTimeoutError, OSError):
        return False
    await connection.disconnect()
    return False


def _only_re_auth_listens(dispatcher: Any) -> bool:
    """Whether redis-py's default listener for a released connection (re-authentication) is its only one."""
    listeners = getattr(dispatcher, "_event_listeners_mapping", {}).get(AsyncAfterConnectionReleasedEvent)
    return listeners is not None and len(listeners) == 1 and type(listeners[0]) is AsyncReAuthConnectionListener


class LeanRedis(Redis):
    """``Redis`` whose single commands take :meth:`execute_command` below."""

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> LeanRedis:  # type: ignore[override]
        client = cls(connection_pool=LeanConnectionPool.from_url(url, **kwargs))
        client.auto_close_connection_pool = True  # the client owns its pool, as Redis.from_url makes it
        return client

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.single_connection_client or NEVER_DECODE in options or EMPTY_RESPONSE in options:
            return await super().execute_command(*args, **options)

        async def send_and_read(conn: Any) -> Any:
            await conn.send_packed_command(conn.pack_command(*args))
            return await conn.read_response()

        response = await self._on_a_connection(send_and_read)
        options.pop("keys", None)  # redis-py's client-side-cache hint, not a callback option
        callback = self.response_callbacks.get(args[0])
        if callback is None:
            return response
        value = callback(response, **options)
        return await value if inspect.isawaitable(value) else value

    async def pipelined(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``commands`` in one write on one connection, as redis-py's ``pipeline(transaction=False)`` sends them
        (not a transaction: other clients' commands may run between them), every reply read and parsed by redis-py's
        callbacks, an error reply returned in its command's place (``execute(raise_on_error=False)``). A connection
        error or timeout drops the connection and resends the whole once, as redis-py resends a pipeline."""
        if not commands:
            return []

        async def send_and_read(conn: Any) -> list[Any]:
            await conn.send_packed_command(conn.pack_commands(commands))
            replies: list[Any] = []
            for _ in commands:  # every reply read before anything is raised: the connection stays in step
                try:
                    replies.append(await conn.read_response())
                except ResponseError as error:
                    replies.append(error)
            return replies

        replies = await self._on_a_connection(send_and_read)
        out: list[Any] = []
        for command, reply in zip(commands, replies, strict=True):
            callback = None if isinstance(reply, ResponseError) else self.response_callbacks.get(command[0])
            value = reply if callback is None else callback(reply)
            out.append(await value if inspect.isawaitable(value) else value)
        return out

    async def _on_a_connection(self, send_and_read: Callable[[Any], Awaitable[T]]) -> T:
        """``send_and_read`` on a connection of the pool, under the connection's ``Retry``: a connection error or
        timeout (or ``READONLY``) drops the connection, as redis-py does before a retry, and runs it once more."""
        pool = self.connection_pool
        conn = await pool.get_connection()

        async def drop(error: BaseException, failures: int) -> None:
            await conn.disconnect(error=error, failure_count=failures)

        try:
            result: T = await conn.retry.call_with_retry(lambda: send_and_read(conn), drop, with_failure_count=True)
            return result
        finally:
            await pool.release(conn)


async def pipelined(client: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """:meth:`LeanRedis.pipelined` on a :class:`LeanRedis`; on any other client (cluster mode) the same through
    redis-py's non-transactional pipeline."""
    if isinstance(client, LeanRedis):
        return await client.pipelined(commands)
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(await pipe.execute(raise_on_error=False))
