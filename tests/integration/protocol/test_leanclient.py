"""inferq's standalone client (inferq/redis/leanclient.py) against real Valkey servers: the same replies and errors as
redis-py's own client, and the same handling of every fault a command can meet (a closed connection resent once,
a frozen server a timeout, a cancelled command never leaves a half-read connection in the pool, the pool's limit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.exceptions
from redis.asyncio import Redis

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.redis.connection import connect
from inferq.redis.leanclient import LeanConnectionPool, LeanRedis, pipelined

TIMEOUT_S = 0.5


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    """A server of this test's own, to freeze and to cut."""
    own = ValkeyProcess(tmp_path / "valkey", appendfsync=None)
    own.start()
    yield own
    own.thaw()
    own.stop()


async def _entries(reply: Any) -> Any:
    """A stream read's entries, without the stream's name (the two clients read streams of their own)."""
    [(_, entries)] = await reply
    return entries


def _in_use(client: Any) -> int:
    return len(client.connection_pool._in_use_connections)


def test_a_standalone_client_is_lean_and_a_cluster_client_is_redis_pys(valkey: ValkeyProcess,
                                                                      valkey_cluster: ValkeyProcess) -> None:
    standalone = connect(Settings(redis_url=valkey.url))
    assert isinstance(standalone, LeanRedis) and isinstance(standalone.connection_pool, LeanConnectionPool)
    assert standalone.auto_close_connection_pool
    assert not isinstance(connect(Settings(redis_url=valkey_cluster.url)), LeanRedis)


async def test_replies_and_errors_are_redis_pys(valkey: ValkeyProcess, queue_name: str) -> None:
    lean = connect(Settings(redis_url=valkey.url))
    plain = Redis.from_url(valkey.url, decode_responses=True)
    k = f"lean:{queue_name}"

    async def both(call: Any) -> Any:
        mine, theirs = await call(lean, "a"), await call(plain, "b")
        assert mine == theirs
        return mine

    assert await both(lambda c, s: c.set(f"{k}:{s}:str", "v", ex=60)) is True
    assert await both(lambda c, s: c.get(f"{k}:{s}:str")) == "v"
    assert await both(lambda c, s: c.incrby(f"{k}:{s}:n", 5)) == 5
    assert await both(lambda c, s: c.hset(f"{k}:{s}:h", mapping={"x": "1", "y": "2"})) == 2
    assert await both(lambda c, s: c.hgetall(f"{k}:{s}:h")) == {"x": "1", "y": "2"}
    assert await both(lambda c, s: c.hmget(f"{k}:{s}:h", ["x", "nope", "y"])) == ["1", None, "2"]
    assert await both(lambda c, s: c.exists(f"{k}:{s}:h", f"{k}:{s}:none")) == 1
    assert await both(lambda c, s: c.zadd(f"{k}:{s}:z", {"m": 1.5})) == 1
    assert await both(lambda c, s: c.zrange(f"{k}:{s}:z", 0, -1, withscores=True)) == [("m", 1.5)]
    await both(lambda c, s: c.xgroup_create(f"{k}:{s}:st", "g", id="0", mkstream=True))
    await lean.xadd(f"{k}:a:st", {"job": "j1"}, id="1-1")
    await plain.xadd(f"{k}:b:st", {"job": "j1"}, id="1-1")
    read = await both(lambda c, s: _entries(c.xreadgroup("g", "c", {f"{k}:{s}:st": ">"}, count=5)))
    assert read == [("1-1", {"job": "j1"})]
    pending = await both(lambda c, s: c.xpending(f"{k}:{s}:st", "g"))  # parsed by redis-py's callback
    assert pending["pending"] == 1 and pending["consumers"] == [{"name": "c", "pending": 1}]
    sha = await lean.script_load("return {KEYS[1], ARGV[1], 7}")
    assert await lean.evalsha(sha, 1, "kx", "arg") == ["kx", "arg", 7]
    with pytest.raises(redis.exceptions.NoScriptError):
        await lean.evalsha("0" * 40, 0)
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await lean.hget(f"{k}:a:str", "x")
    assert _in_use(lean) == 0  # every connection handed back, errors included
    await lean.aclose()
    await plain.aclose()


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
        client = connect(Settings(redis_url=url, redis_timeout_s=5.0))
        key = f"{{{queue_name}}}:closed"
        assert await client.set(key, "1") is True
        connections = (client.connection_pool._available_connections if isinstance(client, LeanRedis)
                       else client.get_node_from_key(key)._free)
        for conn in connections:
            conn._writer.transport.close()
        for _ in range(3):
            await asyncio.sleep(0)  # the close runs to its end (uvloop: the handle is closed)
        started = asyncio.get_running_loop().time()
        assert await client.get(key) == "1"
        assert asyncio.get_running_loop().time() - started < 2.0  # not the 5 s read timeout
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
    await asyncio.sleep(0.2)
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
    await asyncio.sleep(0.2)
    with pytest.raises(redis.exceptions.MaxConnectionsError):
        await client.get("k")
    assert await asyncio.gather(*holders) == [None, None]
    assert await client.get(f"{queue_name}:k") is None and _in_use(client) == 0
    await client.aclose()


