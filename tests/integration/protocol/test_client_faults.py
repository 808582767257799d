"""inferq's Redis connections (inferq/redis/connection.py: redis-py's client, its commands packed by hiredis and
written without a task, replies already read handed out at once: inferq/redis/fastpack.py) against real Valkey
servers: every fault a command can meet is handled (a closed connection resent once, a frozen server a timeout, a
cancelled command never leaves a half-read connection in the pool, the pool's limit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.exceptions
from redis.asyncio import RedisCluster

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.redis.connection import connect, pipelined
from tests.support.waiting import eventually_async

TIMEOUT_S = 0.5



@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    """A server of this test's own, to freeze and to cut."""
    own = ValkeyProcess(tmp_path / "valkey", appendfsync=None)
    own.start()
    yield own
    own.thaw()
    own.stop()


def _in_use(client: Any) -> int:
    return len(client.connection_pool._in_use_connections)


async def test_a_connection_the_server_closed_is_replaced_and_nothing_fails(server: ValkeyProcess) -> None:
    client = connect(Settings(redis_url=server.url, redis_timeout_s=TIMEOUT_S))
    assert await client.set("k", "v")
    for _ in range(3):
        assert server.kill_clients("normal") >= 1
        assert await client.get("k") == "v"  # the pool's check reconnects it, or the one resend does
    assert _in_use(client) == 0
    await client.aclose()


