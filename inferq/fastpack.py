"""The wire path of every connection :func:`inferq.connection.connect` opens: commands packed in C (hiredis), and
sent without starting a task for each.

- **Packing** (:class:`HiredisPacking`). redis-py's asyncio client builds every command's bytes in Python, while its
  sync client uses hiredis when it is installed. The worker sends two scripts of about fifteen arguments per job, so
  packing was its largest single cost: hiredis cuts the worker's CPU per job by about a quarter (see
  bench/worker.py); the gateway's submit (a script of ~20 arguments) and job reads (an HMGET of 21 fields) pay the
  same per argument. The bytes are identical; arguments hiredis does not take (None, bool, ...) fall back to
  redis-py's packer and its usual error.
- **Sending** (:class:`TimedSend`). redis-py bounds each write by ``socket_timeout`` with ``asyncio.wait_for``,
  which on Python 3.11 wraps the write in a new task: a task, its scheduling and its teardown for every command
  and every pipeline, about a fifth of a short command's client CPU here (``bench/clientcost.py``, K's client
  row). The same bound as an ``asyncio.timeout`` scope costs a timer handle. Everything else is redis-py's: a
  connection not yet open, or one with no ``socket_timeout``, takes its own path; a write that times out, fails
  or is interrupted drops the connection and raises the same errors, so redis-py's retry (and inferq's fault
  handling around it) sees what it always saw.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:  # hiredis missing or too old: keep redis-py's packer
    _pack = None


class HiredisPacking:
    """Mixin for a redis-py asyncio connection class."""

    def pack_command(self, *args: Any) -> list[bytes]:
        # like redis-py: a first argument with a space ("CLIENT SETNAME") is several words
        first = args[0]
        if (isinstance(first, str) and " " in first) or (isinstance(first, bytes) and b" " in first):
            args = (*first.split(), *args[1:])
        assert _pack is not None
        try:
            return [_pack(args)]
        except TypeError:
            fallback: list[bytes] = super().pack_command(*args)  # type: ignore[misc]
            return fallback


class TimedSend:
    """Mixin for a redis-py asyncio connection class: ``send_packed_command`` bounded by an ``asyncio.timeout``
    scope instead of ``asyncio.wait_for`` (no task per command); the errors, and the disconnect before each, are
    redis-py's."""

    socket_timeout: float | None
    is_connected: bool
    _writer: asyncio.StreamWriter | None

    async def send_packed_command(self, command: bytes | str | Iterable[bytes], check_health: bool = True) -> None:
        base: Any = super()
        if not self.is_connected or not self.socket_timeout:
            await base.send_packed_command(command, check_health)  # connects first, or writes with no bound
            return
        if check_health:
            await self.check_health()  # type: ignore[attr-defined]  # a PING when due; its failure reconnects
            if not self.is_connected:
                await base.send_packed_command(command, False)
                return
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        writer = self._writer
        assert writer is not None
        try:
            writer.writelines(command)
            async with asyncio.timeout(self.socket_timeout):
                await writer.drain()  # returns at once unless the socket's buffer is full
        except TimeoutError:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as e:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            err_no, errmsg = ("UNKNOWN", e.args[0]) if len(e.args) == 1 else (e.args[0], e.args[1])
            raise RedisConnectionError(f"Error {err_no} while writing to socket. {errmsg}.") from e
        except BaseException:
            # as redis-py: a write cut short leaves the stream mid-command, so the connection cannot be used again
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise


def _lean(connection_class: type) -> type:
    mixins = tuple(m for m in ((HiredisPacking,) if _pack is not None else ()) + (TimedSend,)
                   if not issubclass(connection_class, m))
    if not mixins:
        return connection_class
    return type(f"Lean{connection_class.__name__}", (*mixins, connection_class), {})


def use_lean_wire(client: Any) -> bool:
    """Make the connections ``client`` opens from now on pack with hiredis (when it is installed) and send
    without a task per command: a standalone client's pool, and a cluster client's nodes, those it knows and
    those it finds later. False when the client has neither."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.connection_class = _lean(pool.connection_class)
        return True
    nodes_manager = getattr(client, "nodes_manager", None)
    if nodes_manager is None:
        return False
    kwargs = nodes_manager.connection_kwargs
    kwargs["connection_class"] = _lean(kwargs.get("connection_class") or _default_connection_class())
    for node in [*nodes_manager.startup_nodes.values(), *nodes_manager.nodes_cache.values()]:
        node.connection_class = _lean(node.connection_class)
    return True


def _default_connection_class() -> type:
    from redis.asyncio.connection import Connection

    return Connection