async def test_pipelined_answers_as_redis_pys_pipeline(valkey: ValkeyProcess, valkey_cluster: ValkeyProcess,
                                                       queue_name: str) -> None:
    lean = connect(Settings(redis_url=valkey.url))
    plain = Redis.from_url(valkey.url, decode_responses=True)
    k = f"{{lean{queue_name}}}"
    await lean.hset(f"{k}:h", mapping={"id": "j", "status": "queued"})
    await lean.set(f"{k}:s", "v")
    sha = await lean.script_load("return {KEYS[1], tonumber(ARGV[1]) + 1}")
    commands = [("EVALSHA", sha, 1, f"{k}:h", 41), ("HGETALL", f"{k}:h"), ("HMGET", f"{k}:h", "id", "nope"),
                ("HGET", f"{k}:s", "x"), ("EVALSHA", "0" * 40, 0), ("INCR", f"{k}:n"), ("EXISTS", f"{k}:h")]
    mine = await lean.pipelined(commands)
    pipe = plain.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    theirs = list(await pipe.execute(raise_on_error=False))
    assert [type(r) for r in mine] == [type(r) for r in theirs]
    assert isinstance(mine[3], redis.exceptions.ResponseError) and "WRONGTYPE" in str(mine[3])
    assert isinstance(mine[4], redis.exceptions.NoScriptError)
    values = [r for r in mine if not isinstance(r, Exception)]
    assert values == [[f"{k}:h", 42], {"id": "j", "status": "queued"}, ["j", None], 1, 1]
    assert [r for r in theirs if not isinstance(r, Exception)] == [[f"{k}:h", 42], {"id": "j", "status": "queued"},
                                                                  ["j", None], 2, 1]  # the same INCR, once more
    assert await lean.pipelined([]) == []
    assert _in_use(lean) == 0
    cluster = connect(Settings(redis_url=valkey_cluster.url))
    assert await pipelined(cluster, [("SET", f"{k}:c", "1"), ("INCR", f"{k}:c"), ("HGET", f"{k}:c", "f")]) == [
        True, 2, ANY_RESPONSE_ERROR]
    for client in (lean, plain, cluster):
        await client.aclose()


