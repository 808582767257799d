"""ECS task scale-in protection: held while the worker has jobs in flight (docs/architecture.md).

The ECS agent's endpoint (``PUT $ECS_AGENT_URI/task-protection/v1/state``) is called only when the worker turns
busy (protection on, expiring later than one job can run plus the drain) or idle (protection off, once it stayed
idle for a two-second grace), never per job.
A worker that stays busy longer than the expiry renews it shortly before it lapses, so a long busy spell is not
left unprotected. Calls run in their own task, so a slow agent never delays jobs; when the state flips several
times during one call, only the latest state is sent next.

Protection is best effort: an agent that cannot be reached or refuses is retried with backoff, and a drain on
SIGTERM still hands every job over. Anything else raised here is a bug and ends :meth:`TaskProtection.run`; the
worker supervises it and stops.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time

import httpx

from inferq.config.settings import Settings

log = logging.getLogger(__name__)

MAX_EXPIRES_MINUTES = 2880  # the ECS limit (48 hours)
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
IDLE_GRACE_S = 2.0


class AgentError(Exception):
    """The ECS agent answered with an error status."""


def expires_minutes(settings: Settings) -> int:
    """Longer than one job may run plus the drain, so protection never lapses under a running job."""
    minutes = math.ceil((settings.job_timeout_s + settings.drain_s) / 60) + 1
    return max(1, min(MAX_EXPIRES_MINUTES, minutes))


class TaskProtection:
    def __init__(
        self, agent_uri: str, *, expires_minutes: int, client: httpx.AsyncClient | None = None,
        idle_grace_s: float = IDLE_GRACE_S,
    ) -> None:
        self.url = agent_uri.rstrip("/") + "/task-protection/v1/state"
        self.expires_minutes = expires_minutes
        self._client = client or httpx.AsyncClient(timeout=5.0)
        self._desired = False
        self._applied: bool | None = False  # a task starts unprotected; None: unknown after a failed call
        self._applied_at = 0.0
        self._changed = asyncio.Event()
        self._idle_since = 0.0
        self.idle_grace_s = idle_grace_s
        self.calls = 0

    @classmethod
    def from_environment(cls, settings: Settings) -> TaskProtection | None:
        """Protection only exists on ECS, where the agent sets ``ECS_AGENT_URI`` in every container."""
        uri = os.environ.get("ECS_AGENT_URI")
        return cls(uri, expires_minutes=expires_minutes(settings)) if uri else None

    def set_busy(self, busy: bool) -> None:
        """Note the worker's state; cheap enough to call on every job start and end."""
        if busy != self._desired:
            self._desired = busy
            self._idle_since = time.monotonic()
            self._changed.set()

    async def _put(self, enabled: bool) -> None:
        body: dict[str, object] = {"ProtectionEnabled": enabled}
        if enabled:
            body["ExpiresInMinutes"] = self.expires_minutes
        self.calls += 1
        response = await self._client.put(self.url, json=body)
        if response.status_code >= 300:
            raise AgentError(f"ECS agent answered {response.status_code}: {response.text[:200]}")

    def _next_call_in(self) -> float | None:
        """Seconds until the agent must be called: 0 now, None not until the state changes."""
        now = time.monotonic()
        if self._applied is None or (self._desired and not self._applied):
            return 0.0  # idle -> busy at once (or the state is unknown after a failed call)
        if self._applied and not self._desired:
            # busy -> idle once the worker stayed idle for the grace: a worker between two jobs keeps it
            return max(0.0, self._idle_since + self.idle_grace_s - now)
        if self._applied:
            return max(0.0, self._applied_at + 0.8 * self.expires_minutes * 60 - now)  # renew before it lapses
        return None

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            wait_s = self._next_call_in()
            if wait_s is None or wait_s > 0:
                self._changed.clear()
                waiters = [asyncio.ensure_future(self._changed.wait()), asyncio.ensure_future(stop.wait())]
                await asyncio.wait(waiters, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
                for waiter in waiters:
                    waiter.cancel()
                continue
            await self._apply(failures)
            failures = 0 if self._applied == self._desired else failures + 1
            if failures:
                await asyncio.sleep(RETRY_S[min(failures, len(RETRY_S)) - 1])

    async def _apply(self, failures: int) -> None:
        wanted = self._desired
        try:
            await self._put(wanted)
        except (httpx.HTTPError, AgentError) as exc:  # best effort: a drain on SIGTERM still hands every job over
            self._applied = None
            log.warning("task scale-in protection: %s", exc, extra={"protection": wanted, "failures": failures + 1})
            return
        self._applied = wanted
        self._applied_at = time.monotonic()
        log.info("task scale-in protection %s", "on" if wanted else "off",
                 extra={"expires_minutes": self.expires_minutes if wanted else None})

    async def close(self) -> None:
        """Drop protection on the way out (the task is stopping anyway) and close the HTTP client."""
        self._desired = False
        if self._applied is not False:
            await self._apply(0)
        await self._client.aclose()
