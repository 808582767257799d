"""ECS task scale-in protection: set on idle -> busy and busy -> idle only, expiring after the job timeout."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from gpu_worker.protection import TaskProtection, expires_minutes
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from tests.support.waiting import eventually_async

from .support import Receiver, chat, running_worker, submit, terminal


@pytest.fixture
def agent() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


def puts(agent: Receiver) -> list[dict[str, object]]:
    assert all(method == "PUT" and path == "/v1/abc/task-protection/v1/state" for method, path, _, _ in agent.requests)
    return [json.loads(body) for _, _, _, body in agent.requests]


async def test_protection_follows_busy_and_idle_transitions_only(
    settings: Settings, queue: Queue, agent: Receiver
) -> None:
    settings = settings.replace(window=4, job_timeout_s=600, drain_s=25)
    protection = TaskProtection(agent.url + "/v1/abc", expires_minutes=expires_minutes(settings), idle_grace_s=0.2)
    async with running_worker(settings, queue, protection=protection):
        for _ in range(2):
            jobs = [await submit(queue, chat(f"q{i}", latency_ms=300)) for i in range(6)]
            for job in jobs:
                assert (await terminal(queue, job.id)).status is JobStatus.SUCCEEDED

            async def idle_again() -> bool:
                return len(agent.requests) % 2 == 0 and len(agent.requests) > 0

            await eventually_async(idle_again, what="protection off", timeout=5)
            await asyncio.sleep(0.3)
    on = {"ProtectionEnabled": True, "ExpiresInMinutes": 12}
    off = {"ProtectionEnabled": False}
    assert puts(agent) == [on, off, on, off]  # six jobs each time, two calls each time


async def test_a_short_idle_gap_between_jobs_keeps_protection(
    settings: Settings, queue: Queue, agent: Receiver
) -> None:
    protection = TaskProtection(agent.url + "/v1/abc", expires_minutes=5, idle_grace_s=1.5)
    async with running_worker(settings, queue, protection=protection):
        for text in ("first", "second", "third"):
            job = await submit(queue, chat(text, latency_ms=200))
            assert (await terminal(queue, job.id)).status is JobStatus.SUCCEEDED
            await asyncio.sleep(0.2)  # idle, but shorter than the grace

        async def off() -> bool:
            return len(agent.requests) == 2

        await eventually_async(off, what="protection off after the grace", timeout=5)
    assert puts(agent) == [{"ProtectionEnabled": True, "ExpiresInMinutes": 5}, {"ProtectionEnabled": False}]


def test_protection_outlasts_a_job_and_the_drain() -> None:
    assert expires_minutes(Settings(job_timeout_s=600, drain_s=25)) * 60 > 600 + 25
    assert expires_minutes(Settings(job_timeout_s=3600, drain_s=3600)) * 60 > 7200
    assert expires_minutes(Settings(job_timeout_s=1, drain_s=0)) >= 1


def test_protection_exists_only_on_ecs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ECS_AGENT_URI", raising=False)
    assert TaskProtection.from_environment(Settings()) is None
    monkeypatch.setenv("ECS_AGENT_URI", "http://169.254.170.2/api/abc")
    protection = TaskProtection.from_environment(Settings())
    assert protection is not None and protection.url == "http://169.254.170.2/api/abc/task-protection/v1/state"


async def test_a_failing_agent_does_not_stop_the_jobs(settings: Settings, queue: Queue, agent: Receiver) -> None:
    agent.statuses = [500, 500]
    protection = TaskProtection(agent.url + "/v1/abc", expires_minutes=5, idle_grace_s=0.1)
    async with running_worker(settings, queue, protection=protection):
        job = await submit(queue, chat("x", latency_ms=1500))
        assert (await terminal(queue, job.id)).status is JobStatus.SUCCEEDED
    assert len(agent.requests) >= 2  # tried, failed, tried again
