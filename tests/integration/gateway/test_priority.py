"""POST /v1/jobs with ``priority``, against a real Valkey: each lane's job lands in its lane's stream and carries
its priority; anything else is 422 in the envelope; a tenant's default lane applies unless the request names one;
the lane is part of the request an idempotency key stands for."""

from __future__ import annotations

import httpx
import pytest

from inferq.config.settings import Settings, SettingsError
from inferq.queue.jobs import Priority
from inferq.queue.protocol import Queue

from .conftest import AppFactory
from .support import CHAT, A, B
from .test_submit import assert_envelope

OTHER_LANES = {Priority.HIGH: (Priority.NORMAL, Priority.LOW), Priority.NORMAL: (Priority.HIGH, Priority.LOW),
               Priority.LOW: (Priority.HIGH, Priority.NORMAL)}


async def _lane_entries(queue: Queue, lane: Priority) -> list[str]:
    return [fields["job"] for _, fields in await queue.redis.xrange(queue.keys.stream_of(lane))]


@pytest.mark.parametrize("lane", list(Priority))
async def test_a_job_submitted_with_a_priority_is_an_entry_of_that_lane_and_says_so(
    client: httpx.AsyncClient, queue: Queue, lane: Priority
) -> None:
    response = await client.post("/v1/jobs", json={**CHAT, "priority": lane.value}, headers=A)
    assert response.status_code == 202, response.text
    job = response.json()
    assert job["priority"] == lane.value
    assert await _lane_entries(queue, lane) == [job["id"]]
    for other in OTHER_LANES[lane]:
        assert await _lane_entries(queue, other) == []
    fetched = (await client.get(f"/v1/jobs/{job['id']}", headers=A)).json()
    assert fetched["priority"] == lane.value
    assert (await queue.redis.hget(queue.keys.job(job["id"]), "lane")) == lane.value


async def test_a_job_without_a_priority_is_normal(client: httpx.AsyncClient, queue: Queue) -> None:
    job = (await client.post("/v1/jobs", json=CHAT, headers=A)).json()
    assert job["priority"] == "normal" and await _lane_entries(queue, Priority.NORMAL) == [job["id"]]


@pytest.mark.parametrize("priority", ["urgent", "HIGH", "", 1, True, ["high"], {"lane": "low"}])
async def test_any_other_priority_is_422_in_the_envelope(
    client: httpx.AsyncClient, queue: Queue, priority: object
) -> None:
    response = await client.post("/v1/jobs", json={**CHAT, "priority": priority}, headers=A)
    data = assert_envelope(response, 422, "invalid_request")
    assert "priority" in data["error"]["message"]
    for stream in queue.keys.lane_streams:
        assert await queue.redis.xlen(stream) == 0


async def test_a_tenant_default_applies_unless_the_request_names_a_priority(
    make_app: AppFactory, open_client: object, queue: Queue
) -> None:
    settings = Settings.from_env({"INFERQ_TENANT_PRIORITIES": "tenant-a:low, tenant-b:high"})
    client = open_client(make_app(tenant_priorities=settings.tenant_priorities))  # type: ignore[operator]
    a = (await client.post("/v1/jobs", json=CHAT, headers=A)).json()
    b = (await client.post("/v1/jobs", json=CHAT, headers=B)).json()
    explicit = (await client.post("/v1/jobs", json={**CHAT, "priority": "normal"}, headers=A)).json()
    assert (a["priority"], b["priority"], explicit["priority"]) == ("low", "high", "normal")
    assert await _lane_entries(queue, Priority.LOW) == [a["id"]]
    assert await _lane_entries(queue, Priority.HIGH) == [b["id"]]
    assert await _lane_entries(queue, Priority.NORMAL) == [explicit["id"]]


@pytest.mark.parametrize("raw", ["tenant-a", "tenant-a:urgent", "bad tenant:low", ":low", "tenant-a:"])
def test_a_bad_tenant_priorities_setting_stops_the_process_naming_the_variable(raw: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"INFERQ_TENANT_PRIORITIES": raw})
    assert info.value.variable == "INFERQ_TENANT_PRIORITIES"


async def test_the_same_idempotency_key_with_another_priority_is_a_conflict(
    client: httpx.AsyncClient, queue: Queue
) -> None:
    first = await client.post("/v1/jobs", json={**CHAT, "priority": "high", "idempotency_key": "k"}, headers=A)
    again = await client.post("/v1/jobs", json={**CHAT, "priority": "high", "idempotency_key": "k"}, headers=A)
    other = await client.post("/v1/jobs", json={**CHAT, "priority": "low", "idempotency_key": "k"}, headers=A)
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["priority"] == "high"
    assert_envelope(other, 409, "idempotency_conflict")
    assert await _lane_entries(queue, Priority.HIGH) == [first.json()["id"]]
    assert await _lane_entries(queue, Priority.LOW) == []
