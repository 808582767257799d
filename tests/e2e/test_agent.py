"""The emulator's ECS agent against moto in server mode, with stand-in task processes (a few lines of Python that
use the task protection endpoint the way a worker does): scale-in spares protected tasks and stops the others
with SIGTERM, SIGKILL after the stop timeout; a dead task is replaced; ``DescribeServices`` tells the truth."""

from __future__ import annotations

import asyncio
import io
import json
import random
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import boto3
import pytest

from emulator.agent import EcsAgent
from emulator.ecs import MotoEcs, Names
from emulator.procs import LogSink
from tests.support.waiting import NeverHappened, eventually_async

# A task that sets its own protection from PROTECT (a list of worker ids), then waits; IGNORE_TERM ignores SIGTERM.
TASK = r"""
import json, os, signal, sys, time, urllib.request
me = os.environ["INFERQ_WORKER_ID"]
if me in os.environ.get("IGNORE_TERM", "").split(","):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
protect = me in os.environ.get("PROTECT", "").split(",")
body = json.dumps({"ProtectionEnabled": protect, "ExpiresInMinutes": 5}).encode()
req = urllib.request.Request(os.environ["ECS_AGENT_URI"] + "/task-protection/v1/state", data=body, method="PUT",
                             headers={"Content-Type": "application/json"})
print("protection", json.load(urllib.request.urlopen(req, timeout=5))["protection"]["ProtectionEnabled"], flush=True)
while True:
    time.sleep(1)
"""


