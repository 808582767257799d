"""The wire path of inferq's connections (inferq/fastpack.py), against real Valkey servers: a write bounded by the
client's timeout without a task per command, and every fault of a write handled as redis-py handles it (the
connection dropped, the same error raised), so the retry and the fault handling above it see what they always saw.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.exceptions

from emulator.valkey import ValkeyProcess
from inferq.connection import connect
from inferq.fastpack import HiredisPacking, TimedSend
from inferq.settings import Settings

TIMEOUT_S = 0.5
BIG = b"x" * (64 << 20)  # more than the kernel's buffers on both ends hold: a frozen server leaves the write waiting


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    """A server of this test's own, to freeze."""
    own = ValkeyProcess(tmp_path / "valkey", appendfsync=None)
    own.start()
    yield own
    own.thaw()
    own.stop()


async def _open(server: ValkeyProcess) -> tuple[Any, Any]:
    client = connect(Settings(redis_url=server.url, redis_timeout_s=TIMEOUT_S))
    connection = await client.connection_pool.get_connection()
    assert isinstance(connection, TimedSend) and connection.is_connected
    return client, connection


async def test_a_write_the_server_does_not_take_times_out_and_drops_the_connection(server: ValkeyProcess) -> None:
    client, connection = await _open(server)
    server.freeze()
    t0 = time.monotonic()
    with pytest.raises(redis.exceptions.TimeoutError, match="Timeout writing to socket"):
        await connection.send_packed_command(connection.pack_command("SET", "big", BIG))
    assert time.monotonic() - t0 < TIMEOUT_S + 2.0  # bounded by the client's timeout, not by the server
    assert not connection.is_connected  # half a command on the wire: never used again
    server.thaw()
    await client.connection_pool.release(connection)
    assert await client.set("after", "1") and await client.get("after") == "1"  # reconnects, as redis-py does
    assert await client.exists("big") == 0
    await client.aclose()


async def test_a_write_cancelled_while_it_waits_drops_the_connection(server: ValkeyProcess) -> None:
    client, connection = await _open(server)
    server.freeze()
    send = asyncio.create_task(connection.send_packed_command(connection.pack_command("SET", "big", BIG)))
    await asyncio.sleep(0.1)
    assert not send.done()
    send.cancel()
    with pytest.raises(asyncio.CancelledError):
        await send
    assert not connection.is_connected
    server.thaw()
    await client.connection_pool.release(connection)
    assert await client.ping()
    await client.aclose()


async def test_a_write_on_a_connection_the_server_closed_fails_as_a_connection_error(server: ValkeyProcess) -> None:
    """The kernel may take the bytes of a write after the peer closed: then the read reports it. Either way the
    caller gets redis-py's ConnectionError, which its retry answers with a new connection."""
    client = connect(Settings(redis_url=server.url, redis_timeout_s=TIMEOUT_S))
    assert await client.set("k", "v")
    server.kill_clients("normal")
    assert await client.get("k") == "v"  # the retry reconnected
    connection = await client.connection_pool.get_connection()
    server.kill_clients("normal")
    await asyncio.sleep(0.05)
    with pytest.raises(redis.exceptions.ConnectionError):
        await connection.send_packed_command(connection.pack_command("GET", "k"))
        await connection.read_response()
    assert not connection.is_connected
    await client.connection_pool.release(connection)
    await client.aclose()


async def test_commands_and_pipelines_start_no_task(valkey: ValkeyProcess) -> None:
    """redis-py bounds each write with asyncio.wait_for, which on Python 3.11 starts a task per command."""
    client = connect(Settings(redis_url=valkey.url, redis_timeout_s=TIMEOUT_S))
    assert await client.ping()  # connected: what follows is the steady state
    loop = asyncio.get_running_loop()
    started: list[Any] = []
    previous = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        started.append(getattr(coro, "__qualname__", coro))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(counting)
    try:
        for i in range(20):
            await client.set(f"wire:{i}", i)
        async with client.pipeline(transaction=False) as pipe:
            for i in range(20):
                pipe.get(f"wire:{i}")
            assert await pipe.execute() == [str(i) for i in range(20)]
    finally:
        loop.set_task_factory(previous)
    assert [name for name in started if "send_packed_command" in str(name)] == []
    assert len(started) <= 1  # redis-py's own: a pipeline may hand its connection back in a task
    await client.aclose()


async def test_a_cluster_client_packs_and_sends_the_same_way(valkey_cluster: ValkeyProcess) -> None:
    client = connect(Settings(redis_url=valkey_cluster.url, redis_timeout_s=TIMEOUT_S))
    assert await client.set("{wire}k", "v") and await client.get("{wire}k") == "v"
    nodes = client.get_nodes()
    assert nodes and all(issubclass(node.connection_class, TimedSend) for node in nodes)
    assert all(issubclass(node.connection_class, HiredisPacking) for node in nodes)
    assert client.nodes_manager.connection_kwargs["connection_class"] is nodes[0].connection_class
    await client.aclose()
