"""Two models' queues on a real 3-node cluster-mode Valkey (one slot range per node), through inferq's cluster
client: each queue keeps its own hash tag, so the two models land on different nodes, and a job submitted through
the gateway and run by a worker works on each."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import MovedError

from emulator.valkey import ValkeyProcess, free_port
from functions.gateway.api import create_app
from gpu_worker.backends.mock import MockBackend
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.keys import Keys
from inferq.queue.protocol import Queue

RANGES = ((0, 5460), (5461, 10922), (10923, 16383))
KEY = "key-tenant-a-0001"


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ValkeyProcess]]:
    """Three primaries, each owning one third of the slots, joined with CLUSTER MEET (no redis-cli)."""
    nodes: list[ValkeyProcess] = []
    buses: list[int] = []
    try:
        for i in range(3):
            bus = free_port()
            node = ValkeyProcess(
                tmp_path_factory.mktemp(f"node{i}"), appendfsync=None,
                extra_args=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                            "--cluster-port", str(bus)),
            )
            nodes.append(node.start())
            buses.append(bus)
        for node, (low, high) in zip(nodes, RANGES, strict=True):
            assert node.call("CLUSTER", "ADDSLOTSRANGE", str(low), str(high)).startswith(b"+OK")
        for other, bus in zip(nodes[1:], buses[1:], strict=True):
            assert nodes[0].call("CLUSTER", "MEET", other.host, str(other.port), str(bus)).startswith(b"+OK")
        deadline = time.monotonic() + 30
        while not all(b"cluster_state:ok" in n.call("CLUSTER", "INFO") for n in nodes):
            assert time.monotonic() < deadline, "the cluster did not reach cluster_state:ok"
            time.sleep(0.1)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def node_of(slot: int) -> int:
    return next(i for i, (low, high) in enumerate(RANGES) if low <= slot <= high)


def two_queues_on_different_nodes() -> tuple[str, str]:
    """Queue names (so hash tags) whose slots fall in different nodes' ranges."""
    first = "chat"
    second = next(f"embed{i}" for i in range(100)
                  if node_of(key_slot(f"{{embed{i}}}".encode())) != node_of(key_slot(b"{chat}")))
    return first, second


async def test_two_models_queues_live_on_different_nodes_and_each_runs_a_job(
    three_nodes: list[ValkeyProcess], tmp_path: Path
) -> None:
    chat_q, embed_q = two_queues_on_different_nodes()
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"default": "chat", "models": [
        {"name": "chat", "queue": chat_q}, {"name": "embed", "queue": embed_q, "aliases": ["e5"]}]}))
    url = f"redis://{three_nodes[0].host}:{three_nodes[0].port}/0?cluster=true"
    base = Settings(redis_url=url, models=str(path), retry_base_ms=0, worker_id="w-cluster")
    app = create_app(base, keys={KEY: "tenant-a"})
    ids: dict[str, str] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        for q, model in ((chat_q, "chat"), (embed_q, "e5")):
            queue: Queue = app.state.gateway.queues.get(q)
            await queue.ensure_groups()
            body = {"body": {"model": model, "messages": [{"role": "user", "content": f"hello {model}"}]}}
            submitted = await client.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {KEY}"})
            assert submitted.status_code == 202, submitted.text
            ids[q] = submitted.json()["id"]
            assert ids[q].endswith(f"_{q}")
            # a worker of that model, on inferq's cluster client, runs it
            settings = base.replace(queue=q)
            worker_queue = Queue.connect(settings)
            try:
                backend = MockBackend(worker_queue.redis, worker_queue.keys)
                await Worker(settings, worker_queue, backend, burst=True).run()
            finally:
                await worker_queue.close()
            done = await client.get(f"/v1/jobs/{ids[q]}?wait=5", headers={"Authorization": f"Bearer {KEY}"})
            assert done.json()["status"] == "succeeded", done.text
            assert f"hello {model}" in json.dumps(done.json()["result"])
    await app.state.gateway.aclose()

    owners = []
    for q in (chat_q, embed_q):
        job_key = Keys(q).job(ids[q])
        slot = int(three_nodes[0].call("CLUSTER", "KEYSLOT", job_key).split(b"\r\n")[0][1:])
        assert slot == key_slot(job_key.encode())
        holders = []
        for i, node in enumerate(three_nodes):  # ask each node directly: only the slot's owner has the key
            with redis.Redis(host=node.host, port=node.port) as plain:
                try:
                    if plain.exists(job_key):
                        holders.append(i)
                except MovedError:  # not this node's slot
                    pass
        assert holders == [node_of(slot)]
        owners.append(holders[0])
    assert owners[0] != owners[1]