def _request(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


async def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    return await asyncio.to_thread(_request, method, url, body)


class Harness:
    def __init__(self, ecs: MotoEcs, agent: EcsAgent, log: io.StringIO) -> None:
        self.ecs = ecs
        self.agent = agent
        self.log = log
        self.client = boto3.client("ecs", endpoint_url=ecs.endpoint, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")

    async def set_desired(self, count: int) -> None:
        await asyncio.to_thread(self.client.update_service, cluster=self.ecs.names.cluster,
                                service=self.ecs.names.service, desiredCount=count)

    async def service(self) -> dict[str, Any]:
        reply = await asyncio.to_thread(self.client.describe_services, cluster=self.ecs.names.cluster,
                                        services=[self.ecs.names.service])
        return dict(reply["services"][0])

    async def counts_are(self, *, running: int, pending: int) -> bool:
        service = await self.service()
        return (service["runningCount"], service["pendingCount"]) == (running, pending)

    def live(self) -> dict[str, Any]:
        return {t.worker_id: t for t in self.agent.live()}

    async def until(self, condition: Callable[[], Any], what: str = "the agent's state", timeout: float = 10.0) -> None:
        try:
            await eventually_async(condition, what=what, timeout=timeout)
        except NeverHappened as failure:
            raise NeverHappened(f"{failure}; agent log:\n{self.log.getvalue()}") from None

    async def protected_reported(self, count: int) -> None:
        await self.until(lambda: self.log.getvalue().count("| protection") >= count, f"{count} protection calls")


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    log = io.StringIO()
    ecs = MotoEcs(Names("agent-test", "agent-test-workers"), stop_timeout_s=1)
    await asyncio.to_thread(ecs.start)
    env = {"PROTECT": "worker-1,worker-3", "IGNORE_TERM": "worker-4", "PYTHONUNBUFFERED": "1"}
    agent = await EcsAgent(ecs, LogSink(log), env, stop_timeout_s=1.0,
                           worker_argv=[sys.executable, "-c", TASK]).start()
    try:
        yield Harness(ecs, agent, log)
    finally:
        await agent.shutdown()
        ecs.stop()


async def test_scale_in_stops_unprotected_tasks_only_and_waits_for_protection_to_end(harness: Harness) -> None:
    await harness.set_desired(3)
    await harness.until(lambda: len(harness.live()) == 3, "3 live tasks")
    await harness.protected_reported(3)
    service = await harness.service()
    assert (service["desiredCount"], service["runningCount"]) == (3, 3)
    first = harness.live()["worker-1"]
    status, reply = await call("GET", harness.agent.agent_uri(first.id) + "/task-protection/v1/state")
    assert status == 200 and reply["protection"]["ProtectionEnabled"] is True
    assert reply["protection"]["TaskArn"] == first.arn and reply["protection"]["ExpirationDate"].endswith("Z")

    await harness.set_desired(1)
    # worker-2 is the only unprotected task: it goes; the two protected ones stay although one is surplus
    await harness.until(lambda: set(harness.live()) == {"worker-1", "worker-3"}, "worker-2 stopped")
    await harness.until(lambda: "1 surplus task(s) protected from scale-in" in harness.log.getvalue(),
                        "the agent's decision to spare the protected surplus task")
    assert set(harness.live()) == {"worker-1", "worker-3"}  # decided, and spared
    assert (await harness.service())["runningCount"] == 2

    third = harness.live()["worker-3"]
    status, reply = await call("PUT", harness.agent.agent_uri(third.id) + "/task-protection/v1/state",
                               {"ProtectionEnabled": False})
    assert status == 200 and reply["protection"]["ProtectionEnabled"] is False
    await harness.until(lambda: set(harness.live()) == {"worker-1"}, "only worker-1 live")
    await harness.until(lambda: "worker-3 stopped (exit -15)" in harness.log.getvalue(), "worker-3 stopped by SIGTERM")
    service = await harness.service()
    assert (service["desiredCount"], service["runningCount"]) == (1, 1)


async def test_a_dead_task_is_replaced_and_a_task_ignoring_sigterm_is_killed(harness: Harness) -> None:
    await harness.set_desired(1)
    await harness.until(lambda: "worker-1" in harness.live(), "worker-1 live")
    await harness.protected_reported(1)
    harness.live()["worker-1"].child.signal(9)
    await harness.until(lambda: "worker-2" in harness.live(), "worker-2 replacing worker-1")
    assert "worker-1 exited on its own (exit -9); replacing it\n" in harness.log.getvalue()

    await harness.set_desired(4)  # worker-3 .. worker-5; worker-4 ignores SIGTERM
    await harness.until(lambda: len(harness.live()) == 4, "4 live tasks")
    await harness.protected_reported(5)  # every task has made its protection call (worker-3 protects itself)
    await harness.set_desired(1)
    await harness.until(lambda: set(harness.live()) == {"worker-3"}, "only worker-3 live")
    await harness.until(lambda: "worker-4 stopped (exit -9)" in harness.log.getvalue(), "worker-4 killed",
                        timeout=5)
    assert "worker-4 | " in harness.log.getvalue()
    assert "| did not stop within 1s: SIGKILL" in harness.log.getvalue()


async def test_the_protection_endpoint_rejects_what_ecs_rejects(harness: Harness) -> None:
    await harness.set_desired(1)
    await harness.until(lambda: len(harness.live()) == 1, "one live task")
    [task] = harness.live().values()
    url = harness.agent.agent_uri(task.id) + "/task-protection/v1/state"
    for body in ({"ProtectionEnabled": "yes"}, {"ProtectionEnabled": True, "ExpiresInMinutes": 0},
                 {"ProtectionEnabled": True, "ExpiresInMinutes": 2881}, {}):
        status, reply = await call("PUT", url, body)
        assert status == 400 and reply["error"]["Code"] == "InvalidParameterException", body
    assert (await call("GET", harness.agent.agent_uri("nope") + "/task-protection/v1/state"))[0] == 404
    status, reply = await call("PUT", url, {"ProtectionEnabled": True})
    assert status == 200 and reply["protection"]["ProtectionEnabled"] is True  # default expiry: 2 hours


async def test_a_crash_loop_slows_replacements_down() -> None:
    log = io.StringIO()
    ecs = MotoEcs(Names("agent-crash", "agent-crash-workers"), stop_timeout_s=1)
    await asyncio.to_thread(ecs.start)
    agent = await EcsAgent(ecs, LogSink(log), {}, worker_argv=[sys.executable, "-c", "raise SystemExit(3)"]).start()
    harness = Harness(ecs, agent, log)
    try:
        await harness.set_desired(1)
        await harness.until(lambda: "(crash loop)" in log.getvalue(), "a crash loop noticed")
        lines = [line for line in log.getvalue().splitlines() if "exited on its own (exit 3)" in line]
        assert len(lines) == 3  # replaced at once twice; the third failure in a row is a crash loop
        assert lines[-1].endswith("replacing it in 0.5s (crash loop)")
    finally:
        await agent.shutdown()
        ecs.stop()


async def test_an_emulated_boot_keeps_a_task_pending_and_a_scale_in_cancels_it_first() -> None:
    """INFERQ_EMULATOR_BOOT_S: a new task is pending (the service's pendingCount) for the boot, then its process
    starts; a scale-in during the boot cancels a task still starting before it stops a running one."""
    log = io.StringIO()
    ecs = MotoEcs(Names("agent-boot", "agent-boot-workers"), stop_timeout_s=1)
    await asyncio.to_thread(ecs.start)
    # a boot long enough that the scale-in below lands within it on a loaded machine
    agent = await EcsAgent(ecs, LogSink(log), {"PYTHONUNBUFFERED": "1"}, stop_timeout_s=1.0, boot_s=3.0,
                           worker_argv=[sys.executable, "-c", TASK]).start()
    harness = Harness(ecs, agent, log)
    try:
        await harness.set_desired(1)
        await eventually_async(lambda: harness.counts_are(running=0, pending=1), what="one task pending")
        assert not harness.live()  # still booting
        await harness.until(lambda: set(harness.live()) == {"worker-1"}, "worker-1 booted", timeout=10)
        assert await harness.counts_are(running=1, pending=0)

        await harness.set_desired(2)
        await eventually_async(lambda: harness.counts_are(running=1, pending=1), what="worker-2 booting")
        await harness.set_desired(1)  # while worker-2 boots: its boot is cancelled, worker-1 keeps running
        await eventually_async(lambda: harness.counts_are(running=1, pending=0), what="worker-2's boot cancelled")
        assert set(harness.live()) == {"worker-1"}
        assert "started worker-2" not in log.getvalue()  # a cancelled boot never starts its worker
    finally:
        await agent.shutdown()
        ecs.stop()


async def test_a_spot_interruption_stops_a_protected_task_and_replaces_it_at_once(harness: Harness) -> None:
    """As ECS drains a Spot instance: the task goes whatever its protection, stops counting as running, and its
    replacement starts while it is still stopping (worker-4 ignores SIGTERM: it lives until the SIGKILL)."""
    await harness.set_desired(1)
    await harness.until(lambda: "worker-1" in harness.live(), "worker-1 live")
    await harness.protected_reported(1)  # worker-1 protects itself
    status, reply = await call("POST", f"http://127.0.0.1:{harness.agent.port}/interrupt", {"notice_s": 120})
    assert status == 200 and reply["worker"] == "worker-1" and reply["kill_after_s"] == 1.0  # the stop timeout
    await harness.until(lambda: "worker-2" in harness.live(), "worker-2 live")
    assert "stopping worker-1 (Spot interruption, 120s notice): SIGTERM" in harness.log.getvalue()
    await harness.until(lambda: "worker-1 stopped (exit -15)" in harness.log.getvalue(), "worker-1 stopped by SIGTERM")
    service = await harness.service()
    assert (service["desiredCount"], service["runningCount"]) == (1, 1)

    await harness.set_desired(3)  # worker-3, worker-4 (ignores SIGTERM)
    await harness.until(lambda: {"worker-3", "worker-4"} <= set(harness.live()), "worker-3 and worker-4 live")
    await harness.protected_reported(4)
    assert harness.agent.interrupt("worker-4", notice_s=0.5) is not None
    await harness.until(lambda: "worker-5" in harness.live(), "worker-5 live")
    assert "worker-4" not in harness.live() and "worker-4 stopped" not in harness.log.getvalue()  # still stopping
    await harness.until(lambda: "worker-4 stopped (exit -9)" in harness.log.getvalue(),  # the notice's end
                        "worker-4 killed")
    assert harness.agent.interrupted == 2


async def test_the_interrupt_endpoint_names_a_live_worker_or_says_why_not(harness: Harness) -> None:
    url = f"http://127.0.0.1:{harness.agent.port}/interrupt"
    assert (await call("POST", url, {}))[0] == 404  # no live task yet
    await harness.set_desired(1)
    await harness.until(lambda: "worker-1" in harness.live(), "worker-1 live")
    for body in ({"notice_s": -1}, {"notice_s": "soon"}, {"worker": 3}, [1]):
        status, reply = await call("POST", url, body)
        assert status == 400 and reply["error"]["type"] == "invalid_request", body
    status, reply = await call("POST", url, {"worker": "worker-9"})
    assert status == 404 and "worker-9" in reply["error"]["message"]
    assert (await call("GET", url))[0] == 405
    assert set(harness.live()) == {"worker-1"}  # none of these interrupted anything


async def test_random_interruptions_keep_the_service_whole() -> None:
    """INFERQ_EMULATOR_INTERRUPT_EVERY_S: every task is interrupted after a random time, and replaced."""
    log = io.StringIO()
    ecs = MotoEcs(Names("agent-spot", "agent-spot-workers"), stop_timeout_s=1)
    await asyncio.to_thread(ecs.start)
    agent = await EcsAgent(ecs, LogSink(log), {"PYTHONUNBUFFERED": "1"}, stop_timeout_s=1.0,
                           interrupt_every_s=0.3, rng=random.Random(7),
                           worker_argv=[sys.executable, "-c", TASK]).start()
    harness = Harness(ecs, agent, log)
    try:
        await harness.set_desired(2)
        await harness.until(lambda: agent.interrupted >= 3, "three interruptions", timeout=30)
        await harness.until(lambda: len(harness.live()) == 2, "two live tasks")
        assert log.getvalue().count("(Spot interruption, 120s notice)") == agent.interrupted
    finally:
        await agent.shutdown()
        ecs.stop()


async def test_shutdown_ends_when_a_kick_lands_with_it() -> None:
    """The reconcile loop's wait for a kick ends with the kick: a shutdown that follows it in the same turn of the
    event loop (here deterministically; under Spot interruptions every 0.3 s, by chance) still ends the loop at once.
    (A cancel there was swallowed by Python 3.11's asyncio.wait_for, and the shutdown waited until cancelled.)"""
    ecs = MotoEcs(Names("agent-kick", "agent-kick-workers"), stop_timeout_s=1)
    await asyncio.to_thread(ecs.start)
    published: list[tuple[int, int]] = []
    publish = ecs.set_counts

    def counted(running: int, pending: int, service: str | None = None) -> None:
        published.append((running, pending))
        publish(running, pending, service)

    ecs.set_counts = counted  # type: ignore[method-assign]
    agent = await EcsAgent(ecs, LogSink(io.StringIO()), {}, stop_timeout_s=1.0,
                           worker_argv=[sys.executable, "-c", TASK]).start()
    shutdown: asyncio.Task[None] | None = None
    try:
        # the first reconcile published its counts: the loop now waits for a kick
        await eventually_async(lambda: published, what="the agent's first reconcile")
        agent.kick()
        await asyncio.sleep(0)  # the kick's wait completes; the loop's own wake is still to come
        shutdown = asyncio.create_task(agent.shutdown())
        done, _ = await asyncio.wait([shutdown], timeout=30)  # a bound, not a figure: it ends in a turn or two
        assert done, "the agent's shutdown never ended"
    finally:
        if shutdown is not None and not shutdown.done():
            shutdown.cancel()
        ecs.stop()
