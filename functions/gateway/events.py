"""``GET /v1/events``: the results feed (docs/api.md), read by :mod:`inferq.feed`."""

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
        after: Annotated[str | None, Query(max_length=64, description="The `cursor` of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=1000, description="At most this many jobs")] = 100,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="Seconds to wait for one")] = 0,
    ) -> JSONResponse:
        if after is not None and not feed.CURSOR_RE.match(after):
            raise ApiError(422, "after: must be a cursor returned by this endpoint")
        page = await gw.call(feed.read(gw.queue, tenant, after, limit, wait), extra_s=wait)
        # a claimed result by URL: a page of up to 1,000 jobs must not inline up to 1,000 large results
        return JSONResponse({"object": "list", "data": [gw.claims.by_url(job) for job in page.jobs],
                             "cursor": page.cursor, "has_more": page.has_more})
