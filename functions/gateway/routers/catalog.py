"""``GET /v1/models`` (docs/models.md): the models this gateway serves, in OpenAI's list format, each with its
fleet's state in an ``inferq`` object. Without a registry, one entry: the single queue.

The fleet's numbers (desired and running workers, lag, pending) are queue-wide, so only an operator
(``INFERQ_ADMIN_TENANTS``) sees them; any other tenant gets them as null and its own unfinished jobs instead."""

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from inferq.queue.protocol import Observation, Queue

from ..dependencies import GatewayDep, Tenant
from ..openapi import documented

router = APIRouter()


def _entry(model_id: str, created: int, queue: Queue, seen: Observation, by_tenant: bool) -> dict[str, Any]:
    fleet: dict[str, Any] = {
        "queue": queue.settings.queue,
        "desired": seen.desired,  # the scaler's last decision (None before its first)
        "running": seen.workers,  # workers with a live heartbeat
        "lag": seen.lag,
        "pending": seen.pending,
    }
    if by_tenant:  # fair share (G10): each tenant's jobs waiting for their turn, all lanes together
        fleet["waiting"] = {tenant: sum(lanes.values()) for tenant, lanes in seen.waiting_by_tenant.items()}
    return {"id": model_id, "object": "model", "created": created, "owned_by": "inferq", "inferq": fleet}


def _tenant_entry(model_id: str, created: int, queue: Queue, unfinished: Any) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "inferq",
        "inferq": {"queue": queue.settings.queue, "desired": None, "running": None, "lag": None, "pending": None,
                   "unfinished": int(unfinished or 0)},
    }


@router.get("/v1/models", summary="The models served, with each fleet's desired and running workers and depth",
            response_model=None, responses=documented("OpenAI's model list, each with an `inferq` object",
                                                      400, 401, 413, 422, 503))
async def list_models(gw: GatewayDep, tenant: Tenant, by_tenant: Annotated[bool, Query(description=(
        "Operators: also `inferq.waiting`, each tenant's jobs waiting for their turn (fair share)"))] = False,
                      ) -> JSONResponse:
    registry = gw.registry
    # OpenAI's `created`: when the model was added; here when its registry file was last written
    created = registry.created if registry is not None else 0
    ids = [m.name for m in registry.models] if registry is not None else [gw.settings.queue]
    queues = [gw.queues.get(m.queue) for m in registry.models] if registry is not None else [gw.queues.get(None)]
    if not gw.settings.is_admin(tenant):  # the tenant's own count only: nothing about the others' volume
        counts = await gw.call(asyncio.gather(*(q.redis.hget(q.keys.tenants, tenant) for q in queues)))
        data = [_tenant_entry(i, created, q, n) for i, q, n in zip(ids, queues, counts, strict=True)]
        return JSONResponse({"object": "list", "data": data})
    seen = await gw.call(asyncio.gather(*(queue.observe(by_tenant=by_tenant) for queue in queues)))
    data = [_entry(i, created, q, o, by_tenant) for i, q, o in zip(ids, queues, seen, strict=True)]
    return JSONResponse({"object": "list", "data": data})
