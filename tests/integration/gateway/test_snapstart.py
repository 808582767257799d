"""The gateway's SnapStart hooks (functions/gateway/snapstart.py), registered at import as the Lambda runtime's
``snapshot_restore_py`` takes them and run as it runs them: before the snapshot in reverse order of registration,
after a restore in order. Against a real Valkey: the Redis client open before the snapshot is closed, and the next
request connects anew; two sandboxes restored from one snapshot draw different ids and random numbers."""

from __future__ import annotations

import asyncio
import copy
import importlib
import json
import random
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import redis

from functions.gateway import edge
from inferq.config.settings import Settings
from inferq.redis import faults
from tests.conftest import load_event
from tests.support.waiting import eventually

MODULE = "functions.gateway.app"
EVENT_KEY = "dev-key-tenant-a"


class Runtime:
    """The registry ``snapshot_restore_py`` keeps in the Lambda runtime, and the order the runtime runs it in."""

    def __init__(self) -> None:
        self.before: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.after: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def module(self) -> ModuleType:
        module = ModuleType("snapshot_restore_py")
        module.register_before_snapshot = lambda func, *args: self.before.append((func, args))  # type: ignore[attr-defined]
        module.register_after_restore = lambda func, *args: self.after.append((func, args))  # type: ignore[attr-defined]
        return module

    def snapshot(self) -> None:
        for func, args in reversed(self.before):
            func(*args)

    def restore(self) -> None:
        for func, args in self.after:
            func(*args)


class Context:
    aws_request_id = "c6af9ac6-7b61-11e6-9a41-93e812345678"
    function_name = "inferq-GatewayFunction"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:eu-west-1:123456789012:function:inferq-GatewayFunction"


@pytest.fixture
def runtime() -> Runtime:
    return Runtime()


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch, settings: Settings, runtime: Runtime) -> Iterator[ModuleType]:
    """``functions.gateway.app`` imported as the Lambda runtime imports it, with its ``snapshot_restore_py``."""
    for name in [n for n in __import__("os").environ if n.startswith("INFERQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("INFERQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("INFERQ_QUEUE", settings.queue)
    monkeypatch.setenv("INFERQ_API_KEYS", f"tenant-a:{EVENT_KEY}")
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", runtime.module())
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    sys.modules.pop(MODULE, None)
    try:
        yield importlib.import_module(MODULE)
    finally:
        sys.modules.pop(MODULE, None)
        loop.close()
        asyncio.set_event_loop(None)


def submit(module: ModuleType) -> str:
    reply = module.handler(load_event("apiGatewayProxyV2SubmitJob.json"), Context())
    assert reply["statusCode"] == 202, reply
    return str(json.loads(reply["body"])["id"])


def _stats(server: redis.Redis, section: str, field: str) -> int:
    return int(server.info(section)[field])


def test_the_import_registers_one_hook_on_each_side(gateway: ModuleType, runtime: Runtime) -> None:
    assert [f.__name__ for f, _ in runtime.before] == ["before_snapshot"]
    assert [f.__name__ for f, _ in runtime.after] == ["after_restore"]
    assert runtime.before[0][1] == (gateway.app,) and runtime.after[0][1] == (gateway.app,)


def test_without_the_lambda_runtime_nothing_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    from functions.gateway import snapstart

    monkeypatch.setitem(sys.modules, "snapshot_restore_py", None)  # import fails, as outside Lambda
    assert snapstart.register(object()) is False


def test_the_hooks_close_the_open_connection_and_the_next_request_reconnects(
    gateway: ModuleType, runtime: Runtime, sync_redis: redis.Redis
) -> None:
    provider = gateway.app.state.gateway.queues
    first = submit(gateway)
    assert provider.created == 1
    connected = _stats(sync_redis, "clients", "connected_clients")
    received = _stats(sync_redis, "stats", "total_connections_received")

    routes_before = len(gateway.app.routes)
    runtime.snapshot()
    assert len(gateway.app.routes) > routes_before  # the snapshot holds every route, deferred ones included
    eventually(lambda: _stats(sync_redis, "clients", "connected_clients") < connected,
               what="the gateway's Redis connection closed by the before-snapshot hook")
    runtime.restore()

    second = submit(gateway)
    assert provider.created == 2  # a new client, not the one from before the snapshot
    assert _stats(sync_redis, "stats", "total_connections_received") > received  # a new connection
    assert second != first
    reply = gateway.handler(_get_event(first), Context())
    assert reply["statusCode"] == 200 and json.loads(reply["body"])["id"] == first  # the job is still there


def _get_event(job_id: str) -> dict[str, Any]:
    event = copy.deepcopy(load_event("apiGatewayProxyV2GetJob.json"))
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/v1/jobs/{job_id}"
    return event


def _draws(gateway: ModuleType) -> dict[str, Any]:
    """What a sandbox makes first: a job id, a request id of its own, a draw of ``random`` and of the jitter."""
    return {"job": submit(gateway), "request_id": edge._request_ids.next(), "random": random.random(),
            "jitter": faults._JITTER.random()}


def test_two_sandboxes_restored_from_one_snapshot_draw_different_ids_and_numbers(
    gateway: ModuleType, runtime: Runtime
) -> None:
    submit(gateway)  # the snapshot may hold a used process, not only a fresh one
    runtime.snapshot()
    snapshot = (random.getstate(), faults._JITTER.getstate(), dict(edge._request_ids.__dict__))

    def restore_copy(run_hooks: bool) -> dict[str, Any]:
        """A new sandbox from the snapshot: the same memory (the three states), then the runtime's hooks."""
        random.setstate(snapshot[0])
        faults._JITTER.setstate(snapshot[1])
        edge._request_ids.__dict__.update(copy.deepcopy(snapshot[2]))
        if run_hooks:
            runtime.restore()
        return _draws(gateway)

    unhooked = [restore_copy(run_hooks=False) for _ in range(2)]
    # The simulation is faithful: without the hook, copies draw alike (job ids come from secrets and differ anyway).
    assert unhooked[0]["random"] == unhooked[1]["random"] and unhooked[0]["jitter"] == unhooked[1]["jitter"]
    assert unhooked[0]["request_id"] == unhooked[1]["request_id"]
    assert unhooked[0]["job"] != unhooked[1]["job"]

    a, b = restore_copy(run_hooks=True), restore_copy(run_hooks=True)
    assert a["job"] != b["job"]
    assert a["request_id"] != b["request_id"]
    assert a["random"] != b["random"] and a["jitter"] != b["jitter"]