async def test_pipelined_over_a_closed_connection_is_resent_and_over_a_frozen_server_times_out(
    server: ValkeyProcess,
) -> None:
    client = connect(Settings(redis_url=server.url, redis_timeout_s=TIMEOUT_S))
    assert await client.pipelined([("SET", "k", "1"), ("INCR", "k")]) == [True, 2]
    server.kill_clients("normal")
    assert await client.pipelined([("INCR", "k"), ("GET", "k")]) == [3, "3"]
    server.freeze()
    with pytest.raises((redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
        await client.pipelined([("INCR", "k")])
    assert _in_use(client) == 0
    server.thaw()
    assert int(await client.get("k")) >= 3  # the frozen INCR runs when the server thaws, and its resend: G9's case
    await client.aclose()


class _AnyResponseError:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, redis.exceptions.ResponseError)


ANY_RESPONSE_ERROR = _AnyResponseError()


async def test_a_connection_holding_a_stray_reply_or_at_its_end_is_replaced_before_it_is_handed_out(
    valkey: ValkeyProcess,
) -> None:
    client = connect(Settings(redis_url=valkey.url, redis_timeout_s=TIMEOUT_S))
    assert await client.ping()
    [conn] = client.connection_pool._available_connections
    # a reply no command is waiting for (what a command abandoned without a disconnect would leave behind)
    conn._writer.write(b"*1\r\n$4\r\nPING\r\n")
    await conn._writer.drain()
    for _ in range(100):
        if conn._reader._buffer:
            break
        await asyncio.sleep(0.01)
    assert await client.set("stray", "mine") and await client.get("stray") == "mine"  # not answered by the PONG
    assert client.connection_pool._available_connections[0] is conn  # the same object, connected anew
    conn._reader.feed_eof()  # the server closed it: at EOF before it is handed out
    assert await client.get("stray") == "mine"
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
    assert sent == [("AUTH", "default", "ignored")] and conn._re_auth_token is None
    assert await client.ping() and len(sent) == 1  # and not again without a new one
    await client.aclose()


# --- commands sent in one turn of the event loop share one write (LeanRedis._joined) ---


def _connections(client: Any) -> int:
    pool = client.connection_pool
    return len(pool._available_connections) + len(pool._in_use_connections)


def _reads_processed(server: ValkeyProcess) -> int:
    return int(server.info("stats")["total_reads_processed"])


async def test_commands_sent_in_one_turn_share_one_write_on_one_connection(server: ValkeyProcess) -> None:
    """What a gateway under load sends (scripts, the job reads) from many requests at once goes out in one write on
    one connection, each caller answered its own reply, parsed as alone; redis-py would open a connection and make
    a write per command. The first, sent with nothing else in flight, is written at once on a connection of its
    own: with no load, nothing waits for a turn's end."""
    client = connect(Settings(redis_url=server.url, redis_timeout_s=5.0))
    sha = await client.script_load("return {KEYS[1], ARGV[1]}")
    for i in range(20):
        await client.hset(f"h{i}", mapping={"a": str(i), "b": f"b{i}"})
    await client.aclose()
    client = connect(Settings(redis_url=server.url, redis_timeout_s=5.0))
    assert await asyncio.gather(client.ping(), client.ping()) == [True, True]  # two connections, handshakes done
    before = _reads_processed(server)
    replies = await asyncio.gather(*(
        call for i in range(20) for call in (
            client.hmget(f"h{i}", ["a", "nope", "b"]), client.hget(f"h{i}", "a"), client.hgetall(f"h{i}"),
            client.evalsha(sha, 1, f"k{i}", f"v{i}"))))
    reads = _reads_processed(server) - before - 2  # less the INFO that read the counter, and its connection's end
    assert replies == [reply for i in range(20) for reply in (
        [str(i), None, f"b{i}"], str(i), {"a": str(i), "b": f"b{i}"}, [f"k{i}", f"v{i}"])]
    assert _connections(client) == 2 and _in_use(client) == 0
    assert reads <= 3, reads  # the first alone, then one write of 79 commands (the socket may split it); 80 alone
    await client.aclose()


async def test_in_a_shared_write_an_error_reply_is_its_own_callers_alone(server: ValkeyProcess) -> None:
    client = connect(Settings(redis_url=server.url, redis_timeout_s=5.0))
    await client.set("str", "v")
    await client.hset("h", mapping={"a": "1"})
    replies = await asyncio.gather(client.hget("h", "a"), client.hget("str", "a"), client.evalsha("0" * 40, 0),
                                   client.hgetall("h"), return_exceptions=True)
    assert replies[0] == "1" and replies[3] == {"a": "1"}
    assert isinstance(replies[1], redis.exceptions.ResponseError) and "WRONGTYPE" in str(replies[1])
    assert isinstance(replies[2], redis.exceptions.NoScriptError)  # the scripts' loader knows this one
    assert _connections(client) == 2 and _in_use(client) == 0  # the first alone, the rest in one write
    assert await client.hget("h", "a") == "1"  # the connection stayed in step
    await client.aclose()


async def test_a_caller_cancelled_in_a_shared_write_leaves_the_others_answered(server: ValkeyProcess) -> None:
    """A caller that joined a write and is cancelled has its reply dropped; the caller that writes the batch,
    cancelled before the write, hands the others to a task; cancelled once the batch is written and waits for its
    replies (the server paused), the others are sent again on a new connection. Every caller left is answered its
    own reply, and no connection is left half read."""
    client = connect(Settings(redis_url=server.url, redis_timeout_s=5.0))
    for i in range(7):
        await client.hset(f"h{i}", mapping={"a": str(i)})
    assert await asyncio.gather(client.ping(), client.ping()) == [True, True]  # two connections open

    # calls[0] is written alone (nothing else in flight); calls[1] writes the rest when the turn ends
    calls = [asyncio.create_task(client.hget(f"h{i}", "a")) for i in range(7)]
    await asyncio.sleep(0)  # every call has joined; calls[1] waits for the end of the turn to write
    calls[1].cancel()
    calls[4].cancel()
    assert await asyncio.gather(*(calls[i] for i in (0, 2, 3, 5, 6))) == ["0", "2", "3", "5", "6"]
    for i in (1, 4):
        assert calls[i].cancelled()

    calls = [asyncio.create_task(client.hget(f"h{i}", "a")) for i in range(7)]
    await asyncio.sleep(0)
    calls[4].cancel()  # only a caller that joined: the batch is written and read as usual, its reply dropped
    assert await asyncio.gather(*(calls[i] for i in (0, 1, 2, 3, 5, 6))) == ["0", "1", "2", "3", "5", "6"]
    assert calls[4].cancelled()

    server.pause(500)  # the server holds every command for half a second
    calls = [asyncio.create_task(client.hget(f"h{i}", "a")) for i in range(7)]
    await asyncio.sleep(0.1)  # calls[0] and the batch calls[1] wrote wait for their replies
    calls[1].cancel()
    calls[4].cancel()
    assert await asyncio.gather(*(calls[i] for i in (0, 2, 3, 5, 6))) == ["0", "2", "3", "5", "6"]
    assert calls[1].cancelled() and calls[4].cancelled()
    for _ in range(3):
        assert await asyncio.gather(*(client.hget(f"h{i}", "a") for i in range(7))) == [str(i) for i in range(7)]
    assert _in_use(client) == 0
    await client.aclose()


async def test_a_shared_write_on_a_closed_connection_is_resent_and_to_a_frozen_server_times_out(
        server: ValkeyProcess) -> None:
    client = connect(Settings(redis_url=server.url, redis_timeout_s=TIMEOUT_S))
    for i in range(5):
        await client.hset(f"h{i}", mapping={"a": str(i)})
    for _ in range(3):
        assert server.kill_clients("normal") >= 1
        assert await asyncio.gather(*(client.hget(f"h{i}", "a") for i in range(5))) == [str(i) for i in range(5)]
    server.freeze()
    try:
        replies = await asyncio.gather(*(client.hget(f"h{i}", "a") for i in range(5)), return_exceptions=True)
        assert all(isinstance(r, (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError))
                   for r in replies), replies
        assert _in_use(client) == 0
        assert all(not c.is_connected for c in client.connection_pool._available_connections)
    finally:
        server.thaw()
    assert await asyncio.gather(*(client.hget(f"h{i}", "a") for i in range(5))) == [str(i) for i in range(5)]
    await client.aclose()


async def test_a_script_refused_readonly_in_a_shared_write_is_resent_alone_and_reaches_a_new_primary(
        server: ValkeyProcess, tmp_path: Path) -> None:
    """A demoted primary answers the writes of a shared write READONLY and its reads as before: the reads are
    answered, the connection dropped, and each refused script sent again alone with a single command's resend,
    which finds the server promoted again (what a failover's endpoint does) and writes. Left demoted, each refused
    script, the batch's writer's own included, gets READONLY, and the reads beside them their replies."""
    client = connect(Settings(redis_url=server.url, redis_timeout_s=5.0))
    write = await client.script_load("return redis.call('INCR', KEYS[1])")
    await client.hset("h", mapping={"a": "1"})
    other = ValkeyProcess(tmp_path / "primary", appendfsync=None)
    other.start()
    try:
        server.replicate(other)  # demoted: refuses writes, keeps serving reads (what it holds: nothing now)
        calls = [client.evalsha(write, 1, "n"), client.hget("h", "a"), client.evalsha(write, 1, "n")]
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, server.promote)  # before the single command's resend (its backoff is >= 50 ms)
        replies = await asyncio.gather(*calls, return_exceptions=True)
        assert replies[1] in ("1", None)  # read on the demoted server: before or after its sync emptied it
        assert sorted(replies[i] for i in (0, 2)) == [1, 2], replies  # each script ran once, on the new primary
        assert await client.get("n") == "2"

        server.replicate(other)
        await asyncio.sleep(0.5)  # synced: the replica holds the primary's (empty) data set
        # calls[0] goes alone; calls[1], a refused script, writes the batch
        replies = await asyncio.gather(client.hget("x", "a"), client.evalsha(write, 1, "n"), client.hget("x", "a"),
                                       client.evalsha(write, 1, "m"), return_exceptions=True)
        assert replies[0] is None and replies[2] is None
        assert all(isinstance(replies[i], redis.exceptions.ReadOnlyError) for i in (1, 3)), replies
    finally:
        other.stop()
        server.promote()
    await client.aclose()


