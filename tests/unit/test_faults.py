"""The shared Redis fault model: each classification proven against a real Valkey producing the error where one can
be produced on one machine (READONLY, OOM, BUSY, UNBLOCKED, a refused connection, a timeout), and through
redis-py's own parser for the rest (LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, MOVED, ASK)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis import exceptions as redis_errors
from redis._parsers.base import BaseParser
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from emulator.valkey import ValkeyProcess, free_port
from inferq.redis.faults import Backoff, Fault, FaultRun, classify, drop_stale_connections, error_code, is_recoverable
from tests.support.waiting import eventually_async


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    """A server of the test's own: these tests make it full, busy or a replica."""
    with ValkeyProcess(tmp_path / "a", appendfsync=None) as valkey:
        yield valkey


@pytest.fixture
async def client(server: ValkeyProcess) -> AsyncIterator[Redis]:
    redis = Redis(host=server.host, port=server.port, decode_responses=True, socket_timeout=5)
    yield redis
    await redis.aclose()


async def raised(call: object) -> BaseException:
    try:
        await call  # type: ignore[misc]
    except BaseException as exc:  # the point is to look at it
        return exc
    raise AssertionError("the call succeeded")


async def test_readonly_from_a_demoted_primary_is_transient(
    server: ValkeyProcess, client: Redis, tmp_path: Path
) -> None:
    with ValkeyProcess(tmp_path / "b", appendfsync=None) as primary:
        server.replicate(primary)
        for call in (client.set("k", "v"), client.eval("return redis.call('set', KEYS[1], 'v')", 1, "k")):
            exc = await raised(call)
            assert isinstance(exc, redis_errors.ReadOnlyError)
            assert classify(exc) is Fault.TRANSIENT
        assert await client.eval("return redis.call('get', KEYS[1])", 1, "k") is None  # reads still work


async def test_oom_under_noeviction_is_capacity_for_commands_scripts_and_pipelines(
    server: ValkeyProcess, client: Redis
) -> None:
    server.set_maxmemory("1mb")
    pipe = client.pipeline(transaction=False)
    pipe.xadd("s", {"job": "j"})
    for call in (client.set("k", "v"), client.eval("return redis.call('xadd', KEYS[1], '*', 'a', 'b')", 1, "s"),
                 pipe.execute()):
        exc = await raised(call)
        assert isinstance(exc, redis_errors.OutOfMemoryError)
        assert classify(exc) is Fault.CAPACITY and is_recoverable(exc)
    server.set_maxmemory("0")
    assert await client.set("k", "v")


async def test_busy_from_a_long_script_is_transient(server: ValkeyProcess, client: Redis) -> None:
    server.config_set("busy-reply-threshold", "50")
    spinner = Redis(host=server.host, port=server.port, socket_timeout=10)
    spin = asyncio.create_task(spinner.eval("while true do end", 0))
    try:
        await eventually_async(lambda: server.call("PING").startswith(b"-BUSY"),
                               what="the script running past the threshold")
        exc = await raised(client.get("k"))
        assert type(exc) is redis_errors.ResponseError and error_code(exc) == "BUSY"
        assert classify(exc) is Fault.TRANSIENT
        pipe = client.pipeline(transaction=False)
        pipe.get("k")
        wrapped = await raised(pipe.execute())  # "Command # 1 (GET k) of pipeline caused error: BUSY ..."
        assert error_code(wrapped) == "BUSY" and classify(wrapped) is Fault.TRANSIENT
    finally:
        server.call("SCRIPT", "KILL")
        await raised(spin)
        await spinner.aclose()


async def test_a_blocked_read_of_a_primary_turned_replica_is_unblocked_transiently(
    server: ValkeyProcess, client: Redis, tmp_path: Path
) -> None:
    await client.xgroup_create("s", "g", id="0", mkstream=True)
    read = asyncio.create_task(client.xreadgroup("g", "c", {"s": ">"}, count=1, block=3000))
    await eventually_async(lambda: int(server.info("clients")["blocked_clients"]) == 1, what="the read blocked")
    with ValkeyProcess(tmp_path / "b", appendfsync=None) as primary:
        server.replicate(primary)
        exc = await raised(read)
    assert error_code(exc) == "UNBLOCKED", exc
    assert classify(exc) is Fault.TRANSIENT


async def test_a_refused_connection_and_a_timeout_are_transient(server: ValkeyProcess) -> None:
    no_retry = Retry(NoBackoff(), 0)  # redis-py's default retries three times with backoff: see the first error
    gone = Redis(port=free_port(), socket_connect_timeout=1, retry=no_retry)
    refused = await raised(gone.ping())
    assert isinstance(refused, redis_errors.ConnectionError) and classify(refused) is Fault.TRANSIENT
    await gone.aclose()
    slow = Redis(host=server.host, port=server.port, socket_timeout=0.2, retry=no_retry)
    server.freeze()
    try:
        timed_out = await raised(slow.ping())
    finally:
        server.thaw()
    assert classify(timed_out) is Fault.TRANSIENT
    assert classify(await raised(asyncio.wait_for(asyncio.sleep(1), 0.01))) is Fault.TRANSIENT  # asyncio's own
    assert classify(ConnectionResetError()) is Fault.TRANSIENT
    await slow.aclose()


