"""The queue fixture of the protocol tests: standalone and cluster mode, each also with every script resent."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from emulator.valkey import ValkeyProcess
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue
from tests.integration.protocol.resend import Resending


@pytest.fixture(params=["standalone", "cluster", "standalone-resent", "cluster-resent"])
async def q(request: pytest.FixtureRequest, queue_name: str) -> AsyncIterator[Queue]:
    """Each test runs standalone and in cluster mode, and again with every script call resent (run twice with the
    same arguments, the second run checked to answer the same and change nothing): G9 under every transition."""
    mode = request.param
    server: ValkeyProcess = request.getfixturevalue("valkey_cluster" if mode.startswith("cluster") else "valkey")
    settings = Settings(redis_url=server.url, queue=queue_name, max_attempts=3, max_deliveries=2, claim_idle_ms=0)
    queue = Queue.connect(settings)
    if mode.endswith("resent"):
        queue.scripts = Resending(queue)
    await queue.ensure_groups()
    yield queue
    await queue.close()


