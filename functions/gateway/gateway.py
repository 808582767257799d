"""What every route of the gateway shares: :class:`Gateway` (settings, the lazily created queue clients, one per model
of the registry, the API keys, wake-up and telemetry) and the authentication every route runs first.

The routers (:mod:`.routers`) get it through :mod:`.dependencies`, the hot path from the app; the app is assembled
in :mod:`.api`, which includes the routers, and nothing here imports a router or the app.

Every Redis call is bounded twice: by the client's socket timeout (``INFERQ_REDIS_TIMEOUT_S``) and by a wall-clock
``asyncio.timeout`` of that plus one second around the whole call (retries included), so a frozen or unreachable
server is a prompt 503, never a hang (G8). Authentication runs before the body is parsed, so an unauthenticated
caller learns nothing about validation.
"""

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from fastapi import BackgroundTasks
from fastapi.security.utils import get_authorization_scheme_param

from inferq.config.registry import Registry, queue_of_job
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue

from .auth import KeyStore, StaticKeys
from .claim_check import ClaimCheck
from .clients import QueueProvider
from .errors import ApiError
from .telemetry import Telemetry
from .wake import WakeOnEnqueue

KEYS_TIMEOUT_S = 8.0


class Gateway:
    """What the routes share: settings, the lazily created queue clients (one per model of the registry), keys,
    wake-up and telemetry."""

    def __init__(
        self,
        settings: Settings,
        queues: QueueProvider,
        keys: KeyStore,
        wake: WakeOnEnqueue | Mapping[str, WakeOnEnqueue],
        telemetry: Telemetry,
    ) -> None:
        self.settings = settings
        self.queues = queues
        self.registry: Registry | None = queues.registry
        self.keys = keys
        self.wakes = dict(wake) if isinstance(wake, Mapping) else {queues.primary: wake}
        self.wake = self.wakes[queues.primary]
        self.telemetry = telemetry
        self.claim_check = ClaimCheck(settings)
        self.op_timeout_s = settings.redis_timeout_s + 1.0
        self._keys_in_memory = type(keys) is StaticKeys
        self.shared_waits = True
        """Long-poll waits share one reader of terminal events per queue (a long-lived process: uvicorn); the
        Lambda handler turns it off, since a frozen sandbox would stall a background reader (inferq.queue.waiters)."""
        self.streams = True
        """Answers may stream (uvicorn); the Lambda handler turns it off: API Gateway's HTTP API buffers a response
        whole, so a streamed answer is made whole once the job ends (functions/gateway/routers/completions.py)."""

    @property
    def queue(self) -> Queue:
        """The primary queue: the only one without a registry; what is not per model with one."""
        return self.queues.get()

    def all_queues(self) -> list[Queue]:
        return [self.queues.get(name) for name in self.queues.names()]

    def model_queue(self, requested: Any) -> Queue:
        """The queue of the model ``body.model`` names (a name or an alias; absent: the registry's default). Without
        a registry every job goes to the one queue, whatever it names."""
        if self.registry is None:
            return self.queue
        if requested is not None and not isinstance(requested, str):
            raise ApiError(422, "body.model: must be a string")
        model = self.registry.resolve(requested)
        if model is None:
            if requested is None:
                raise ApiError(422, "body.model: required (this gateway serves several models and has no default)")
            raise ApiError(404, f"the model {requested[:128]!r} does not exist; GET /v1/models lists them",
                           type_="model_not_found")
        return self.queues.get(model.queue)

    def job_queue(self, job_id: str) -> Queue:
        """The queue a job id names (a registry's ids carry it); 404 when no queue of this gateway has that name."""
        queue = queue_of_job(job_id)
        if queue is None:
            return self.queue
        if self.registry is None or self.registry.by_queue(queue) is None:
            raise ApiError(404, "no such job")
        return self.queues.get(queue)

    async def call(self, awaitable: Any, extra_s: float = 0.0) -> Any:
        """One queue operation under the wall-clock bound."""
        async with asyncio.timeout(self.op_timeout_s + extra_s):
            return await awaitable

    async def tenant_from(self, authorization: str | None, api_key: str | None, state: dict[str, Any]) -> str:
        """:func:`.dependencies.authenticate` without FastAPI's dependency machinery (the hot path): the key read
        from the raw headers exactly as ``HTTPBearer`` and ``APIKeyHeader`` (``auto_error=False``) read it."""
        scheme, credentials = get_authorization_scheme_param(authorization)
        if authorization and scheme and credentials and scheme.lower() == "bearer":
            return await self.tenant_of_key(state, credentials)
        return await self.tenant_of_key(state, api_key or None)

    async def tenant_of_key(self, state: dict[str, Any], key: str | None) -> str:
        """The tenant owning ``key`` (401 without one), noted in the request's ``state`` (the access log), its
        rate limit taken."""
        tenant = None
        if key:
            if self._keys_in_memory:
                tenant = await self.keys.tenant_for(key)  # never suspends: no timeout to arm
            else:
                async with asyncio.timeout(KEYS_TIMEOUT_S):  # a Secrets Manager read on a cold start takes a while
                    tenant = await self.keys.tenant_for(key)
        if tenant is None:
            raise ApiError(
                401,
                "missing or unknown API key (Authorization: Bearer <key> or x-api-key)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        state["tenant"] = tenant
        if self.settings.rate_limit_per_s > 0:
            await self._take_rate(tenant)
        return tenant

    async def _take_rate(self, tenant: str) -> None:
        """429 with ``Retry-After`` past the tenant's rate limit (counted in Redis: shared by every gateway)."""
        settings = self.settings
        wait_s = await self.call(self.queue.take_rate(tenant, settings.rate_limit_per_s, settings.rate_limit_burst))
        if wait_s > 0:
            raise ApiError(429, f"rate limit of {settings.rate_limit_per_s:g} requests per second reached; retry "
                           f"in {wait_s:.3f} s", type_="rate_limited",
                           headers={"Retry-After": str(max(1, math.ceil(wait_s)))})

    def require_admin(self, tenant: str) -> None:
        """403 unless ``tenant`` is an operator (``INFERQ_ADMIN_TENANTS``): queue-wide numbers tell one tenant how
        busy the others are."""
        if not self.settings.is_admin(tenant):
            raise ApiError(403, "queue-wide numbers are for operator keys only (INFERQ_ADMIN_TENANTS)",
                           type_="operator_only")

    def wake_check(self, queue: Queue | None = None) -> Callable[[], Awaitable[None]] | None:
        """What wakes the fleet of ``queue`` (default: the primary one) if it is at zero, to run once the answer is
        sent; None when no check is due."""
        queue = queue or self.queue
        wake = self.wakes.get(queue.settings.queue, self.wake)
        return partial(wake.check, queue) if wake.due() else None

    def after_enqueue(self, background: BackgroundTasks, queue: Queue | None = None) -> None:
        """Wake the fleet of ``queue`` (default: the primary one) if it is at zero, once the answer is sent."""
        check = self.wake_check(queue)
        if check is not None:
            background.add_task(check)

    async def aclose(self) -> None:
        await self.queues.aclose()
