"""Every route that can wait takes a long-poll slot of its tenant's for as long as it waits
(``INFERQ_TENANT_MAX_WAITS``, :mod:`inferq.queue.waitslots`); past the limit it answers 429 ``rate_limited`` with
``Retry-After`` at once. A wait of 0 takes no slot.

Two ways to take one, the same slot either way:

- :func:`wait_slot`, an async context manager, around the part of a route that waits::

      async with wait_slot(gw, tenant, wait):
          job = await gw.call(queue.wait(...), extra_s=wait)

  (the job routes, their hot path and the feed use it; a streaming answer holds it inside its body's generator,
  so the slot lasts as long as the stream does);
- :data:`Wait`, a FastAPI dependency (:func:`held_wait`) that declares the ``wait`` query parameter itself and
  hands the route its value with a slot held until the answer is sent::

      async def get_thing(gw: GatewayDep, tenant: Tenant, wait: Wait) -> JSONResponse: ...

(No ``from __future__ import annotations`` here: FastAPI reads the dependency's annotations at run time.)
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Query

from inferq.queue.waitslots import WaitsFull, WaitSlots

from .dependencies import GatewayDep, Tenant
from .errors import ApiError
from .openapi import doc
from .request_schemas import MAX_WAIT_S

if TYPE_CHECKING:
    from .gateway import Gateway

__all__ = ["Wait", "held_wait", "wait_responses", "wait_slot", "wait_slots"]


def wait_responses() -> dict[int | str, dict[str, Any]]:
    """The OpenAPI answer of a route that waits when its tenant holds all its waits."""
    return {429: doc("ErrorEnvelope", "The key holds INFERQ_TENANT_MAX_WAITS waits already (or reached its rate "
                                      "limit, INFERQ_RATE_LIMIT_PER_S)", **{"Retry-After": "Seconds to wait"})}


def wait_slots(gw: "Gateway") -> WaitSlots:
    """The gateway's slots, on its primary queue. A slot outlasts its wait by twice the bound of one Redis call:
    the take before the wait and the give-back after it fit in that."""
    return WaitSlots(gw.queue, gw.settings.tenant_max_waits, margin_s=2 * gw.op_timeout_s)


@asynccontextmanager
async def wait_slot(gw: "Gateway", tenant: str, wait_s: float) -> AsyncIterator[None]:
    """Hold one of ``tenant``'s slots for the body (none for a wait of 0, or with no limit set): 429
    ``rate_limited`` with ``Retry-After`` when it holds all of them. The slot is given back however the body ends."""
    if wait_s <= 0 or gw.settings.tenant_max_waits <= 0:
        yield
        return
    slots = wait_slots(gw)
    try:
        token = await gw.call(slots.take(tenant, wait_s))
    except WaitsFull as exc:
        raise ApiError(
            429, f"this key has {exc.limit} waits running, its limit (INFERQ_TENANT_MAX_WAITS); retry when one "
                 "ends, or ask without wait", type_="rate_limited", headers={"Retry-After": exc.retry_after},
        ) from None
    try:
        yield
    finally:
        if token is not None:  # always one here (a wait, a limit): the type says it may not be
            await slots.give(tenant, token)


async def held_wait(
    gw: GatewayDep,
    tenant: Tenant,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="Seconds to wait (a long-poll slot of the key's "
                                                                  "is held meanwhile)")] = 0,
) -> AsyncIterator[float]:
    """A FastAPI dependency (see the module's docstring): the ``wait`` query parameter (0-20 s), with a slot held
    from before the route runs until its answer is sent."""
    async with wait_slot(gw, tenant, wait):
        yield wait


Wait = Annotated[float, Depends(held_wait)]
