"""The scaler under the faults a managed Redis produces: a full server (OOM) and a demoted primary (READONLY) are
logged and counted, and the tick carries on; a Redis error that is a bug fails the invocation, once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Metrics
from redis.exceptions import ResponseError

from emulator.valkey import ValkeyProcess, wait_in_sync
from functions.scaler.scaler import EcsService, Scaler
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue
from inferq.scaling.policy import ScalePolicy
from tests.integration.worker.support import chat, submit
from tests.support.ecs import CLUSTER, SERVICE


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    with ValkeyProcess(tmp_path / "valkey", appendfsync=None) as valkey:
        yield valkey


def scaler(queue: Queue, ecs: Any) -> Scaler:
    return Scaler(queue, EcsService(ecs, CLUSTER, SERVICE), ScalePolicy.from_settings(queue.settings),
                  metrics=Metrics(namespace="inferq-test", service=""), logger=Logger(service="scaler-test"))


def desired(ecs: Any) -> int:
    return int(ecs.describe_services(cluster=CLUSTER, services=[SERVICE])["services"][0]["desiredCount"])


async def test_a_full_redis_still_scales_and_only_the_record_is_missed(
    server: ValkeyProcess, ecs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = Queue.connect(Settings(redis_url=server.url, queue="q" + uuid.uuid4().hex[:8]))
    await queue.ensure_groups()
    for i in range(3):
        await submit(queue, chat(f"q{i}"))
    server.set_maxmemory("1mb")
    try:
        tick = await scaler(queue, ecs).tick()
    finally:
        server.set_maxmemory("0")
    assert tick.observation is not None and tick.observation.lag == 3  # reads still answer
    assert tick.applied and desired(ecs) == 1
    assert tick.errors == ["record"]
    out = capsys.readouterr().out
    assert '"fault":"capacity"' in out.replace(" ", "") and "Traceback" not in out
    await queue.close()


async def test_a_demoted_primary_is_a_logged_observe_error_and_the_count_is_kept(
    server: ValkeyProcess, ecs: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = Queue.connect(Settings(redis_url=server.url, queue="q" + uuid.uuid4().hex[:8]))
    await queue.ensure_groups()
    await submit(queue, chat("one"))
    with ValkeyProcess(tmp_path / "new-primary", appendfsync=None) as new_primary:
        new_primary.replicate(server)
        wait_in_sync(new_primary, server)
        new_primary.promote()
        server.replicate(new_primary)  # the old primary answers READONLY to writes, reads still work
        wait_in_sync(server, new_primary)
        ticks = [await scaler(queue, ecs).tick() for _ in range(2)]
        server.promote()
    for tick in ticks:
        assert "record" in tick.errors or "redis" in tick.errors
    out = capsys.readouterr().out
    assert "Traceback" not in out
    await queue.close()


async def test_a_redis_error_that_is_a_bug_fails_the_invocation(server: ValkeyProcess, ecs: Any) -> None:
    queue = Queue.connect(Settings(redis_url=server.url, queue="q" + uuid.uuid4().hex[:8]))
    await queue.ensure_groups()
    await queue.redis.set(queue.keys.stats, "not a hash")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await scaler(queue, ecs).tick()
    assert desired(ecs) == 0
    await queue.close()
