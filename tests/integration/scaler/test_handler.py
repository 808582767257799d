"""The scaler Lambda end to end: the real handler, a real Valkey backlog, ECS in moto, EMF on stdout.

Each test gets its own queue and its own moto ECS (the shared ``ecs`` fixture of tests/conftest.py: cluster
``inferq``, service ``gpu-workers`` at desired 0).
``UpdateService`` calls are seen through botocore's own event hooks on the handler's client.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis

from functions.gateway.wake import wake_event
from functions.scaler import app
from functions.scaler.scaler import Cadence
from inferq.config.settings import Settings, SettingsError
from inferq.queue.jobs import JobRequest, Priority
from inferq.queue.protocol import Queue
from tests.conftest import load_event
from tests.support.ecs import CLUSTER, SERVICE, desired_count
from tests.support.queued import read_all

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
QUEUE_METRICS = {"Lag", "Pending", "Delayed", "Desired", "Running", "OldestJobAgeSeconds", "Dlq"}


@dataclass
class LambdaContext:
    remaining_ms: int = 1000
    function_name: str = "inferq-scaler"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, self.remaining_ms - int((time.monotonic() - self.started) * 1000))


def scheduled() -> dict[str, Any]:
    return load_event("eventBridgeScheduledEvent.json")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def scaler_env(monkeypatch: pytest.MonkeyPatch, settings: Settings, aws_env: None) -> Iterator[None]:
    """The environment the SAM template gives the function, pointing at this test's queue."""
    for name in list(os.environ):
        if name.startswith("INFERQ_"):
            monkeypatch.delenv(name)
    env = {
        "INFERQ_REDIS_URL": settings.redis_url, "INFERQ_QUEUE": settings.queue, "INFERQ_ECS_CLUSTER": CLUSTER,
        "INFERQ_ECS_SERVICE": SERVICE, "INFERQ_SCALE_MIN": "0", "INFERQ_SCALE_MAX": "4", "INFERQ_WINDOW": "8",
        "INFERQ_SCALE_DOWN_COOLDOWN_S": "120", "INFERQ_SCALE_TO_ZERO_AFTER_S": "300",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    app.reset()
    yield
    app.reset()


@pytest.fixture
def ecs(ecs: Any, scaler_env: None) -> Any:
    """The shared moto ECS (tests/conftest.py), with the function's environment."""
    return ecs


@pytest.fixture
def updates(ecs: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every UpdateService the handler's own client sends (by desired count), through botocore's event hooks on
    each client the handler creates."""
    calls: list[int] = []
    spied: set[int] = set()
    real = app.ecs_client

    def record(params: dict[str, Any], **_: Any) -> None:
        calls.append(params["desiredCount"])

    def ecs_client() -> Any:
        client = real()
        if id(client) not in spied:
            spied.add(id(client))
            client.meta.events.register("before-parameter-build.ecs.UpdateService", record)
        return client

    monkeypatch.setattr(app, "ecs_client", ecs_client)
    return calls


def set_desired(ecs: Any, count: int) -> None:
    ecs.update_service(cluster=CLUSTER, service=SERVICE, desiredCount=count)


def emf(out: str) -> list[dict[str, Any]]:
    """The EMF documents among stdout's lines (logs are JSON too, but carry no ``_aws``), with each metric's
    one value unwrapped from the list Powertools writes."""
    docs = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            doc = json.loads(line)
            if "_aws" in doc:
                docs.append({k: v[0] if isinstance(v, list) and len(v) == 1 else v for k, v in doc.items()})
    return docs


async def enqueue(queue: Queue, n: int, **kw: Any) -> list[str]:
    return [(await queue.enqueue("tenant-a", JobRequest(body=dict(CHAT), **kw)))[0].id for _ in range(n)]


# ------------------------------------------------------------------------------------------------ scaling


async def test_a_scheduled_tick_sets_the_desired_count_from_a_real_backlog(
    queue: Queue, ecs: Any, updates: list[int]
) -> None:
    await enqueue(queue, 20)  # 20 jobs / 8 per worker -> 3 workers
    answer = app.handler(scheduled(), LambdaContext())
    assert answer["trigger"] == "schedule" and answer["evaluations"] == 1
    assert (answer["desired"], answer["changes"], answer["errors"]) == (3, 1, [])
    assert desired_count(ecs) == 3 and updates == [3]
    recorded = await queue.scale_state()
    assert recorded["desired"] == "3" and recorded["reason"].startswith("scale_up")
    assert recorded["action"] == "scale_up" and abs(float(recorded["at"]) - time.time()) < 30


async def test_one_job_at_zero_scales_to_one(queue: Queue, ecs: Any, updates: list[int]) -> None:
    await enqueue(queue, 1)
    app.handler(scheduled(), LambdaContext())
    assert desired_count(ecs) == 1 and updates == [1]


@pytest.mark.parametrize("lane", list(Priority))
async def test_a_backlog_in_one_lane_alone_wakes_the_fleet(
    queue: Queue, ecs: Any, updates: list[int], lane: Priority
) -> None:
    await enqueue(queue, 9, priority=lane)  # 9 jobs / 8 per worker -> 2 workers
    app.handler(wake_event(queue.settings.queue), LambdaContext())
    assert desired_count(ecs) == 2 and updates == [2]


async def test_the_backlog_counts_every_lane(queue: Queue, ecs: Any, updates: list[int]) -> None:
    for lane in Priority:
        await enqueue(queue, 6, priority=lane)  # 18 jobs / 8 per worker -> 3 workers
    await read_all(queue, "w1", 4)  # taken ones count as pending
    answer = app.handler(scheduled(), LambdaContext())
    assert answer["desired"] == 3 and updates == [3]
    seen = await queue.observe()
    assert (seen.lag, seen.pending) == (14, 4)


async def test_nothing_changed_means_no_update_service_call(queue: Queue, ecs: Any, updates: list[int]) -> None:
    app.handler(scheduled(), LambdaContext())  # empty queue, fleet at zero
    assert updates == [] and desired_count(ecs) == 0
    await enqueue(queue, 9)
    app.handler(scheduled(), LambdaContext())
    app.handler(scheduled(), LambdaContext())
    app.handler(wake_event(queue.settings.queue), LambdaContext())
    assert updates == [2]
    assert (await queue.scale_state())["reason"].startswith("steady")


async def test_tasks_still_starting_count_as_capacity(queue: Queue, ecs: Any, updates: list[int]) -> None:
    """The service already asks for 3 tasks, none running yet (GPU instances booting): 24 jobs need 3, so nothing
    is added; 32 need 4, so one is added, not four."""

    def booting(parsed: dict[str, Any], **_: Any) -> None:
        for svc in parsed.get("services", []):
            svc["pendingCount"], svc["runningCount"] = svc["desiredCount"], 0

    app.ecs_client().meta.events.register("after-call.ecs.DescribeServices", booting)
    set_desired(ecs, 3)
    await enqueue(queue, 24)
    assert app.handler(scheduled(), LambdaContext())["desired"] == 3
    assert updates == []
    await enqueue(queue, 8)
    app.handler(scheduled(), LambdaContext())
    assert updates == [4]


async def test_tasks_still_starting_are_not_cancelled_before_the_cooldown(
    queue: Queue, ecs: Any, updates: list[int]
) -> None:
    def booting(parsed: dict[str, Any], **_: Any) -> None:
        for svc in parsed.get("services", []):
            svc["pendingCount"], svc["runningCount"] = svc["desiredCount"], 0

    app.ecs_client().meta.events.register("after-call.ecs.DescribeServices", booting)
    await enqueue(queue, 20)
    app.handler(scheduled(), LambdaContext())  # 0 -> 3, all three booting
    await queue.redis.delete(queue.keys.stream)  # the burst is gone before they are up; one job is left
    await enqueue(queue, 1)
    app.handler(scheduled(), LambdaContext())
    assert updates == [3] and desired_count(ecs) == 3


async def test_a_count_set_by_someone_else_is_kept_through_the_cooldown(
    queue: Queue, ecs: Any, updates: list[int]
) -> None:
    await enqueue(queue, 1)
    app.handler(scheduled(), LambdaContext())
    set_desired(ecs, 4)  # an operator scales out by hand
    app.handler(scheduled(), LambdaContext())
    assert updates == [1] and desired_count(ecs) == 4
    assert (await queue.scale_state())["reason"].startswith("hold: cooldown")


async def test_scales_down_to_zero_once_idle_and_cooled_down(
    queue: Queue, ecs: Any, updates: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERQ_SCALE_DOWN_COOLDOWN_S", "0")
    monkeypatch.setenv("INFERQ_SCALE_TO_ZERO_AFTER_S", "0")
    app.reset()
    set_desired(ecs, 3)
    app.handler(scheduled(), LambdaContext())
    assert updates == [0] and desired_count(ecs) == 0
    assert (await queue.scale_state())["action"] == "scale_to_zero"


async def test_an_idle_fleet_is_held_during_the_cooldown(queue: Queue, ecs: Any, updates: list[int]) -> None:
    set_desired(ecs, 3)
    app.handler(scheduled(), LambdaContext())
    assert updates == [] and desired_count(ecs) == 3


async def test_never_below_the_busy_workers(queue: Queue, ecs: Any, updates: list[int]) -> None:
    """Two workers heartbeat with jobs in flight (their entries pending): the fleet at zero goes to two."""
    await enqueue(queue, 2)
    for worker in ("w1", "w2"):
        deliveries, _ = await queue.read(worker, 1)
        assert len(deliveries) == 1
        await queue.heartbeat(worker, 1)
    app.handler(scheduled(), LambdaContext())
    assert updates == [2]


async def test_stale_heartbeats_do_not_hold_workers(
    queue: Queue, ecs: Any, updates: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    """Workers that died with jobs in flight (heartbeats an hour old) are neither busy nor live."""
    old = int((time.time() - 3600) * 1000)
    for worker in ("dead1", "dead2", "dead3"):
        await queue.heartbeat(worker, 5, now=old)
    capsys.readouterr()
    app.handler(scheduled(), LambdaContext())
    assert updates == []
    [doc] = emf(capsys.readouterr().out)
    assert (doc["Workers"], doc["BusyWorkers"], doc["Desired"]) == (0, 0, 0)


async def test_due_retries_are_promoted_and_counted(queue: Queue, ecs: Any, updates: list[int]) -> None:
    await enqueue(queue, 1)
    [delivery], _ = await queue.read("w1", 1)
    await queue.retry(delivery, delay_ms=1, error={"type": "timeout", "message": "slow"})
    assert (await queue.observe()).delayed == 1
    time.sleep(0.01)  # past the retry's 1 ms delay: due at the tick
    app.handler(scheduled(), LambdaContext())
    assert updates == [1]  # the delayed retry is backlog
    after = await queue.observe()
    assert (after.delayed, after.lag) == (0, 1)


# ------------------------------------------------------------------------------------------------ metrics


async def test_each_tick_prints_its_metrics_as_emf(
    queue: Queue, ecs: Any, updates: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    set_desired(ecs, 1)  # moto runs what is desired at once: one task running
    await enqueue(queue, 12)
    deliveries, _ = await read_all(queue, "w1", 4)
    assert len(deliveries) == 4
    capsys.readouterr()
    app.handler(scheduled(), LambdaContext())
    [doc] = emf(capsys.readouterr().out)
    directive = doc["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == "inferq"
    assert directive["Dimensions"] == [["queue"]] and doc["queue"] == queue.settings.queue
    names = {m["Name"] for m in directive["Metrics"]}
    assert QUEUE_METRICS | {"ObserveErrors", "ScaleChanges"} <= names
    units = {m["Name"]: m["Unit"] for m in directive["Metrics"]}
    assert units["OldestJobAgeSeconds"] == "Seconds" and units["Lag"] == "Count"
    assert (doc["Lag"], doc["Pending"], doc["Delayed"], doc["Dlq"]) == (8, 4, 0, 0)
    # Running is what ECS said before this tick's update; Desired what is in force after it
    assert (doc["Desired"], doc["Running"], doc["ScaleChanges"], doc["ObserveErrors"]) == (2, 1, 1, 0)
    assert 0 <= doc["OldestJobAgeSeconds"] < 60
    assert updates == [2]


async def test_the_namespace_follows_powertools_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "custom")
    try:
        assert importlib.reload(app).metrics.provider.namespace == "custom"
    finally:
        monkeypatch.delenv("POWERTOOLS_METRICS_NAMESPACE")
        assert importlib.reload(app).metrics.provider.namespace == "inferq"


# ------------------------------------------------------------------------------------------------ cadence


async def test_a_scheduled_invocation_evaluates_until_its_time_is_nearly_over(
    queue: Queue, ecs: Any, updates: list[int], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # ticks every 0.2 s while one can end 0.6 s before the Lambda's time is over: the time the handler takes to make
    # its clients comes out of the same budget (measured: up to 0.4 s on a loaded host), and the last tick has the
    # reserve to end in
    monkeypatch.setattr(app, "CADENCE", Cadence(every_s=0.2, reserve_s=0.6))
    await enqueue(queue, 3)
    capsys.readouterr()
    context = LambdaContext(remaining_ms=1800)
    answer = app.handler(scheduled(), context)
    left_ms = context.get_remaining_time_in_millis()
    # it kept ticking until the next tick could not end in the reserve (time left under a tick plus the reserve,
    # however slow this machine's ticks are), and returned with time left: a Lambda past its time is killed
    assert answer["evaluations"] >= 2 and 0 < left_ms < (0.2 + 0.6) * 1000, (answer, left_ms)
    assert updates == [1]  # one change, then the same answer each tick
    assert len(emf(capsys.readouterr().out)) == answer["evaluations"]


async def test_the_time_to_make_the_clients_comes_out_of_the_budget(
    queue: Queue, ecs: Any, updates: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Lambda's deadline is fixed as the invocation begins: a slow start (a cold boto3 client) leaves fewer
    ticks, not ticks past the deadline. 1 s, of which 0.6 s go to the ECS client and 0.3 s are the reserve: time
    for the first tick alone (counting from after the setup, there would be four)."""
    made = app.ecs_client

    def slow_client() -> Any:
        time.sleep(0.6)
        return made()

    monkeypatch.setattr(app, "ecs_client", slow_client)
    monkeypatch.setattr(app, "CADENCE", Cadence(every_s=0.2, reserve_s=0.3))
    await enqueue(queue, 1)
    answer = app.handler(scheduled(), LambdaContext(remaining_ms=1000))
    assert answer["evaluations"] == 1 and answer["desired"] == 1, answer


async def test_a_wake_up_evaluates_once_at_once(
    queue: Queue, ecs: Any, updates: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app, "CADENCE", Cadence(every_s=0.1, reserve_s=0.2))
    await enqueue(queue, 1)
    answer = app.handler(wake_event(queue.settings.queue), LambdaContext(remaining_ms=900))
    assert (answer["trigger"], answer["evaluations"], answer["desired"]) == ("wake", 1, 1)
    assert app.handler({"source": "inferq.gateway", "reason": "wake"}, None)["evaluations"] == 1


async def test_the_handler_runs_from_a_thread_with_a_running_loop(queue: Queue, ecs: Any, updates: list[int]) -> None:
    await enqueue(queue, 1)
    assert app.handler(scheduled(), LambdaContext())["desired"] == 1  # called inside this test's event loop


# ------------------------------------------------------------------------------------------------ robustness


async def test_a_missing_stream_and_group_read_as_empty(
    settings: Settings, ecs: Any, updates: list[int], sync_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not sync_redis.exists(f"inferq:{{{settings.queue}}}:stream")
    capsys.readouterr()
    answer = app.handler(scheduled(), LambdaContext())
    assert (answer["desired"], answer["errors"], updates) == (0, [], [])
    [doc] = emf(capsys.readouterr().out)
    assert (doc["Lag"], doc["Pending"], doc["ObserveErrors"]) == (0, 0, 0)


async def test_entries_in_a_stream_without_its_group_still_count(
    settings: Settings, ecs: Any, updates: list[int], sync_redis: redis.Redis
) -> None:
    """Workers create the group at id 0, so these entries will be served: they are backlog."""
    sync_redis.xadd(f"inferq:{{{settings.queue}}}:stream", {"job": "job_x", "attempt": "1"})
    app.handler(scheduled(), LambdaContext())
    assert updates == [1]


async def test_redis_down_leaves_the_count_unchanged_and_is_counted(
    ecs: Any, updates: list[int], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INFERQ_REDIS_URL", f"redis://127.0.0.1:{closed_port()}/0")
    app.reset()
    set_desired(ecs, 2)
    capsys.readouterr()
    answer = app.handler(scheduled(), LambdaContext())
    assert (answer["desired"], answer["errors"], answer["changes"]) == (2, ["redis"], 0)
    assert updates == [] and desired_count(ecs) == 2
    [doc] = emf(capsys.readouterr().out)
    assert doc["ObserveErrors"] == 1 and doc["Desired"] == 2 and "Lag" not in doc


async def test_ecs_down_leaves_the_count_unchanged_and_is_counted(
    queue: Queue, scaler_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_ECS", f"http://127.0.0.1:{closed_port()}")
    app.reset()
    await enqueue(queue, 5)
    capsys.readouterr()
    answer = app.handler(scheduled(), LambdaContext())
    assert (answer["desired"], answer["errors"], answer["changes"]) == (None, ["ecs"], 0)
    assert app.ecs_client().meta.endpoint_url.startswith("http://127.0.0.1:")
    assert "desired" not in await queue.scale_state()  # no decision without knowing what is in force
    [doc] = emf(capsys.readouterr().out)
    assert (doc["ObserveErrors"], doc["Lag"]) == (1, 5) and "Desired" not in doc


async def test_a_missing_service_is_an_ecs_error(
    queue: Queue, ecs: Any, updates: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERQ_ECS_SERVICE", "not-there")
    app.reset()
    await enqueue(queue, 5)
    assert app.handler(scheduled(), LambdaContext())["errors"] == ["ecs"]


async def test_a_refused_update_is_counted_and_not_recorded(
    queue: Queue, ecs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    class Denied:
        status_code = 400
        headers: dict[str, str] = {}

    def deny(**_: Any) -> tuple[Any, dict[str, Any]]:
        return Denied(), {"Error": {"Code": "AccessDeniedException", "Message": "not allowed"},
                          "ResponseMetadata": {"HTTPStatusCode": 400}}

    app.ecs_client().meta.events.register("before-call.ecs.UpdateService", deny)
    await enqueue(queue, 5)
    capsys.readouterr()
    answer = app.handler(scheduled(), LambdaContext())
    assert (answer["desired"], answer["errors"]) == (0, ["apply"])
    assert desired_count(ecs) == 0 and "desired" not in await queue.scale_state()
    [doc] = emf(capsys.readouterr().out)
    assert (doc["ApplyErrors"], doc["ScaleChanges"], doc["Desired"]) == (1, 0, 0)


@pytest.mark.parametrize(
    ("variable", "value"), [("INFERQ_ECS_SERVICE", None), ("INFERQ_ECS_CLUSTER", ""), ("INFERQ_SCALE_MAX", "lots")]
)
def test_invalid_settings_stop_the_function_naming_the_variable(
    scaler_env: None, monkeypatch: pytest.MonkeyPatch, variable: str, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(variable)
    else:
        monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as err:
        app.handler(scheduled(), LambdaContext())
    assert err.value.variable == variable and variable in str(err.value)


# ------------------------------------------------------------------------------------------------ webhooks


class _Receiver(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Receiver", (_Receiver,), {"received": received}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()
    server.server_close()


async def test_webhooks_of_jobs_ended_at_zero_are_delivered_by_the_tick(
    queue: Queue, ecs: Any, updates: list[int], receiver: tuple[str, list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INFERQ_WEBHOOK_ALLOW_PRIVATE", "true")  # the receiver is on loopback
    url, received = receiver
    [job_id] = await enqueue(queue, 1, webhook_url=url)
    await queue.cancel("tenant-a", job_id)  # the gateway cancels it; no worker is up to send the webhook
    answer = app.handler(scheduled(), LambdaContext())
    assert answer["errors"] == []
    assert [(j["id"], j["status"]) for j in received] == [(job_id, "cancelled")]
    app.handler(scheduled(), LambdaContext())
    assert len(received) == 1  # delivered once
