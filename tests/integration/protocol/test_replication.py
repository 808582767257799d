"""INFERQ_REDIS_WAIT_REPLICAS against a real primary and replica (two Valkey processes, REPLICAOF): an accepted
job and a terminal write are on the replica before they are reported; a frozen replica (SIGSTOP) turns the
report into ReplicationLag, a transient error (503 at the gateway, a retry at the worker), and the resend that
follows waits for the first write too. In cluster mode the WAIT goes to the slot's primary on the write's
connection."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from redis import exceptions as redis_errors

from emulator.valkey import ValkeyProcess, free_port
from inferq.config.settings import Settings
from inferq.queue.jobs import JobRequest, JobStatus, new_job_id
from inferq.queue.protocol import Outcome, Queue, ReplicationLag, now_ms

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
RESULT = {"status_code": 200, "body": {}}


def req(**kw: object) -> JobRequest:
    return JobRequest(body=dict(CHAT), **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def primary_and_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ValkeyProcess, ValkeyProcess]]:
    root: Path = tmp_path_factory.mktemp("replication")
    primary = ValkeyProcess(root / "primary", appendfsync=None).start()
    replica = ValkeyProcess(root / "replica", appendfsync=None).start()
    try:
        client = redis.Redis(host=replica.host, port=replica.port, decode_responses=True)
        client.replicaof(primary.host, primary.port)
        deadline = time.monotonic() + 15
        while client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica did not link up"
            time.sleep(0.05)
        client.close()
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


@pytest.fixture
async def q(primary_and_replica: tuple[ValkeyProcess, ValkeyProcess], queue_name: str) -> AsyncIterator[Queue]:
    primary, _ = primary_and_replica
    queue = Queue.connect(Settings(redis_url=primary.url, queue=queue_name, redis_wait_replicas=1,
                                   redis_timeout_s=1.0, claim_idle_ms=0))
    await queue.ensure_groups()
    yield queue
    await queue.close()


@pytest.fixture
def replica(primary_and_replica: tuple[ValkeyProcess, ValkeyProcess]) -> Iterator[ValkeyProcess]:
    _, server = primary_and_replica
    yield server
    server.thaw()  # never leave it frozen for the next test


async def on_replica(replica: ValkeyProcess, key: str) -> dict[str, str]:
    client = aioredis.Redis(host=replica.host, port=replica.port, decode_responses=True)
    try:
        return dict(await client.hgetall(key))
    finally:
        await client.aclose()


async def test_an_accepted_job_and_its_result_are_on_the_replica_before_they_are_reported(
    q: Queue, replica: ValkeyProcess
) -> None:
    job, replayed = await q.enqueue("t", req())
    assert not replayed and (await on_replica(replica, q.keys.job(job.id)))["status"] == "queued"
    (d,), _ = await q.read("w1", 1)
    assert await q.finish(d, JobStatus.SUCCEEDED, result=RESULT) is Outcome.WRITTEN
    assert (await on_replica(replica, q.keys.job(job.id)))["status"] == "succeeded"
    cancelled, _ = await q.enqueue("t", req())
    await q.cancel("t", cancelled.id)
    assert (await on_replica(replica, q.keys.job(cancelled.id)))["status"] == "cancelled"


async def test_a_frozen_replica_makes_enqueue_raise_replication_lag_and_the_retry_replays(
    q: Queue, replica: ValkeyProcess
) -> None:
    replica.freeze()
    with pytest.raises(ReplicationLag) as info:
        await q.enqueue("t", req(idempotency_key="k"))
    assert isinstance(info.value, redis_errors.ConnectionError)  # transient: the gateway answers 503
    assert info.value.acknowledged == 0 and info.value.wanted == 1
    replica.thaw()
    _, replayed = await q.enqueue("t", req(idempotency_key="k"))  # the client's retry, as a 503 asks
    assert replayed and (await q.stats())["enqueued"] == 1


async def test_a_terminal_write_that_lagged_is_retried_by_the_worker_as_a_resend(
    q: Queue, replica: ValkeyProcess
) -> None:
    q.settings = q.settings.replace(max_attempts=1)
    job, _ = await q.enqueue("t", req())
    (d,), _ = await q.read("w1", 1)
    replica.freeze()
    with pytest.raises(ReplicationLag):
        await q.retry(d, delay_ms=0, error={"type": "e", "message": "m"})  # dead-letters: a terminal write
    replica.thaw()
    assert await q.retry(d, delay_ms=0, error={"type": "e", "message": "m"}) is Outcome.DEAD_LETTERED
    stats = await q.stats()
    assert stats["dead_lettered"] == 1 and stats["duplicate_results"] == 0 and stats["unfinished"] == 0
    assert (await on_replica(replica, q.keys.job(job.id)))["status"] == "failed"


async def test_a_resend_on_a_new_connection_waits_for_the_first_copys_write(
    q: Queue, replica: ValkeyProcess, primary_and_replica: tuple[ValkeyProcess, ValkeyProcess]
) -> None:
    """The first copy ran on a connection that died before WAIT; the resend changes nothing, so on its own
    connection WAIT would have nothing to wait for -- unless the replay writes (includes/replay.lua)."""
    call = q._enqueue_call([("t", req(), new_job_id(), now_ms())])
    replica.freeze()
    await q.scripts(*call)  # the first copy, without WAIT: on the primary only
    fresh = Queue.connect(q.settings)  # a new connection that has written nothing yet
    try:
        with pytest.raises(ReplicationLag):
            await fresh.scripts.replicated([call], 1, 300)
        replica.thaw()
        [[again]] = await fresh.scripts.replicated([call], 1, 2000)
        assert int(again[0]) == 0 and (await q.stats())["enqueued"] == 1
    finally:
        await fresh.close()


async def test_in_cluster_mode_the_wait_runs_on_the_slots_primary(
    valkey_cluster: ValkeyProcess, queue_name: str
) -> None:
    """The one-node cluster has no replica: WAIT 1 answers 0 after its timeout, so a write waited for raises
    ReplicationLag; with no replicas asked for, nothing waits."""
    settings = Settings(redis_url=valkey_cluster.url, queue=queue_name, redis_wait_replicas=1, redis_timeout_s=0.4)
    q = Queue.connect(settings)
    try:
        await q.ensure_groups()
        with pytest.raises(ReplicationLag) as info:
            await q.enqueue("t", req())
        assert (info.value.acknowledged, info.value.wanted) == (0, 1)
        assert (await q.stats())["enqueued"] == 1
        q.settings = q.settings.replace(redis_wait_replicas=0)
        job, _ = await q.enqueue("t", req())
        assert job.status is JobStatus.QUEUED
    finally:
        await q.close()


@pytest.fixture(scope="module")
def cluster_with_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ValkeyProcess, ValkeyProcess]]:
    """A cluster primary owning every slot and a second cluster node replicating it (CLUSTER MEET, REPLICATE)."""
    root: Path = tmp_path_factory.mktemp("cluster-replication")
    primary = ValkeyProcess(root / "primary", cluster=True, appendfsync=None).start()
    bus_port = free_port()
    replica = ValkeyProcess(root / "replica", appendfsync=None, extra_args=(
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", str(bus_port))).start()
    try:
        p = redis.Redis(host=primary.host, port=primary.port, decode_responses=True)
        r = redis.Redis(host=replica.host, port=replica.port, decode_responses=True)
        primary_id = p.execute_command("CLUSTER", "MYID")
        myself = next(line for line in p.execute_command("CLUSTER", "NODES").splitlines() if "myself" in line)
        primary_bus = int(myself.split()[1].split("@")[1].split(",")[0])
        r.execute_command("CLUSTER", "MEET", primary.host, primary.port, primary_bus)
        deadline = time.monotonic() + 20
        while primary_id not in r.execute_command("CLUSTER", "NODES"):
            assert time.monotonic() < deadline, "the nodes did not meet"
            time.sleep(0.05)
        while True:
            try:
                r.execute_command("CLUSTER", "REPLICATE", primary_id)
                break
            except redis_errors.ResponseError:  # the primary is not known as a primary yet
                assert time.monotonic() < deadline, "the replica could not attach"
                time.sleep(0.1)
        while r.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica did not link up"
            time.sleep(0.05)
        p.close()
        r.close()
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


async def test_in_cluster_mode_a_replica_acknowledges_and_a_frozen_one_raises_replication_lag(
    cluster_with_replica: tuple[ValkeyProcess, ValkeyProcess], queue_name: str
) -> None:
    primary, replica = cluster_with_replica
    settings = Settings(redis_url=primary.url, queue=queue_name, redis_wait_replicas=1, redis_timeout_s=1.0)
    q = Queue.connect(settings)
    try:
        await q.ensure_groups()
        job, _ = await q.enqueue("t", req())
        direct = aioredis.Redis(host=replica.host, port=replica.port, decode_responses=True)
        try:
            await direct.execute_command("READONLY")
            assert (await direct.hgetall(q.keys.job(job.id)))["status"] == "queued"
        finally:
            await direct.aclose()
        replica.freeze()
        try:
            with pytest.raises(ReplicationLag):
                await q.cancel("t", job.id)
        finally:
            replica.thaw()
        stored = await q.get(job.id)  # written on the primary; only its report was refused
        assert stored and stored.status is JobStatus.CANCELLED
        await q.enqueue("t", req())  # the thawed replica acknowledges again
    finally:
        await q.close()
