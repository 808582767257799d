"""``GET /v1/usage`` (docs/api.md): the caller's metered usage for chargeback, per model and lane, over a range of
whole hours (default: the last 24 hours). Operators (``INFERQ_ADMIN_TENANTS``) may read another tenant's
(``tenant=NAME``) or every tenant's (``tenant=*``), and see the estimated cost; anyone else asking for another
tenant's is 403 ``operator_only``. The reading and summing is :mod:`inferq.usage.report`."""

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from inferq.queue.keys import TENANT, TENANT_RULE
from inferq.usage.periods import DAY_S, HOUR_S
from inferq.usage.report import usage

from ..dependencies import GatewayDep, Tenant
from ..errors import ApiError
from ..metering import sources
from ..openapi import errors

DEFAULT_RANGE_S = DAY_S
EVERY_TENANT = "*"

router = APIRouter(tags=["usage"])

_USAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["object", "tenant", "start", "end", "data"],
    "properties": {
        "object": {"const": "usage"},
        "tenant": {"type": "string", "description": "The tenant read, or `*` for every tenant"},
        "start": {"type": "integer", "description": "Unix seconds"},
        "end": {"type": "integer", "description": "Unix seconds"},
        "data": {"type": "array", "items": {
            "type": "object",
            "required": ["model", "lane", "jobs", "prompt_tokens", "completion_tokens", "run_seconds", "gpu_seconds"],
            "properties": {
                "tenant": {"type": "string", "description": "With `tenant=*` only"},
                "start": {"type": "integer", "description": "The bucket's start, with `bucket` only"},
                "model": {"type": "string"},
                "lane": {"enum": ["high", "normal", "low"]},
                "jobs": {"type": "object", "properties": {s: {"type": "integer"} for s in
                                                          ("succeeded", "failed", "cancelled", "expired")}},
                "prompt_tokens": {"type": "integer"},
                "completion_tokens": {"type": "integer"},
                "run_seconds": {"type": "number", "description": "The attempts' run time"},
                "gpu_seconds": {"type": "number",
                                "description": "The tenant's share of its workers' busy time (times their GPUs)"},
                "estimated_cost_usd": {"type": "number", "description": "Operators only: GPU-seconds at the model's "
                                                                       "price per GPU-hour"},
                "usd_per_million_tokens": {"type": ["number", "null"], "description": "Operators only"},
            },
        }},
    },
}


@router.get(
    "/v1/usage",
    summary="Metered usage (jobs, tokens, run and GPU seconds) per model and lane, for chargeback",
    response_model=None,
    responses={
        200: {"description": "Every job counted once, when it ended, in hourly buckets",
              "content": {"application/json": {"schema": _USAGE_SCHEMA}}},
        **errors(400, 401, 403, 413, 422, 503),
    },
)
async def get_usage(
    gw: GatewayDep,
    tenant: Tenant,
    start: Annotated[int | None, Query(ge=0, description="Unix seconds (default: `end` less 24 hours); the hour it "
                                                         "falls in is counted whole")] = None,
    end: Annotated[int | None, Query(ge=0, description="Unix seconds, exclusive (default: now)")] = None,
    of: Annotated[str | None, Query(alias="tenant", description="Operators only: another tenant's name, or `*` "
                                                                "for every tenant (each row then names its tenant)")]
    = None,
    bucket: Annotated[Literal["hour", "day"] | None,
                      Query(description="Rows per hour or per UTC day of the range too, each with its `start`")] = None,
) -> JSONResponse:
    settings = gw.settings
    now = int(time.time())
    end = now if end is None else end
    start = end - DEFAULT_RANGE_S if start is None else start
    if start >= end:
        raise ApiError(422, f"start ({start}) must be before end ({end})")
    who = tenant if of is None else of
    if who != tenant:
        if who != EVERY_TENANT and not TENANT.match(who):
            raise ApiError(422, f"tenant must be {TENANT_RULE}, or * for every tenant")
        if not settings.reads_usage_of_others(tenant):
            raise ApiError(403, "another tenant's usage is for operator keys only (INFERQ_ADMIN_TENANTS)",
                           type_="operator_only")
    # nothing is kept before the retention nor written after now: the hours read are bounded whatever is asked
    kept_from = now - settings.usage_retention_days * DAY_S - HOUR_S
    rows = [] if settings.usage_retention_days <= 0 or max(start, kept_from) >= min(end, now + HOUR_S) else \
        await gw.call(usage(sources(gw), max(start, kept_from), min(end, now + HOUR_S),
                            tenant=None if who == EVERY_TENANT else who, width=bucket))
    with_cost = settings.is_admin(tenant)
    data = [row.to_api(with_tenant=who == EVERY_TENANT, with_cost=with_cost) for row in rows]
    return JSONResponse({"object": "usage", "tenant": who, "start": start, "end": end, "data": data})
