"""``GET /v1/events``: the results feed (docs/api.md), read by :mod:`inferq.feed`.

With a model registry each model's queue has its own events stream: the cursor is one stream cursor per queue, in
the registry's order, joined by ``.``; a page holds each model's jobs in the order they ended."""

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from inferq import feed

from .errors import ApiError
from .models import MAX_WAIT_S
from .openapi import documented


def routes(gw: Any, router: APIRouter) -> None:
    Tenant = Annotated[str, Depends(gw.authenticate)]

    @router.get("/v1/events", summary="The tenant's terminal jobs in the order they ended", response_model=None,
                responses=documented("A page of job objects with its cursor", 400, 401, 413, 422, 503))
    async def events(
        tenant: Tenant,
        after: Annotated[str | None, Query(max_length=2048, description="The `cursor` of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=1000, description="At most this many jobs")] = 100,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="Seconds to wait for one")] = 0,
    ) -> JSONResponse:
        queues = gw.all_queues()
        cursors: list[str | None] = [c for c in after.split(".")] if after is not None else [None] * len(queues)
        if after is not None and (len(cursors) != len(queues)
                                  or not all(c is not None and feed.CURSOR_RE.match(c) for c in cursors)):
            raise ApiError(422, "after: must be a cursor returned by this endpoint")
        if len(queues) == 1:
            page = await gw.call(feed.read(queues[0], tenant, after, limit, wait), extra_s=wait)
            jobs, cursor, has_more = page.jobs, page.cursor, page.has_more
        else:
            jobs, cursor, has_more = await gw.call(_merged(queues, tenant, cursors, limit, wait), extra_s=wait)
        # a claimed result by URL: a page of up to 1,000 jobs must not inline up to 1,000 large results
        return JSONResponse({"object": "list", "data": [gw.claims.by_url(job) for job in jobs], "cursor": cursor,
                             "has_more": has_more})


POLL_S = 0.25
"""How often a wait over several models' streams looks again (their streams may live on different cluster nodes,
so one blocking read cannot watch them all)."""


async def _merged(queues: list[Any], tenant: str, cursors: list[str | None], limit: int,
                  wait_s: float) -> tuple[list[Any], str, bool]:
    deadline = time.monotonic() + wait_s
    while True:
        jobs: list[Any] = []
        has_more = False
        for i, queue in enumerate(queues):
            if len(jobs) == limit:
                has_more = True
                break
            page = await feed.read(queue, tenant, cursors[i], limit - len(jobs))
            jobs.extend(page.jobs)
            cursors[i] = page.cursor
            has_more = has_more or page.has_more
        remaining = deadline - time.monotonic()
        if jobs or has_more or remaining <= 0.01:
            return jobs, ".".join(c or "" for c in cursors), has_more
        await asyncio.sleep(min(POLL_S, remaining))
