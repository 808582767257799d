"""GET /v1/jobs/{id} (with wait), cancel, the DLQ, /v1/scale, health — and tenant isolation on each."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI

from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from tests.support.queued import read_all
from tests.support.waiting import eventually_async

from .conftest import AppFactory
from .support import CHAT, A, B
from .test_submit import assert_envelope

UNKNOWN_ID = "job_aaaaaaaaaaaaaaaaaaaaaaaaaa"


WOKEN_WITHIN_S = 10.0
"""A guard, not a measurement: half the 20 s deadline of the waits that must answer before it."""


async def submit(client: httpx.AsyncClient, headers: dict[str, str] = A) -> str:
    response = await client.post("/v1/jobs", json=CHAT, headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def complete(queue: Queue, job_id: str, delay_s: float = 0.0) -> None:
    """What a worker does: take the entry, then write the terminal state."""
    await asyncio.sleep(delay_s)
    deliveries, _ = await read_all(queue, "test-worker", 10)
    [delivery] = [d for d in deliveries if d.job.id == job_id]
    result = {"status_code": 200, "body": {"object": "chat.completion", "choices": []}}
    await queue.finish(delivery, JobStatus.SUCCEEDED, result=result)


async def dead_letter(queue: Queue, *job_ids: str) -> None:
    """Take the jobs and fail them past their last attempt, in the order given."""
    deliveries, _ = await read_all(queue, "test-worker", 10)
    by_id = {d.job.id: d for d in deliveries}
    queue.settings = queue.settings.replace(max_attempts=1)
    for job_id in job_ids:
        await queue.retry(by_id[job_id], delay_ms=0, error={"type": "backend_error", "message": "boom"})


async def test_get_returns_the_job(client: httpx.AsyncClient) -> None:
    job_id = await submit(client)
    response = await client.get(f"/v1/jobs/{job_id}", headers=A)
    assert response.status_code == 200
    assert response.json()["id"] == job_id and response.json()["status"] == "queued"


@pytest.mark.parametrize("job_id", [UNKNOWN_ID, "nope", "job_" + "A" * 26, "job_x}:*"])
async def test_unknown_or_malformed_ids_are_404(client: httpx.AsyncClient, job_id: str) -> None:
    assert_envelope(await client.get(f"/v1/jobs/{job_id}", headers=A), 404, "not_found")


async def waits_registered(app: FastAPI, job_id: str) -> None:
    """Until the gateway's wait for the job is registered with its reader of terminal events (it holds the
    request)."""
    waiters = app.state.gateway.queue.waiters
    await eventually_async(lambda: waiters.waiting(job_id), what=f"the gateway's wait for {job_id}")


async def test_wait_returns_as_soon_as_the_job_completes(
    app: FastAPI, client: httpx.AsyncClient, queue: Queue
) -> None:
    job_id = await submit(client)
    waiting = asyncio.create_task(client.get(f"/v1/jobs/{job_id}", params={"wait": 20}, headers=A))
    await waits_registered(app, job_id)
    assert not waiting.done(), waiting.result().json()  # a queued job: the wait holds the request
    await complete(queue, job_id)
    # woken by the completion: the answer comes long before the wait's 20 s deadline (else this guard fails)
    response = await asyncio.wait_for(waiting, WOKEN_WITHIN_S)
    assert response.status_code == 200
    job = response.json()
    assert job["status"] == "succeeded"
    assert job["result"]["status_code"] == 200


async def test_wait_on_a_terminal_job_returns_at_once(client: httpx.AsyncClient, queue: Queue) -> None:
    job_id = await submit(client)
    await complete(queue, job_id)
    # nothing to wait for: answered long before the wait's 20 s deadline (else this guard fails)
    response = await asyncio.wait_for(client.get(f"/v1/jobs/{job_id}", params={"wait": 20}, headers=A),
                                      WOKEN_WITHIN_S)
    assert response.json()["status"] == "succeeded"


async def test_wait_ends_at_its_deadline_with_the_job_as_it_is(app: FastAPI, client: httpx.AsyncClient) -> None:
    job_id = await submit(client)
    waiting = asyncio.create_task(client.get(f"/v1/jobs/{job_id}", params={"wait": 1}, headers=A))
    await waits_registered(app, job_id)
    assert not waiting.done(), waiting.result().json()  # it waits, though the job will not end
    response = await asyncio.wait_for(waiting, WOKEN_WITHIN_S)  # and then answers: it does not hang
    assert response.status_code == 200 and response.json()["status"] == "queued"


@pytest.mark.parametrize("wait", ["-1", "21", "soon", "nan", "inf"])
async def test_wait_out_of_range_is_422(client: httpx.AsyncClient, wait: str) -> None:
    job_id = await submit(client)
    assert_envelope(await client.get(f"/v1/jobs/{job_id}", params={"wait": wait}, headers=A), 422)


async def test_cancel_a_queued_job_then_cancel_again_is_409_with_the_job(
    client: httpx.AsyncClient, queue: Queue
) -> None:
    job_id = await submit(client)
    response = await client.post(f"/v1/jobs/{job_id}/cancel", headers=A)
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert response.json()["error"]["type"] == "cancelled"
    again = await client.post(f"/v1/jobs/{job_id}/cancel", headers=A)
    data = assert_envelope_with_job(again)
    assert data["job"]["id"] == job_id and data["job"]["status"] == "cancelled"
    assert await queue.redis.xlen(queue.keys.stream) == 0


def assert_envelope_with_job(response: httpx.Response) -> dict:
    assert response.status_code == 409, response.text
    data = response.json()
    assert set(data) == {"error", "job"}
    assert data["error"]["type"] == "job_terminal"
    return data


async def test_cancel_a_running_job_requests_cancellation(client: httpx.AsyncClient, queue: Queue) -> None:
    job_id = await submit(client)
    await queue.read("test-worker", 10)
    response = await client.post(f"/v1/jobs/{job_id}/cancel", headers=A)
    assert response.status_code == 200
    assert response.json()["status"] == "running"
    assert (await queue.get(job_id)).cancel_requested  # type: ignore[union-attr]


async def test_cancel_unknown_is_404(client: httpx.AsyncClient) -> None:
    assert_envelope(await client.post(f"/v1/jobs/{UNKNOWN_ID}/cancel", headers=A), 404)


async def test_dead_letters_are_listed_newest_first_and_redriven(client: httpx.AsyncClient, queue: Queue) -> None:
    first, second = await submit(client), await submit(client)
    await dead_letter(queue, first, second)
    listed = await client.get("/v1/dlq", headers=A)
    assert listed.status_code == 200
    body = listed.json()
    assert body["object"] == "list"
    assert [j["id"] for j in body["data"]] == [second, first]
    assert all(j["dead_lettered"] and j["status"] == "failed" for j in body["data"])
    assert [j["id"] for j in (await client.get("/v1/dlq", params={"limit": 1}, headers=A)).json()["data"]] == [second]

    redriven = await client.post(f"/v1/dlq/{first}/redrive", headers=A)
    assert redriven.status_code == 202
    assert redriven.headers["location"] == f"/v1/jobs/{first}"
    job = redriven.json()
    assert (job["status"], job["attempts"], job["dead_lettered"], job["error"]) == ("queued", 1, False, None)
    assert [j["id"] for j in (await client.get("/v1/dlq", headers=A)).json()["data"]] == [second]
    assert_envelope(await client.post(f"/v1/dlq/{first}/redrive", headers=A), 409, "not_dead_lettered")
    assert_envelope(await client.post(f"/v1/dlq/{UNKNOWN_ID}/redrive", headers=A), 404)


@pytest.mark.parametrize("limit", ["0", "1001", "x"])
async def test_dlq_limit_out_of_range_is_422(client: httpx.AsyncClient, limit: str) -> None:
    assert_envelope(await client.get("/v1/dlq", params={"limit": limit}, headers=A), 422)


async def test_another_tenants_job_is_404_everywhere(client: httpx.AsyncClient, queue: Queue) -> None:
    mine = await submit(client, A)
    theirs = await submit(client, B)
    await dead_letter(queue, theirs)
    assert_envelope(await client.get(f"/v1/jobs/{theirs}", headers=A), 404)
    assert_envelope(await client.get(f"/v1/jobs/{theirs}", params={"wait": 1}, headers=A), 404)
    assert_envelope(await client.post(f"/v1/jobs/{theirs}/cancel", headers=A), 404)
    assert_envelope(await client.post(f"/v1/dlq/{theirs}/redrive", headers=A), 404)
    assert (await client.get("/v1/dlq", headers=A)).json()["data"] == []
    assert [j["id"] for j in (await client.get("/v1/dlq", headers=B)).json()["data"]] == [theirs]
    assert_envelope(await client.get(f"/v1/jobs/{mine}", headers=B), 404)
    assert (await queue.get(theirs)).dead_lettered  # type: ignore[union-attr]  # untouched by A's attempts


async def test_scale_has_exactly_the_contract_shape(client: httpx.AsyncClient, queue: Queue) -> None:
    empty = (await client.get("/v1/scale", headers=A)).json()
    assert empty == {"lag": 0, "pending": 0, "unfinished": 0, "dlq": 0, "workers": 0, "desired": None,
                     "decision": {"reason": None, "at": None}}
    for _ in range(3):
        await submit(client)
    await queue.read("w1", 1)
    await queue.heartbeat("w1", 1)
    await queue.record_decision(2, "scale_up", at=1764400000.5)
    response = await client.get("/v1/scale", headers=A)
    assert response.status_code == 200
    assert response.json() == {"lag": 2, "pending": 1, "unfinished": 3, "dlq": 0, "workers": 1, "desired": 2,
                               "decision": {"reason": "scale_up", "at": 1764400000.5}}


async def test_every_v1_route_needs_a_key(client: httpx.AsyncClient) -> None:
    for method, path in [("GET", f"/v1/jobs/{UNKNOWN_ID}"), ("POST", f"/v1/jobs/{UNKNOWN_ID}/cancel"),
                         ("GET", "/v1/dlq"), ("POST", f"/v1/dlq/{UNKNOWN_ID}/redrive"), ("GET", "/v1/scale")]:
        assert_envelope(await client.request(method, path), 401, "unauthorized")


async def test_health_needs_no_key_and_ready_checks_redis(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}


async def test_unknown_routes_are_404_and_wrong_methods_405_in_the_envelope(client: httpx.AsyncClient) -> None:
    assert_envelope(await client.get("/v2/jobs", headers=A), 404, "not_found")
    assert_envelope(await client.post("/v1/jobs/", json=CHAT, headers=A), 404, "not_found")
    response = await client.delete("/v1/jobs", headers=A)
    assert_envelope(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"


async def test_responses_carry_a_request_id(client: httpx.AsyncClient) -> None:
    given = await client.get("/healthz", headers={"x-request-id": "req-123"})
    assert given.headers["x-request-id"] == "req-123"
    fresh = await client.get("/healthz", headers={"x-request-id": "bad id with spaces"})
    assert len(fresh.headers["x-request-id"]) == 32


async def test_two_apps_on_one_queue_see_the_same_jobs(
    make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    # Stateless gateway: a job accepted by one Lambda sandbox is read by another.
    one, two = open_client(make_app()), open_client(make_app())
    job_id = await submit(one)
    assert (await two.get(f"/v1/jobs/{job_id}", headers=A)).json()["id"] == job_id
