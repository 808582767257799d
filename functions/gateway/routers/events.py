"""``GET /v1/events``: the results feed (docs/api.md), read by :mod:`inferq.queue.feed`.

The cursor is opaque: each queue's stream position (one queue, or one per model with a model registry) sealed for
the tenant (:func:`~inferq.queue.feed.seal`), so it reveals nothing about other tenants and works for its tenant only.
With
a registry a page holds each model's jobs in the order they ended, models in the registry's order; a model the page
had no room for keeps its position, so a cursor is always accepted back as it was given."""

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from inferq.queue import feed

from ..dependencies import GatewayDep, Tenant
from ..errors import ApiError
from ..openapi import documented
from ..request_schemas import MAX_WAIT_S
from ..waits import wait_responses, wait_slot

router = APIRouter()

BAD_CURSOR = "after: must be a cursor this endpoint returned to this key"


@router.get("/v1/events", summary="The tenant's terminal jobs in the order they ended", response_model=None,
            responses={**documented("A page of job objects with its cursor", 400, 401, 413, 422, 503),
                       **wait_responses()})
async def events(
    gw: GatewayDep,
    tenant: Tenant,
    after: Annotated[str | None, Query(max_length=8192, description="The `cursor` of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many jobs")] = 100,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="Seconds to wait for one")] = 0,
) -> JSONResponse:
    queues = gw.all_queues()
    names = [q.keys.queue for q in queues]
    key = await gw.call(feed.cursor_key(gw.queue))
    positions: dict[str, str | None] = dict.fromkeys(names)
    if after is not None:
        given = feed.unseal(key, tenant, after)
        if given is None:
            # Redis may have lost the key and another gateway made a new one: read it again once
            key = await gw.call(feed.cursor_key(gw.queue, fresh=True))
            given = feed.unseal(key, tenant, after)
        if given is None:
            raise ApiError(422, BAD_CURSOR, type_="invalid_cursor")
        # a queue the registry no longer has is dropped; one added since starts from the retention floor
        positions.update({name: given[name] for name in names if name in given})
    async with wait_slot(gw, tenant, wait):  # INFERQ_TENANT_MAX_WAITS: 429 past it
        jobs, has_more = await gw.call(_read(queues, tenant, positions, limit, wait), extra_s=wait)
    # a claimed result by URL: a page of up to 1,000 jobs must not inline up to 1,000 large results
    return JSONResponse({"object": "list", "data": [gw.claim_check.by_url(job) for job in jobs],
                         "cursor": feed.seal(key, tenant, positions), "has_more": has_more})


POLL_S = 0.25
"""How often a wait over several models' streams looks again (their streams may live on different cluster nodes,
so one blocking read cannot watch them all)."""


async def _read(queues: list[Any], tenant: str, positions: dict[str, str | None], limit: int,
                wait_s: float) -> tuple[list[Any], bool]:
    """Up to ``limit`` jobs from the queues in order, moving ``positions`` to where each read stopped (a queue not
    read keeps its position)."""
    if len(queues) == 1:
        name = queues[0].keys.queue
        page = await feed.read(queues[0], tenant, positions[name], limit, wait_s)
        positions[name] = page.cursor
        return page.jobs, page.has_more
    deadline = time.monotonic() + wait_s
    while True:
        jobs: list[Any] = []
        has_more = False
        for queue in queues:
            if len(jobs) == limit:
                has_more = True
                break
            name = queue.keys.queue
            page = await feed.read(queue, tenant, positions[name], limit - len(jobs))
            jobs.extend(page.jobs)
            positions[name] = page.cursor
            has_more = has_more or page.has_more
        remaining = deadline - time.monotonic()
        if jobs or has_more or remaining <= 0.01:
            return jobs, has_more
        await asyncio.sleep(min(POLL_S, remaining))