async def test_a_refused_script_whose_resend_cannot_connect_fails_alone(server: ValkeyProcess,
                                                                        tmp_path: Path) -> None:
    """The resend of a script refused READONLY needs a new connection; when the server takes none (maxclients
    reached) that script's caller gets the connection error, and the callers beside it in the write their
    replies."""
    client = connect(Settings(redis_url=server.url, redis_timeout_s=2.0))
    write = await client.script_load("return redis.call('INCR', KEYS[1])")
    await client.hset("h", mapping={"a": "1"})
    other = ValkeyProcess(tmp_path / "primary", appendfsync=None)
    other.start()
    admin = Redis.from_url(server.url, decode_responses=True)  # a connection of its own, open throughout
    try:
        assert await admin.ping()
        assert await asyncio.gather(client.ping(), client.ping()) == [True, True]  # two connections open
        server.replicate(other)
        await asyncio.sleep(0.5)
        open_now = int(server.info("clients")["connected_clients"]) - 1  # less the INFO's own connection
        await admin.config_set("maxclients", str(open_now - 1))  # once the batch's connection drops: none more
        replies = await asyncio.gather(client.hget("h", "a"), client.hget("x", "a"), client.evalsha(write, 1, "n"),
                                       client.hget("x", "b"), return_exceptions=True)
        assert replies[1] is None and replies[3] is None, replies
        assert isinstance(replies[2], redis.exceptions.ConnectionError), replies
    finally:
        await admin.config_set("maxclients", "10000")
        await admin.aclose()
        other.stop()
        server.promote()
    await client.aclose()


