"""The tenant's webhook signing secret (docs/api.md, "Webhooks"): ``GET /v1/webhooks/secret`` answers it (made on
first use), ``POST /v1/webhooks/secret/rotate`` replaces it, the replaced one signing too for a while. The secret is
the calling key's tenant's, never another's; the store is :mod:`inferq.webhooks.tenant_secrets`."""

from typing import Annotated, Any

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from inferq.webhooks.envelope import SecretsUnavailable
from inferq.webhooks.tenant_secrets import (
    KEEP_PREVIOUS_S,
    MAX_KEEP_PREVIOUS_S,
    TenantSecret,
    rotate_secret,
    tenant_secret,
)

from ..dependencies import GatewayDep, Tenant
from ..errors import ApiError
from ..gateway import Gateway
from ..openapi import documented

router = APIRouter()

NO_STORE = {"Cache-Control": "no-store"}
"""A secret is never kept by a cache on the way."""


class SecretRotate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keep_previous_s: int = Field(
        default=KEEP_PREVIOUS_S, ge=0, le=MAX_KEEP_PREVIOUS_S,
        description="How long the replaced secret keeps signing deliveries beside the new one (0: not at all)",
    )


def _answer(secret: TenantSecret) -> JSONResponse:
    return JSONResponse(secret.to_api(), headers=NO_STORE)


async def _secret(gw: Gateway, call: Any) -> TenantSecret:
    """The secret, sealed and opened with the secrets key (``INFERQ_WEBHOOK_SECRETS_KEY``): KMS not answering is a
    503 to retry, as Redis's is."""
    try:
        secret: TenantSecret = await gw.call(call)
    except SecretsUnavailable:
        raise ApiError(503, "the webhook secrets key cannot be used right now; retry later",
                       headers={"Retry-After": "2"}) from None
    return secret


@router.get("/v1/webhooks/secret", summary="The tenant's webhook signing secret", response_model=None,
            responses=documented("The secret (`whsec_…`), and the replaced one while it still signs",
                                 400, 401, 413, 422, 503))
async def get_secret(gw: GatewayDep, tenant: Tenant) -> JSONResponse:
    return _answer(await _secret(gw, tenant_secret(gw.queue, tenant)))


@router.post("/v1/webhooks/secret/rotate", summary="Replace the tenant's webhook signing secret",
             response_model=None,
             responses=documented("The new secret, and the replaced one with when it stops signing",
                                  400, 401, 413, 422, 503))
async def rotate(gw: GatewayDep, tenant: Tenant,
                 payload: Annotated[SecretRotate | None, Body()] = None) -> JSONResponse:
    keep = (payload or SecretRotate()).keep_previous_s
    return _answer(await _secret(gw, rotate_secret(gw.queue, tenant, keep)))
