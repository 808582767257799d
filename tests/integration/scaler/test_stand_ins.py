"""On-demand stand-ins while Spot is short (functions/scaler/standins.py), against moto's ECS and a real queue.

The primary service ``gpu-workers`` and its fallback ``gpu-workers-on-demand`` live in moto. moto starts no task
for a service, and a task of its own is never ``PROVISIONING`` (waiting for an instance): the primary's
``ListTasks`` and ``DescribeTasks`` are answered through botocore's ``before-call`` hook on the client instead, with
the tasks ECS would list while Spot is short. Everything else goes to moto.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Metrics

from functions.scaler.scaler import EcsService, Scaler, ServiceCounts
from functions.scaler.standins import StandIns
from inferq.queue.jobs import JobRequest
from inferq.queue.protocol import Queue
from inferq.scaling.capacity import Fallback, fallback_service
from inferq.scaling.policy import ScalePolicy
from tests.support.ecs import CLUSTER, SERVICE, create_service, desired_count

FALLBACK = fallback_service(SERVICE)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


class _Answer:
    status_code = 200
    headers: dict[str, str] = {}


class WaitingTasks:
    """The primary's tasks as ECS lists them: ``(created_at, last_status)`` each; counts the calls made."""

    def __init__(self, client: Any) -> None:
        self.tasks: list[tuple[float, str]] = []
        self.calls: list[str] = []
        client.meta.events.register("before-call.ecs.ListTasks", self._list)
        client.meta.events.register("before-call.ecs.DescribeTasks", self._describe)

    def _list(self, params: dict[str, Any], **_: Any) -> tuple[_Answer, dict[str, Any]]:
        self.calls.append("ListTasks")
        asked = json.loads(params["body"])  # the request as ECS's JSON protocol sends it
        assert (asked["cluster"], asked["serviceName"], asked["desiredStatus"]) == (CLUSTER, SERVICE, "RUNNING")
        return _Answer(), {"taskArns": [f"arn:aws:ecs:eu-west-1:123456789012:task/{CLUSTER}/t{i}"
                                        for i in range(len(self.tasks))]}

    def _describe(self, params: dict[str, Any], **_: Any) -> tuple[_Answer, dict[str, Any]]:
        self.calls.append("DescribeTasks")
        tasks = [{"taskArn": arn, "lastStatus": status, "createdAt": datetime.fromtimestamp(created, UTC)}
                 for arn, (created, status) in zip(json.loads(params["body"])["tasks"], self.tasks, strict=True)]
        return _Answer(), {"tasks": tasks, "failures": []}


@pytest.fixture
def services(ecs: Any) -> tuple[EcsService, EcsService]:
    create_service(ecs, FALLBACK)
    return EcsService(ecs, CLUSTER, SERVICE), EcsService(ecs, CLUSTER, FALLBACK)


def test_a_task_that_waited_past_the_delay_gets_a_stand_in_and_so_do_the_tasks_asked_for_since(
    ecs: Any, services: tuple[EcsService, EcsService]
) -> None:
    primary, fallback = services
    waiting = WaitingTasks(ecs)
    now = time.time()
    waiting.tasks = [(now - 600, "RUNNING"), (now - 200, "PROVISIONING"), (now - 30, "PROVISIONING")]
    stand_ins = StandIns(primary, fallback, Fallback(after_s=180.0))
    step = stand_ins.step(4, ServiceCounts(desired=3, running=1, pending=2), short_at=None, now=now)
    # one waited 200 s: Spot is short, so every task the primary lacks (3 of the 4 wanted) gets a stand-in
    assert (step.short, step.count, step.previous, step.short_at) == (1, 3, 0, now)
    assert desired_count(ecs, FALLBACK) == 3
    assert desired_count(ecs, SERVICE) == 0  # the primary is the scaler's to size, never the rule's


def test_no_task_starting_no_read_and_stand_ins_go_as_spot_catches_up(
    ecs: Any, services: tuple[EcsService, EcsService]
) -> None:
    primary, fallback = services
    fallback.set_desired(2)
    waiting = WaitingTasks(ecs)
    stand_ins = StandIns(primary, fallback, Fallback(after_s=180.0))
    now = time.time()
    step = stand_ins.step(3, ServiceCounts(desired=3, running=2, pending=0), short_at=now - 60, now=now)
    assert waiting.calls == []  # nothing starting: ECS is not asked for the tasks
    assert (step.count, step.previous) == (1, 2) and desired_count(ecs, FALLBACK) == 1
    step = stand_ins.step(3, ServiceCounts(desired=3, running=3, pending=0), short_at=step.short_at, now=now + 10)
    assert step.count == 0 and desired_count(ecs, FALLBACK) == 0


def test_tasks_starting_normally_are_not_short(ecs: Any, services: tuple[EcsService, EcsService]) -> None:
    primary, fallback = services
    waiting = WaitingTasks(ecs)
    now = time.time()
    waiting.tasks = [(now - 90, "PROVISIONING"), (now - 400, "PENDING")]  # on an instance, pulling: not short
    step = StandIns(primary, fallback, Fallback(after_s=180.0)).step(
        2, ServiceCounts(desired=2, running=0, pending=2), short_at=None, now=now)
    assert (step.short, step.count, step.short_at) == (0, 0, None)
    assert waiting.calls == ["ListTasks", "DescribeTasks"]
    assert desired_count(ecs, FALLBACK) == 0


async def test_the_scaler_sizes_the_primary_then_the_stand_ins_and_records_both(
    queue: Queue, ecs: Any, services: tuple[EcsService, EcsService]
) -> None:
    primary, fallback = services
    for _ in range(20):  # 20 jobs / 8 per worker -> 3 workers
        await queue.enqueue("tenant-a", JobRequest(body=dict(CHAT)))
    waiting = WaitingTasks(ecs)
    scaler = Scaler(queue, primary, ScalePolicy.from_settings(queue.settings),
                    metrics=Metrics(namespace="inferq-test", service=""), logger=Logger(service="scaler-test"),
                    stand_ins=StandIns(primary, fallback, Fallback(after_s=180.0)))
    tick = await scaler.tick()
    assert tick.applied and desired_count(ecs, SERVICE) == 3
    assert tick.stand_ins is not None and tick.stand_ins.count == 0  # moto's service has nothing starting yet
    recorded = await queue.scale_state()
    assert (recorded["stand_ins"], recorded["spot_short_at"]) == ("0", "")
    assert waiting.calls == []


async def test_a_missing_fallback_service_is_an_error_and_the_primary_is_still_sized(
    queue: Queue, ecs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    primary = EcsService(ecs, CLUSTER, SERVICE)
    await queue.enqueue("tenant-a", JobRequest(body=dict(CHAT)))
    scaler = Scaler(queue, primary, ScalePolicy.from_settings(queue.settings),
                    metrics=Metrics(namespace="inferq-test", service=""), logger=Logger(service="scaler-test"),
                    stand_ins=StandIns(primary, EcsService(ecs, CLUSTER, FALLBACK), Fallback(after_s=180.0)))
    tick = await scaler.tick()
    assert tick.applied and desired_count(ecs, SERVICE) == 1
    assert tick.errors == ["stand_ins"] and tick.stand_ins is None
    assert "could not size the on-demand fallback service" in caplog.text
    assert (await queue.scale_state())["desired"] == "1"  # the decision is recorded all the same
