"""What operators and load balancers read: the scaler's view of a queue (operator keys only) and the health
checks (no key)."""

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from inferq.config.registry import ALIAS_RE

from ..dependencies import GatewayDep, Tenant
from ..errors import ApiError
from ..openapi import doc, errors
from ..responses import JSONResponse

router = APIRouter()


@router.get(
    "/v1/scale",
    summary="The scaler's view of the queue",
    response_model=None,
    responses={200: doc("ScaleView", "Queue depth, workers and the last decision"),
               **errors(400, 401, 403, 404, 413, 422, 503)},
)
async def scale(
    request: Request,
    gw: GatewayDep,
    tenant: Tenant,
    model: Annotated[str | None, Query(pattern=ALIAS_RE.pattern, description=(
        "A model's name or alias (a model registry): that model's queue; default: the default model's"))] = None,
    by_tenant: Annotated[bool, Query(description=(
        "Also `waiting`: each tenant's jobs waiting for their turn (fair share), per lane"))] = False,
) -> JSONResponse:
    gw.require_admin(tenant)  # queue-wide numbers: operators only
    if len(request.query_params.getlist("model")) > 1:  # FastAPI would take the last one silently
        raise ApiError(422, "model: give one model")
    queue = gw.queue if model is None else gw.model_queue(model)  # unknown: 404 model_not_found
    seen = await gw.call(queue.observe(by_tenant=by_tenant))
    view: dict[str, Any] = {
        "lag": seen.lag,
        "pending": seen.pending,
        "unfinished": seen.unfinished,
        "dlq": seen.dlq,
        "workers": seen.workers,
        "desired": seen.desired,
        "decision": {"reason": seen.reason or None, "at": seen.decided_at},
    }
    if by_tenant:  # fair share (G10): each tenant's jobs waiting for their turn; the contract's shape without it
        view["waiting"] = seen.waiting_json()
    return JSONResponse(view)


@router.get("/healthz", summary="Liveness (no auth)", response_model=None,
            responses={200: doc("Health", "The process answers"), **errors(400, 413)})
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get(
    "/readyz",
    summary="Readiness: Redis, and S3 where a files bucket is set, answer (no auth)",
    response_model=None,
    responses={200: doc("Health", "Ready"), **errors(400, 413, 503)},
)
async def readyz(gw: GatewayDep) -> JSONResponse:
    await gw.call(gw.queue.ping())
    if gw.settings.files_bucket:  # every store the gateway needs: a missing bucket is not ready either
        from ..files import file_store, in_s3

        await in_s3(file_store(gw).ready)
    return JSONResponse({"status": "ready"})