async def test_closing_the_client_stops_commands_handed_over(server: ValkeyProcess) -> None:
    """The commands a cancelled batch writer handed to a task (the server paused, so they wait) are stopped when
    the client closes: their callers are cancelled, and nothing is left running."""
    client = connect(Settings(redis_url=server.url, redis_timeout_s=5.0))
    await client.hset("h", mapping={"a": "1"})
    assert await asyncio.gather(client.ping(), client.ping()) == [True, True]
    server.pause(3000)
    try:
        calls = [asyncio.create_task(client.hget("h", "a")) for _ in range(4)]
        await asyncio.sleep(0.1)
        calls[1].cancel()  # the batch's writer: the others go to a task, which waits on the paused server
        await asyncio.sleep(0.1)
        handed_over = set(client._handed_over or ())
        assert len(handed_over) == 1
        started = asyncio.get_running_loop().time()
        await client.aclose()
        assert asyncio.get_running_loop().time() - started < 1.0
        assert all(task.done() for task in handed_over)
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(results[i], asyncio.CancelledError) for i in (1, 2, 3)), results
    finally:
        server.unpause()


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


async def test_in_a_shared_write_an_argument_that_cannot_be_encoded_fails_its_caller_alone(
        server: ValkeyProcess) -> None:
    """A lone surrogate (not UTF-8) or an argument of a type Redis has no form for fails the caller that sent it,
    before anything of it is written; the callers whose commands share its write are answered, on a connection that
    stays in step. A pipeline of one caller fails whole before anything is written, as redis-py's does."""
    client = connect(Settings(redis_url=server.url, redis_timeout_s=5.0))
    sha = await client.script_load("return ARGV[1]")
    for i in range(6):
        await client.hset(f"h{i}", mapping={"a": str(i)})
    assert await asyncio.gather(client.ping(), client.ping()) == [True, True]  # two connections open
    bad_arguments: list[Any] = ["\ud800", {"a": 1}, object()]
    for bad in bad_arguments:
        for position in (1, 3, 5):  # the caller that writes the batch (1), and callers that joined it
            calls: list[Any] = [client.hget(f"h{i}", "a") for i in range(6)]
            calls[position].close()
            calls[position] = (client.hget(f"h{position}", bad) if position != 3
                               else client.evalsha(sha, 0, bad))
            replies = await asyncio.gather(*calls, return_exceptions=True)
            assert [r for i, r in enumerate(replies) if i != position] == [str(i) for i in range(6) if i != position]
            assert isinstance(replies[position], (redis.exceptions.DataError, UnicodeEncodeError)), replies[position]
            assert _connections(client) == 2 and _in_use(client) == 0  # the first alone, the rest in one write
    every_bad = await asyncio.gather(client.hget("h0", "a"), *(client.hget("h1", bad) for bad in bad_arguments),
                                     return_exceptions=True)
    assert every_bad[0] == "0" and all(isinstance(r, Exception) for r in every_bad[1:])
    assert await asyncio.gather(*(client.hget(f"h{i}", "a") for i in range(6))) == [str(i) for i in range(6)]
    with pytest.raises((redis.exceptions.DataError, UnicodeEncodeError)):
        await pipelined(client, [("HGET", "h0", "a"), ("HGET", "h1", "\ud800")])
    assert await pipelined(client, [("HGET", "h0", "a")]) == ["0"]
    assert _in_use(client) == 0
    await client.aclose()


