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
read, 271 k -> 251 k per worker start (callgrind, K). Writes are :class:`inferq.redis.fastpack.PromptWrites`' (no task
per write): 158 k per job read, 223 k per worker start.

Commands that many callers send alone at the same time (a gateway's requests: a submit's script, a wait's read)
share writes: the ones sent in one turn of the event loop go out in one write on one connection, and each caller
is handed its own reply (:meth:`LeanRedis._joined`, what ioredis calls auto-pipelining). Under S3's load the
gateway wrote about five commands a write this way, where redis-py writes each on a connection of its own: a
system call and a read event on both sides saved per command. Each keeps a single command's semantics (its own
error, an argument that cannot be encoded failing its caller alone, the one resend, a cancelled caller leaving the
connection in step).

Pipelines pay more: a worker's start, a script call and the record's read in one redis-py pipeline, cost 396 k
instructions (251 k through :meth:`LeanRedis.pipelined`) against 61 k for the same two commands written at once
and read back. :meth:`LeanRedis.pipelined` (and :func:`pipelined`, which takes any client) sends a list of commands
the way a non-transactional redis-py pipeline does with ``raise_on_error=False``, for the workers' batched
transitions and the waiters' record reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from redis.asyncio import Redis
from redis.asyncio.connection import ConnectionPool
from redis.client import EMPTY_RESPONSE, NEVER_DECODE
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:  # redis-py 5.1 and later; with an older one connect() keeps redis-py's client
    from redis.event import AsyncAfterConnectionReleasedEvent, AsyncReAuthConnectionListener
except ImportError:  # pragma: no cover - depends on the installed redis-py
    AsyncAfterConnectionReleasedEvent = AsyncReAuthConnectionListener = None  # type: ignore[assignment,misc]

AVAILABLE = AsyncAfterConnectionReleasedEvent is not None and all(
    hasattr(ConnectionPool, name) for name in ("get_available_connection", "ensure_connection"))
"""Whether the installed redis-py has the pool this builds on."""

T = TypeVar("T")

UNENCODABLE: tuple[type[Exception], ...] = (DataError, UnicodeEncodeError)
"""What a command raises, before anything of it is written, for an argument that cannot be encoded (a lone
surrogate in a str; a type Redis has no form for: redis-py's ``DataError``)."""


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


JOINED_COMMANDS = frozenset({"EVALSHA", "HMGET", "HGET", "HGETALL"})
"""The commands that callers sending at the same time share one write for (:meth:`LeanRedis._joined`): the ones a
request and a job's transitions send alone, none of them blocking, each safe to send again (every inferq script is,
G9; a read is)."""


