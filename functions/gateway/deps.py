"""What a router with module-level handlers asks FastAPI for: the app's :class:`~.shared.Gateway` and the caller's
tenant (authenticated as every route is: :meth:`.shared.Gateway.authenticate`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials

from .shared import _api_key, _bearer

if TYPE_CHECKING:
    from .shared import Gateway


def gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


async def _tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
    api_key: Annotated[str | None, Security(_api_key)],
) -> str:
    return await gateway(request).authenticate(request, credentials, api_key)


Tenant = Annotated[str, Depends(_tenant)]
"""The caller's tenant: 401 without a known key (both schemes documented in OpenAPI, as on every route)."""
