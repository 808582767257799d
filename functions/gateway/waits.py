"""Every route that can wait takes a long-poll slot of its tenant's for as long as it waits
(``INFERQ_TENANT_MAX_WAITS``, :mod:`inferq.queue.waitslots`); past the limit it answers 429 ``rate_limited`` with
``Retry-After`` at once. A wait of 0 takes no slot.

Two ways to take one, the same slot either way:

- :func:`wait_slot`, an async context manager, around the part of a route that waits::

      async with wait_slot(gw, tenant, wait):
          job = await gw.call(queue.wait(...), extra_s=wait)

  (the job routes, their hot path and the feed use it; a streaming answer holds it inside its body's generator,
  so the slot lasts as long as the stream does);
- :data:`.dependencies.Wait`, a FastAPI dependency that declares the ``wait`` query parameter itself and hands the
  route its value with a slot held until the answer is sent::

      async def get_thing(gw: GatewayDep, tenant: Tenant, wait: Wait) -> JSONResponse: ...
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from inferq.queue.waitslots import WaitsFull, WaitSlots

from .errors import ApiError
from .openapi import doc

if TYPE_CHECKING:
    from .gateway import Gateway

__all__ = ["wait_responses", "wait_slot", "wait_slots"]


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