class LeanRedis(Redis):
    """``Redis`` whose single commands take :meth:`execute_command` below."""

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> LeanRedis:  # type: ignore[override]
        client = cls(connection_pool=LeanConnectionPool.from_url(url, **kwargs))
        client.auto_close_connection_pool = True  # the client owns its pool, as Redis.from_url makes it
        return client

    _joining: list[_Joined] | None = None
    _outstanding = 0
    """Joinable commands written and not yet answered, less those that joined another's write."""
    _handed_over: set[asyncio.Task[None]] | None = None

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.single_connection_client or NEVER_DECODE in options or EMPTY_RESPONSE in options:
            return await super().execute_command(*args, **options)
        if args[0] in JOINED_COMMANDS:
            response = await self._joined(args)
        else:
            response = await self._on_a_connection(_one(args))
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
        replies = await self._on_a_connection(_many(commands))
        out: list[Any] = []
        for command, reply in zip(commands, replies, strict=True):
            callback = None if isinstance(reply, ResponseError) else self.response_callbacks.get(command[0])
            value = reply if callback is None else callback(reply)
            out.append(await value if inspect.isawaitable(value) else value)
        return out

    async def _joined(self, command: tuple[Any, ...]) -> Any:
        """``command``'s raw reply, the command written together with the other callers' joinable commands sent in
        the same turn of the event loop while others are in flight: the first caller of a turn waits for the end
        of that turn, then writes them all at once on one connection and hands each its reply; the others wait
        for theirs. With nothing else in flight (no load, a Lambda's one request) a command is written at once.

        A single command's semantics are kept for each: its own error reply, or an argument that cannot be encoded,
        raised to it alone (the others are written and answered); a connection error or timeout resends the batch
        once (every joined command is safe to resend), then is raised to all; a ``READONLY`` reply (a demoted
        primary) drops the connection and sends that command again alone, with a single command's own resend. A
        caller cancelled while waiting has its reply dropped and leaves the rest served; a first caller cancelled
        before its batch is answered hands the others' commands to a task that
        sends them again."""
        batch = self._joining
        if batch is not None:
            waiting: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            batch.append(_Joined(command, waiting))
            return await waiting
        self._outstanding += 1
        try:
            if self._outstanding == 1:  # nothing else in flight (no load; a Lambda's one request): no one to wait for
                return await self._on_a_connection(_one(command))
            batch = self._joining = [_Joined(command, None)]
            try:
                await asyncio.sleep(0)  # the end of this turn: the callers made ready with this one join it
            except BaseException:
                self._joining = None
                self._hand_over(batch[1:])
                raise
            self._joining = None
            if len(batch) == 1:
                return await self._on_a_connection(_one(command))
            try:
                return await self._send_joined(batch)
            except BaseException:  # cancelled (or stopped) before every caller was answered: the rest are sent again
                self._hand_over(batch[1:])
                raise
        finally:
            self._outstanding -= 1

    async def _send_joined(self, batch: list[_Joined]) -> Any:
        """One write of ``batch``'s commands; every waiting caller answered as soon as its reply is in. The reply of
        the entry without a future (the first caller's) is returned, or raised when it is an error. A command
        answered ``READONLY`` (a demoted primary: the connection is dropped) is sent again alone, with the single
        command's own resend, the refused ones side by side; what that resend meets is that command's alone."""
        try:
            replies = await self._on_a_connection(_many([entry.command for entry in batch], shared=True))
        except Exception as error:  # not a cancellation: the caller hands the others over (_joined)
            for entry in batch:
                _answer(entry, error)
            raise
        refused = [i for i, reply in enumerate(replies) if isinstance(reply, _Resend)]
        for entry, reply in zip(batch, replies, strict=True):
            if not isinstance(reply, _Resend):
                _answer(entry, reply)
        if refused:
            again = await asyncio.gather(*(self._alone(batch[i].command) for i in refused))
            for i, reply in zip(refused, again, strict=True):
                replies[i] = reply
                _answer(batch[i], reply)
        own = next((reply for entry, reply in zip(batch, replies, strict=True) if entry.waiting is None), None)
        if isinstance(own, Exception):
            raise own
        return own

    async def _alone(self, command: tuple[Any, ...]) -> Any:
        """``command`` sent alone: its reply, or the error it met (a reply of its own, a connection error)."""
        try:
            return await self._on_a_connection(_one(command))
        except Exception as error:
            return error

    def _hand_over(self, rest: list[_Joined]) -> None:
        rest = [entry for entry in rest if entry.waiting is not None and not entry.waiting.done()]
        if not rest:
            return

        waiting = [entry.waiting for entry in rest if entry.waiting is not None]

        async def send() -> None:
            try:
                with contextlib.suppress(Exception):  # raised to each waiting caller already
                    await self._send_joined(rest)
            finally:  # cancelled (the client closing, or every caller gone): nobody is left waiting
                for future in waiting:
                    future.cancel()

        if self._handed_over is None:
            self._handed_over = set()
        task = asyncio.ensure_future(send())
        self._handed_over.add(task)  # a task with no reference may be collected before it is done
        task.add_done_callback(self._handed_over.discard)
        def gone(_: asyncio.Future[Any]) -> None:  # every caller answered or cancelled: stop sending for them
            if all(future.done() for future in waiting) and not task.done():
                task.cancel()

        for future in waiting:
            future.add_done_callback(gone)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """redis-py's, after the commands handed over to a task (:meth:`_joined`) are stopped."""
        tasks = list(self._handed_over or ())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await super().aclose(close_connection_pool)

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