BAD_ARGUMENTS: list[Any] = ["\udfff", "ok\ud83d", {"k": 1}, [1, 2], object(), None]


async def test_any_mix_of_callers_with_unencodable_arguments_fails_exactly_those(server: ValkeyProcess) -> None:
    """Random mixes (hypothesis, derandomized) of good and bad callers sharing writes: every good caller gets its
    own reply, every bad one an error, and the connection stays in step for the next mix."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    client = connect(Settings(redis_url=server.url, redis_timeout_s=5.0))
    sha = await client.script_load("return ARGV[1]")
    for i in range(8):
        await client.hset(f"h{i}", mapping={"a": str(i)})
    loop = asyncio.get_running_loop()
    mixes = st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["hget", "evalsha", "hmget"]),
                               st.one_of(st.none(), st.integers(0, len(BAD_ARGUMENTS) - 1))), min_size=2, max_size=12)

    async def run(mix: list[tuple[int, str, int | None]]) -> None:
        calls = []
        for i, kind, bad in mix:
            arg = "a" if bad is None else BAD_ARGUMENTS[bad]
            if kind == "hget":
                calls.append(client.hget(f"h{i}", arg))
            elif kind == "hmget":
                calls.append(client.hmget(f"h{i}", [arg]))
            else:
                calls.append(client.evalsha(sha, 0, str(i) if bad is None else arg))
        replies = await asyncio.gather(*calls, return_exceptions=True)
        for (i, kind, bad), reply in zip(mix, replies, strict=True):
            if bad is not None:
                assert isinstance(reply, (redis.exceptions.DataError, UnicodeEncodeError)), reply
            else:
                assert reply == ([str(i)] if kind == "hmget" else str(i)), (mix, reply)
        assert _in_use(client) == 0

    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(mixes)
    def check(mix: list[tuple[int, str, int | None]]) -> None:
        # hypothesis drives a sync function: each example runs on this test's loop, in a helper thread's wait
        asyncio.run_coroutine_threadsafe(run(mix), loop).result(timeout=30)

    await asyncio.to_thread(check)
    await client.aclose()