async def test_a_frozen_server_is_a_timeout_and_the_connection_is_not_reused(server: ValkeyProcess) -> None:
    client = connect(Settings(redis_url=server.url, redis_timeout_s=TIMEOUT_S))
    assert await client.ping()
    server.freeze()
    with pytest.raises((redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
        await client.get("k")
    assert _in_use(client) == 0
    assert all(not c.is_connected for c in client.connection_pool._available_connections)
    server.thaw()
    assert await client.set("after", "1") and await client.get("after") == "1"
    await client.aclose()


async def test_a_write_the_socket_takes_starts_no_task(valkey: ValkeyProcess, valkey_cluster: ValkeyProcess,
                                                     queue_name: str) -> None:
    """redis-py writes under ``asyncio.wait_for``, a new task per command on Python 3.11; the connections inferq's
    clients open start none: single commands in standalone and cluster mode, and standalone pipelines (a cluster
    pipeline runs each node's part as a task of its own, by design)."""
    loop = asyncio.get_running_loop()
    for url in (valkey.url, valkey_cluster.url):
        client = connect(Settings(redis_url=url, redis_timeout_s=5.0))
        k = f"{{{queue_name}}}"  # one slot: the cluster client's pipeline goes to one node
        assert await client.set(f"{k}:w", "v") is True  # connected (and the cluster's slots known)
        started: list[Any] = []

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, started: list[Any] = started,
                    **kwargs: Any) -> asyncio.Task[Any]:
            started.append(coro)
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        try:
            for i in range(20):
                assert await client.set(f"{k}:w{i}", "v") is True
            if url == valkey.url:
                assert await pipelined(client, [("GET", f"{k}:w0"), ("GET", f"{k}:w1")]) == ["v", "v"]
        finally:
            loop.set_task_factory(None)
        assert started == [], url
        await client.aclose()


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_a_write_on_a_transport_closed_under_it_is_resent_at_once(valkey: ValkeyProcess,
                                                                  valkey_cluster: ValkeyProcess, queue_name: str,
                                                                  loop_kind: str) -> None:
    """A connection the pool holds as open whose transport is already closed (what redis-py's ``disconnect`` leaves
    while it waits for the close, or a reset by the server): the write is a connection error, the connection is
    dropped and the command resent once on a new one, at once. On uvloop, redis-py's own write raises its
    ``RuntimeError`` ("the handler is closed"), which no fault handling knows; on asyncio's loop it is dropped
    silently and the command waits for its read to fail."""

    async def check(url: str) -> None:
        client = connect(Settings(redis_url=url, redis_timeout_s=30.0))
        key = f"{{{queue_name}}}:closed"
        assert await client.set(key, "1") is True
        connections = (client.connection_pool._available_connections if not isinstance(client, RedisCluster)
                       else client.get_node_from_key(key)._free)
        for conn in connections:
            conn._writer.transport.close()
        for _ in range(3):
            await asyncio.sleep(0)  # the close runs to its end (uvloop: the handle is closed)
        started = asyncio.get_running_loop().time()
        assert await client.get(key) == "1"
        assert asyncio.get_running_loop().time() - started < 10.0  # at once, not after the 30 s read timeout
        await client.aclose()

    import uvloop

    for url in (valkey.url, valkey_cluster.url):
        (uvloop.run if loop_kind == "uvloop" else asyncio.run)(check(url))


async def test_a_write_a_frozen_server_does_not_take_times_out_and_drops_the_connection(
        server: ValkeyProcess) -> None:
    """A write larger than the socket's buffers to a server that reads nothing waits for the buffer to drain, under
    the socket timeout; then the connection is dropped and the one resend times out too (its reconnect's handshake
    gets no answer)."""
    client = connect(Settings(redis_url=server.url, redis_timeout_s=TIMEOUT_S))
    assert await client.ping()
    server.freeze()
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.set("big", b"x" * (64 << 20))
        assert asyncio.get_running_loop().time() - started < 20 * TIMEOUT_S
        assert _in_use(client) == 0
        assert all(not c.is_connected for c in client.connection_pool._available_connections)
    finally:
        server.thaw()
    assert await client.set("after", "1") and await client.get("after") == "1"
    await client.aclose()


async def test_a_cancelled_command_leaves_no_half_read_connection(server: ValkeyProcess) -> None:
    client = connect(Settings(redis_url=server.url, redis_timeout_s=5.0))
    blocked = asyncio.create_task(client.blpop(["never"], timeout=3))
    await eventually_async(lambda: int(server.info("clients")["blocked_clients"]) == 1, what="the BLPOP blocked")
    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert _in_use(client) == 0
    assert await client.rpush("never", "late") == 1  # had the cancelled BLPOP's connection been reused, its
    assert await client.lpop("never") == "late"      # reply would answer these
    await client.aclose()


async def test_the_pools_limit_is_redis_pys(valkey: ValkeyProcess, queue_name: str) -> None:
    client = connect(Settings(redis_url=valkey.url, redis_max_connections=2, redis_timeout_s=5.0))
    holders = [asyncio.create_task(client.blpop([f"{queue_name}:never"], timeout=1)) for _ in range(2)]
    await eventually_async(lambda: _in_use(client) == 2, what="both connections taken")
    with pytest.raises(redis.exceptions.MaxConnectionsError):
        await client.get("k")
    assert await asyncio.gather(*holders) == [None, None]
    assert await client.get(f"{queue_name}:k") is None and _in_use(client) == 0
    await client.aclose()


async def test_pipelined_over_a_closed_connection_is_resent_and_over_a_frozen_server_times_out(
    server: ValkeyProcess,
) -> None:
    client = connect(Settings(redis_url=server.url, redis_timeout_s=TIMEOUT_S))
    assert await pipelined(client, [("SET", "k", "1"), ("INCR", "k")]) == [True, 2]
    server.kill_clients("normal")
    assert await pipelined(client, [("INCR", "k"), ("GET", "k")]) == [3, "3"]
    server.freeze()
    with pytest.raises((redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
        await pipelined(client, [("INCR", "k")])
    assert _in_use(client) == 0
    server.thaw()
    assert int(await client.get("k")) >= 3  # the frozen INCR runs when the server thaws, and its resend: G9's case
    await client.aclose()


async def test_a_released_connection_is_re_authenticated_when_it_holds_a_new_token(valkey: ValkeyProcess) -> None:
    client = connect(Settings(redis_url=valkey.url))
    assert await client.ping()
    [conn] = client.connection_pool._available_connections
    sent: list[tuple[Any, ...]] = []

    class Token:
        def try_get(self, name: str) -> str:
            return "default"

        def get_value(self) -> str:
            return "ignored"

    send_command = conn.send_command

    async def recorded(*args: Any, **kwargs: Any) -> None:
        sent.append(args)
        await send_command(*args, **kwargs)

    conn.send_command = recorded
    conn._re_auth_token = Token()  # what a streaming credential provider sets when its token is renewed
    assert await client.ping()  # released after it: re-authenticated with the new token (any password passes here)
    auth = ("AUTH", "default", "ignored")
    assert sent == [("PING",), auth] and conn._re_auth_token is None
    assert await client.ping() and sent.count(auth) == 1  # and not again without a new one
    await client.aclose()


async def test_replies_already_read_are_handed_out_without_arming_the_socket_timeout(
        valkey: ValkeyProcess, valkey_cluster: ValkeyProcess, queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-py arms the socket timeout for every reply it reads; a pipeline's later replies have almost always
    arrived with the first, and inferq's connections hand those out as they are (inferq/redis/fastpack.py). Counted
    through redis-py's own read, which still reads every reply that has to wait: on redis-py's read alone, a
    40-command pipeline takes 40."""
    waited: list[str] = []
    base_read = redis.asyncio.connection.Connection.read_response

    async def read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        waited.append(type(self).__name__)
        return await base_read(self, *args, **kwargs)

    monkeypatch.setattr(redis.asyncio.connection.Connection, "read_response", read_response)
    k = f"{{buffered{queue_name}}}"
    for url in (valkey.url, valkey_cluster.url):
        client = connect(Settings(redis_url=url))
        assert await client.set(f"{k}:v", "v") is True  # connected (and the cluster's slots known)
        waited.clear()
        commands = [("GET", f"{k}:v") if i % 4 else ("HGET", f"{k}:v", "f") for i in range(40)]
        replies = await pipelined(client, commands)
        assert [r if isinstance(r, str) else "WRONGTYPE" in str(r) for r in replies] == [
            "v" if i % 4 else True for i in range(40)]  # each error reply in its command's place
        assert 1 <= len(waited) <= 4, (url, len(waited))
        assert await client.get(f"{k}:v") == "v"  # the connection is in step
        await client.aclose()


async def test_a_push_message_among_buffered_replies_goes_to_the_parsers_handler(valkey: ValkeyProcess,
                                                                                 queue_name: str) -> None:
    """inferq's connections speak RESP3, where the server may push a message (here a client-side-caching
    invalidation: the client tracks the key it read, then changes it) between two replies already read: it goes
    to redis-py's handler, and each command still gets its own reply."""
    client = connect(Settings(redis_url=valkey.url))
    k = f"{{push{queue_name}}}:v"
    await client.set(k, "v0")
    replies = await pipelined(client, [("CLIENT", "TRACKING", "ON"), ("GET", k), ("SET", k, "v1"), ("PING",),
                                       ("GET", k), ("CLIENT", "TRACKING", "OFF")])
    assert replies == ["OK", "v0", True, True, "v1", "OK"]
    assert await client.get(k) == "v1"
    await client.aclose()


async def test_a_protocol_error_in_a_buffered_reply_drops_the_connection(valkey: ValkeyProcess) -> None:
    """As redis-py's own read does: a reply the parser cannot make sense of leaves the connection unusable, so it is
    dropped, and the next command has a new one."""
    client = connect(Settings(redis_url=valkey.url))
    assert await client.ping() is True
    conn = await client.connection_pool.get_connection()
    try:
        conn._parser._reader.feed(b"?not a reply\r\n")
        with pytest.raises(redis.exceptions.InvalidResponse):
            await conn.read_response()
        assert not conn.is_connected
    finally:
        await client.connection_pool.release(conn)
    assert await client.ping() is True
    await client.aclose()