class _Resend(NamedTuple):
    """In a joined batch's replies: an error reply the connection's ``Retry`` resends a single command on."""

    error: ResponseError


def _answer(entry: _Joined, reply: Any) -> None:
    """Hand a waiting caller its reply (an error is raised to it); one cancelled meanwhile has it dropped."""
    if entry.waiting is not None and not entry.waiting.done():
        if isinstance(reply, Exception):
            entry.waiting.set_exception(reply)
        else:
            entry.waiting.set_result(reply)


class _Joined(NamedTuple):
    command: tuple[Any, ...]
    waiting: asyncio.Future[Any] | None
    """None for the caller that writes the batch"""


def _one(command: tuple[Any, ...]) -> Callable[[Any], Awaitable[Any]]:
    async def send_and_read(conn: Any) -> Any:
        await conn.send_packed_command(conn.pack_command(*command))
        return await conn.read_response()

    return send_and_read


def _many(commands: Sequence[tuple[Any, ...]], *, shared: bool = False
          ) -> Callable[[Any], Awaitable[list[Any]]]:
    """Write ``commands`` at once and read every reply, an error reply in its command's place. With ``shared`` (the
    commands are several callers', :meth:`LeanRedis._joined`), each is kept a single command: one that cannot be
    encoded is not written and has its encoding error in its place (:func:`_pack`), and an error reply the single
    command's ``Retry`` would resend on (``READONLY``: the connection's ``retry_on_error``) is a :class:`_Resend`
    and drops the connection once all are read, as the ``Retry`` drops it."""

    async def send_and_read(conn: Any) -> list[Any]:
        unsendable, packed = _pack(conn, commands, alone=shared)
        replies: list[Any] = []
        if packed:
            await conn.send_packed_command(packed)
        for i in range(len(commands)):  # every reply read before anything is raised: the connection stays in step
            if i in unsendable:
                replies.append(unsendable[i])
                continue
            try:
                replies.append(await conn.read_response())
            except ResponseError as error:
                replies.append(error)
        if shared and any(isinstance(reply, ResponseError) for reply in replies):
            retried = tuple(kind for kind in conn.retry_on_error or () if issubclass(kind, ResponseError))
            if retried and any(isinstance(reply, retried) for reply in replies):
                replies = [_Resend(reply) if isinstance(reply, retried) else reply for reply in replies]
                await conn.disconnect()
        return replies

    return send_and_read


def _pack(conn: Any, commands: Sequence[tuple[Any, ...]], *, alone: bool) -> tuple[dict[int, Exception], list[bytes]]:
    """The bytes of ``commands``, and the error of each command that cannot be encoded (a lone surrogate in a str,
    an argument of a type Redis has no form for). Such a command is never written. With ``alone`` (a shared write:
    its commands are different callers'), it is left out and its error is that caller's reply alone, while the
    others are written; otherwise (one caller's pipeline) the error is raised before anything is written, as
    redis-py's pipeline raises it. Each command is packed on its own only when packing them together failed."""
    try:
        return {}, conn.pack_commands(commands)
    except Exception:
        if not alone:
            raise
    unsendable: dict[int, Exception] = {}
    for i, command in enumerate(commands):
        try:
            conn.pack_command(*command)
        except Exception as error:
            unsendable[i] = error
    sendable = [command for i, command in enumerate(commands) if i not in unsendable]
    return unsendable, conn.pack_commands(sendable) if sendable else []


async def pipelined(client: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """:meth:`LeanRedis.pipelined` on a :class:`LeanRedis`; on any other client (cluster mode) the same through
    redis-py's non-transactional pipeline."""
    if isinstance(client, LeanRedis):
        return await client.pipelined(commands)
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(await pipe.execute(raise_on_error=False))