@pytest.mark.parametrize(
    "reply, cls",
    [
        ("LOADING Valkey is loading the dataset in memory", redis_errors.BusyLoadingError),
        ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
         redis_errors.MasterDownError),
        ("CLUSTERDOWN The cluster is down", redis_errors.ClusterDownError),
        ("TRYAGAIN Multiple keys request during rehashing of slot", redis_errors.TryAgainError),
        ("MOVED 3999 127.0.0.1:6381", redis_errors.MovedError),
        ("ASK 3999 127.0.0.1:6381", redis_errors.AskError),
        ("READONLY You can't write against a read only replica.", redis_errors.ReadOnlyError),
    ],
)
def test_failover_and_cluster_replies_are_transient_as_redis_py_parses_them(reply: str, cls: type) -> None:
    exc = BaseParser.parse_error(reply)
    assert type(exc) is cls
    assert classify(exc) is Fault.TRANSIENT


async def test_other_server_errors_are_bugs(client: Redis) -> None:
    await client.set("k", "v")
    wrong_type = await raised(client.xadd("k", {"a": "b"}))
    assert classify(wrong_type) is Fault.BUG and not is_recoverable(wrong_type)
    assert classify(await raised(client.eval("return redis.call('nope')", 0))) is Fault.BUG
    await client.xgroup_create("s", "g", mkstream=True)
    busygroup = await raised(client.xgroup_create("s", "g"))
    assert error_code(busygroup) == "BUSYGROUP" and classify(busygroup) is Fault.BUG  # BUSY is a prefix only
    assert classify(ValueError("a bug")) is Fault.BUG
    assert classify(KeyError("a bug")) is Fault.BUG


async def test_after_readonly_the_idle_connections_are_dropped_and_new_ones_reach_the_primary(
    server: ValkeyProcess, tmp_path: Path
) -> None:
    client = Redis(host=server.host, port=server.port, decode_responses=True)
    await asyncio.gather(*(client.ping() for _ in range(3)))  # three pooled connections
    with ValkeyProcess(tmp_path / "b", appendfsync=None) as primary:
        server.replicate(primary)
        exc = await raised(client.set("k", "v"))
        await drop_stale_connections(client, exc)
        assert client.connection_pool._available_connections  # kept, but closed: they reconnect on next use
        assert not any(c.is_connected for c in client.connection_pool._available_connections)
        server.promote()
        assert await client.set("k", "v")
    await client.aclose()


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    backoff = Backoff(base_s=0.1, cap_s=1.0, rng=random.Random(7))
    delays = [backoff.next() for _ in range(200)]
    assert all(0.0 <= d <= 1.0 for d in delays)
    assert max(delays[:1]) <= 0.2 and max(delays[1:2]) <= 0.4  # base * 2**failures before the cap
    assert min(delays[10:]) < 0.3 < max(delays[10:])  # full jitter: spread over [0, cap]
    assert backoff.failures == 200
    backoff.reset()
    assert backoff.failures == 0 and backoff.next() <= 0.2


def test_backoffs_share_the_processs_jitter_source_instead_of_seeding_one_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seeded: list[object] = []
    monkeypatch.setattr(random.Random, "seed", lambda self, *a, **kw: seeded.append(a))
    first, second = Backoff(base_s=0.1, cap_s=1.0), Backoff(base_s=0.1, cap_s=1.0)
    assert not seeded  # no os.urandom per Backoff: a worker makes one for every settle
    waits = {first.next() for _ in range(20)} | {second.next() for _ in range(20)}
    assert len(waits) > 30  # still jittered: draws from one source differ


def test_a_forked_child_draws_other_waits_than_its_parent() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its draws, then out without running the parent's cleanup
        os.write(write, json.dumps([Backoff(base_s=1.0, cap_s=1.0).next() for _ in range(4)]).encode())
        os._exit(0)
    os.close(write)
    mine = [Backoff(base_s=1.0, cap_s=1.0).next() for _ in range(4)]
    theirs = json.loads(os.read(read, 4096))
    os.close(read)
    os.waitpid(pid, 0)
    assert mine != theirs


async def test_a_fault_run_counts_each_fault_logs_the_first_and_lets_a_bug_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[Fault] = []
    run = FaultRun("renewal failed", logging.getLogger("test.faults"), on_fault=seen.append, base_s=0.01, cap_s=0.02)
    with caplog.at_level(logging.INFO, logger="test.faults"):
        for exc in (redis_errors.ReadOnlyError("READONLY"), redis_errors.OutOfMemoryError("OOM"), TimeoutError()):
            assert 0.0 <= await run.absorb(exc) <= 0.02
        run.succeeded()
        await run.absorb(redis_errors.BusyLoadingError("LOADING"))
    assert seen == [Fault.TRANSIENT, Fault.CAPACITY, Fault.TRANSIENT, Fault.TRANSIENT]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("retrying with backoff" in w for w in warnings)  # the first of each run
    assert any("answers again after 3 failures" in r.getMessage() for r in caplog.records)
    bug = redis_errors.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    with pytest.raises(redis_errors.ResponseError, match="WRONGTYPE"):
        await run.absorb(bug)
    assert len(seen) == 4  # a bug is not counted as a Redis fault


def test_a_local_os_error_is_not_a_redis_fault() -> None:
    assert classify(BrokenPipeError()) is Fault.TRANSIENT
    assert classify(FileNotFoundError("model weights")) is Fault.BUG
    assert classify(PermissionError()) is Fault.BUG
