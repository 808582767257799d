"""Pack Redis commands in C (hiredis) instead of Python, and write them without a task, on every connection
:func:`inferq.redis.connection.connect` opens.

redis-py's asyncio client builds every command's bytes in Python, while its sync client uses hiredis when it is
installed. The worker sends two scripts of about fifteen arguments per job, so packing was its largest single
cost: hiredis cuts the worker's CPU per job by about a quarter (see bench/worker.py); the gateway's submit (a script
of ~20 arguments) and job reads (an HMGET of 21 fields) pay the same per argument. The bytes are identical;
arguments hiredis does not take (None, bool, ...) fall back to redis-py's packer and its usual error. Standalone
and cluster clients alike.

With a socket timeout (inferq always sets one) redis-py writes every command under ``asyncio.wait_for``: on Python
3.11 a new task per command, run on the next turn of the event loop, and on 3.12+ a timeout armed and cancelled,
for a write that almost never waits (the socket takes it, or the transport buffers it under its limit).
:class:`PromptWrites` writes at once and waits, under the socket timeout, only when data is left in the transport's
buffer. Callgrind (K, ``bench/clientcost.py``): the gateway's job read 189 k -> 158 k client instructions on 3.11
(190 k -> 165 k on 3.13), a worker's start pipeline 259 k -> 223 k.

redis-py also arms the socket timeout for every reply it reads, where a pipeline's later replies have almost always
arrived with the first. :class:`BufferedReads` hands out a reply the
parser already holds whole without it; a reply still to come is read by redis-py under its timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
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


class PromptWrites:
    """Mixin for a redis-py asyncio connection class: ``send_packed_command`` without the task (3.11) or timeout
    (3.12+) it arms for every write. A write that leaves nothing in the transport's buffer is done at once; one that
    does waits for the buffer to drain, under the socket timeout. The rest is redis-py's: the connect of a closed
    connection, the health check, and what a failed write raises (``TimeoutError``, ``ConnectionError``) after
    dropping the connection. A write on a transport that is already closed (redis-py's ``disconnect`` keeps the
    writer while it waits for the close; the server reset the connection) is a ``ConnectionError`` too, which the
    connection's ``Retry`` and inferq's fault model handle, where redis-py lets uvloop's ``RuntimeError`` through."""

    async def send_packed_command(self, command: bytes | str | Iterable[bytes], check_health: bool = True) -> None:
        this: Any = self
        writer = this._writer
        timeout = this.socket_timeout
        if writer is None or not timeout or not isinstance(command, list) or not this.is_connected:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        if check_health:
            await this.check_health()
        transport = writer.transport
        if transport.is_closing():  # closed under it: a disconnect still closing it, or the server reset it
            await this.disconnect(nowait=True)
            raise RedisConnectionError("Error while writing to socket: the connection is closed.")
        try:
            writer.writelines(command)
            if transport.get_write_buffer_size():  # the socket did not take it all: wait, as redis-py would
                async with asyncio.timeout(timeout):
                    await writer.drain()
            else:
                await writer.drain()  # does not wait; raises what a lost connection left, as redis-py's does
        except TimeoutError:
            await this.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as error:
            await this.disconnect(nowait=True)
            err_no, message = ("UNKNOWN", error.args[0]) if len(error.args) == 1 else error.args[:2]
            raise RedisConnectionError(f"Error {err_no} while writing to socket. {message}.") from error
        except RuntimeError as error:  # uvloop's "unable to perform operation on <TCPTransport closed=True>"
            await this.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {error}.") from error
        except BaseException:
            await this.disconnect(nowait=True)
            raise


class BufferedReads:
    """Mixin for a redis-py asyncio connection class: ``read_response`` returns a reply the hiredis parser already
    holds whole (read from the socket with an earlier one) at once, without arming the socket timeout, which only
    bounds a wait on the socket. What it returns or raises is what redis-py's would: the reply, its error reply
    raised (``ResponseError`` and its kinds), a connection error in the reply raised after dropping the connection,
    a RESP3 push message handed to the parser's handler and the next reply read. Anything else (no whole reply
    buffered, a read with its own timeout or options) is redis-py's ``read_response``."""

    async def read_response(self, disable_decoding: bool = False, timeout: float | None = None, *,  # noqa: ASYNC109
                            disconnect_on_error: bool = True, push_request: bool | None = False) -> Any:
        this: Any = self
        parser = this._parser
        reader = getattr(parser, "_reader", None)
        if reader is None or timeout is not None or disable_decoding or push_request or not getattr(
                parser, "_connected", False):
            return await super().read_response(  # type: ignore[misc]
                disable_decoding, timeout, disconnect_on_error=disconnect_on_error, push_request=push_request)
        try:
            response = reader.gets()
        except BaseException:  # a protocol error (InvalidResponse), a reply that is not UTF-8: as redis-py's read
            if disconnect_on_error:
                await this.disconnect(nowait=True)
            raise
        if response is NOT_ENOUGH_DATA:  # still to come: read under the socket timeout
            return await super().read_response(  # type: ignore[misc]
                disable_decoding, timeout, disconnect_on_error=disconnect_on_error, push_request=push_request)
        try:
            if isinstance(response, RedisConnectionError):
                raise response
            if isinstance(response, list) and response and isinstance(response[0], RedisConnectionError):
                raise response[0]
            push = getattr(parser, "_hiredis_PushNotificationType", None)
            if push is not None and isinstance(response, push):
                await parser.handle_push_response(response)
                return await self.read_response(disconnect_on_error=disconnect_on_error)
        except BaseException:
            if disconnect_on_error:
                await this.disconnect(nowait=True)
            raise
        if this.health_check_interval:
            this.next_health_check = asyncio.get_running_loop().time() + this.health_check_interval
        if isinstance(response, ResponseError):
            raise response from None
        return response


def use_hiredis_packing(client: Any) -> bool:
    """Make the connections ``client`` opens from now on pack with hiredis and write with :class:`PromptWrites`: a
    standalone client's pool, or a cluster client's nodes (ElastiCache Serverless is always cluster mode), those it
    knows and those it finds later, which it builds from ``nodes_manager.connection_kwargs``. False when it cannot
    (no hiredis)."""
    if _pack is None:
        return False
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.connection_class = _packing(pool.connection_class)
        return True
    nodes_manager = client.nodes_manager
    kwargs = nodes_manager.connection_kwargs
    kwargs["connection_class"] = _packing(kwargs.get("connection_class") or Connection)
    for node in [*nodes_manager.startup_nodes.values(), *nodes_manager.nodes_cache.values()]:
        node.connection_class = _packing(node.connection_class)
    return True


def _packing(base: type) -> type:
    if issubclass(base, HiredisPacking):
        return base
    return type(f"HiredisPacking{base.__name__}", (HiredisPacking, PromptWrites, BufferedReads, base), {})
