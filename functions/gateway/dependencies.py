"""What the routers' handlers ask FastAPI to give them: the app's :class:`~.gateway.Gateway` (:data:`GatewayDep`),
the calling key's tenant (:data:`Tenant`: authentication, which runs before the body is parsed, so an
unauthenticated caller learns nothing about validation), and a long poll's ``wait`` with one of the tenant's wait
slots held until the answer is sent (:data:`Wait`, :mod:`.waits`). The two security schemes documented in OpenAPI are
declared here; the hot path reads the same headers itself (:meth:`.gateway.Gateway.tenant_from`)."""

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Query, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from .gateway import Gateway
from .request_schemas import MAX_WAIT_S
from .waits import wait_slot

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <key>`")
_api_key = APIKeyHeader(name="x-api-key", auto_error=False, description="`x-api-key: <key>`")


async def gateway(request: Request) -> Gateway:
    """The gateway of the app serving the request (:func:`.api.create_app` puts it in the app's state). A coroutine
    although it never waits: FastAPI runs a plain function dependency in its thread pool, a thread hop per request."""
    return _gateway_of(request)


def _gateway_of(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


async def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
    api_key: Annotated[str | None, Security(_api_key)],
) -> str:
    """The tenant of the key in ``Authorization: Bearer`` or ``x-api-key`` (401 without a known one; 429 past the
    tenant's rate limit)."""
    key = credentials.credentials if credentials is not None else api_key
    return await _gateway_of(request).tenant_of_key(request.scope.setdefault("state", {}), key)


GatewayDep = Annotated[Gateway, Depends(gateway)]
Tenant = Annotated[str, Depends(authenticate)]


async def held_wait(
    gw: GatewayDep,
    tenant: Tenant,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="Seconds to wait (a long-poll slot of the key's "
                                                                  "is held meanwhile)")] = 0,
) -> AsyncIterator[float]:
    """The ``wait`` query parameter (0-20 s), with a slot of the tenant's held from before the route runs until
    its answer is sent (``INFERQ_TENANT_MAX_WAITS``: 429 past it)."""
    async with wait_slot(gw, tenant, wait):
        yield wait


Wait = Annotated[float, Depends(held_wait)]
