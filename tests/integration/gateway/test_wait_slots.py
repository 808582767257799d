"""Concurrent long polls are bounded per tenant (``INFERQ_TENANT_MAX_WAITS``, functions/gateway/waits.py): past the
limit a wait answers 429 ``rate_limited`` with ``Retry-After`` at once, on every route that can wait (the job's
wait through the hot path and through the full stack, the results feed, a route built on the dependency), while
another tenant's waits are not counted; a wait of 0 takes no slot, and every slot is given back when its wait
ends."""

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from functions.gateway.dependencies import Wait
from inferq.queue.protocol import Queue

from .conftest import AppFactory
from .support import A, B
from .test_jobs import submit
from .test_submit import assert_envelope

GUARD_S = 30.0
"""A guard against a hang, not a measurement: every wait here ends on an event long before it."""


async def refused_at_once(requests: list[Awaitable[httpx.Response]], refused: int
                          ) -> tuple[list[httpx.Response], set[asyncio.Task[httpx.Response]]]:
    """Start the requests together; the answers of the first ``refused`` to end, and the ones still waiting."""
    pending = {asyncio.ensure_future(r) for r in requests}
    answered: list[httpx.Response] = []
    async with asyncio.timeout(GUARD_S):
        while len(answered) < refused:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            answered += [task.result() for task in done]
    return answered, pending


def assert_refused(response: httpx.Response) -> None:
    assert_envelope(response, 429, "rate_limited")
    assert "INFERQ_TENANT_MAX_WAITS" in response.json()["error"]["message"]
    assert 1 <= int(response.headers["Retry-After"]) <= 20


@pytest.mark.parametrize("hot", [True, False], ids=["hot-path", "full-stack"])
async def test_six_waits_of_one_tenant_at_a_limit_of_three_refuse_three_at_once_and_spare_another_tenant(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue, hot: bool
) -> None:
    app = make_app(tenant_max_waits=3)
    app.hot_paths = hot  # type: ignore[attr-defined]
    client = open_client(app)
    job_id = await submit(client)
    waits = [client.get(f"/v1/jobs/{job_id}?wait=20", headers=A) for _ in range(6)]
    answered, waiting = await refused_at_once(waits, refused=3)
    assert len(answered) == 3 and len(waiting) == 3
    for response in answered:
        assert_refused(response)
    # another tenant's wait is not counted against the first's slots
    other = await submit(client, B)
    theirs = asyncio.ensure_future(client.get(f"/v1/jobs/{other}?wait=20", headers=B))
    assert (await client.post(f"/v1/jobs/{other}/cancel", headers=B)).status_code == 200
    assert (await theirs).json()["status"] == "cancelled"
    # a wait of 0 takes no slot: answered while the three slots are held
    assert (await client.get(f"/v1/jobs/{job_id}?wait=0", headers=A)).json()["status"] == "queued"
    assert (await client.get(f"/v1/jobs/{job_id}", headers=A)).status_code == 200
    # the job ends: the three waits answer, and give their slots back
    assert (await client.post(f"/v1/jobs/{job_id}/cancel", headers=A)).status_code == 200
    async with asyncio.timeout(GUARD_S):
        for task in waiting:
            assert (await task).json()["status"] == "cancelled"
    assert await queue.redis.zcard(queue.keys.waits("tenant-a")) == 0
    assert (await client.get(f"/v1/jobs/{job_id}?wait=1", headers=A)).status_code == 200


async def test_the_results_feed_takes_a_slot_while_it_waits(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    client = open_client(make_app(tenant_max_waits=1))
    job_id = await submit(client)
    feed = asyncio.ensure_future(client.get("/v1/events?wait=20", headers=A))
    answered, waiting = await refused_at_once([client.get(f"/v1/jobs/{job_id}?wait=20", headers=A)], refused=1)
    assert_refused(answered[0])
    assert not waiting and not feed.done()
    assert (await client.post(f"/v1/jobs/{job_id}/cancel", headers=A)).status_code == 200
    async with asyncio.timeout(GUARD_S):
        assert [job["id"] for job in (await feed).json()["data"]] == [job_id]
    assert await queue.redis.zcard(queue.keys.waits("tenant-a")) == 0


async def test_a_route_built_on_the_dependency_holds_a_slot_until_it_has_answered(
    make_app: AppFactory, open_client: Callable[[FastAPI], httpx.AsyncClient], queue: Queue
) -> None:
    app = make_app(tenant_max_waits=1)
    release = asyncio.Event()

    @app.get("/test/wait")
    async def waiting(wait: Wait) -> JSONResponse:
        await release.wait()  # a wait that lasts until the test ends it
        return JSONResponse({"waited": wait})

    client = open_client(app)
    first = asyncio.ensure_future(client.get("/test/wait?wait=5", headers=A))
    async with asyncio.timeout(GUARD_S):  # the first holds the slot before the second asks (not a race to Redis)
        while await queue.redis.zcard(queue.keys.waits("tenant-a")) != 1:
            await asyncio.sleep(0.01)
    answered, _ = await refused_at_once([client.get("/test/wait?wait=5", headers=A)], refused=1)
    assert_refused(answered[0])
    assert not first.done()
    release.set()
    async with asyncio.timeout(GUARD_S):
        assert (await first).json() == {"waited": 5.0}
    assert (await client.get("/test/wait?wait=0", headers=A)).json() == {"waited": 0.0}
    assert await queue.redis.zcard(queue.keys.waits("tenant-a")) == 0
