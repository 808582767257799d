"""Wake on enqueue (docs/architecture.md): when the fleet is at zero, a submit starts the scaler at once instead of
letting the first job wait for the next scheduled tick.

Cost on the hot path: none while the fleet is up. Each process keeps the scaler's last ``desired`` count, read at
most once per ``refresh_s`` (1 s) in a background task after a 202 has been produced, so the submit itself stays
one Redis round trip. When that read says desired 0 (or there is no decision yet), the task takes the
``inferq:{Q}:wake`` guard (``SET NX EX 5``) and, only if it got it, calls the waker: an asynchronous Lambda
``Invoke`` (``INFERQ_SCALER_FUNCTION``) in AWS, an HTTP POST to ``INFERQ_SCALER_WAKE_URL`` in the emulator. The
guard makes it at most one wake per 5 s per queue across every gateway process; a failed wake is logged and
counted, never turned into a failed submit, and gives the guard back, so the next submit (after ``refresh_s``) tries
again rather than every submit of the next 5 s finding the fleet at zero and no wake under way.

Background means Starlette's background task: under uvicorn it runs after the response has been sent; under
Mangum the invocation returns once it has run, which delays that one response by the wake (bounded by
``timeout_s``) and only while the fleet is at zero. A task detached from the invocation would be frozen with the
Lambda sandbox and the wake lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from inferq.queue.protocol import Queue

    from .telemetry import Telemetry

log = logging.getLogger("inferq.gateway.wake")

GUARD_TTL_S = 5


class Waker(Protocol):
    async def __call__(self) -> None:
        """Start the scaler now; raise on failure."""
        ...


def wake_event(queue: str) -> dict[str, Any]:
    """What the scaler receives: shaped like an EventBridge event so its handler can tell it from the schedule."""
    return {
        "version": "0",
        "source": "inferq.gateway",
        "detail-type": "Scaler Wake",
        "detail": {"queue": queue, "reason": "enqueue"},
    }


class LambdaWaker:
    """``Invoke(InvocationType="Event")`` of the scaler function: returns once Lambda has queued the event."""

    def __init__(self, function_name: str, queue: str, *, client: Any = None) -> None:
        self.function_name = function_name
        self.payload = json.dumps(wake_event(queue)).encode()
        self._client = client

    def _lambda(self) -> Any:
        if self._client is None:
            import boto3  # lazily: only a wake pays for boto3
            from botocore.config import Config

            self._client = boto3.client(
                "lambda", config=Config(connect_timeout=1, read_timeout=2, retries={"max_attempts": 1})
            )
        return self._client

    def _invoke(self) -> None:
        reply = self._lambda().invoke(FunctionName=self.function_name, InvocationType="Event", Payload=self.payload)
        if reply.get("FunctionError") or int(reply.get("StatusCode", 202)) >= 300:
            raise RuntimeError(f"scaler invoke answered {reply.get('StatusCode')} {reply.get('FunctionError')}")

    async def __call__(self) -> None:
        await asyncio.to_thread(self._invoke)


class HttpWaker:
    """POST to the emulator's wake hook (stdlib HTTP in a thread: no HTTP client dependency in the Lambda)."""

    def __init__(self, url: str, queue: str, *, timeout_s: float = 2.0) -> None:
        self.url = url
        self.payload = json.dumps(wake_event(queue)).encode()
        self.timeout_s = timeout_s

    def _post(self) -> None:
        import urllib.request  # lazily: only an HTTP wake (the emulator) pays for it

        request = urllib.request.Request(  # noqa: S310 - the URL is INFERQ_SCALER_WAKE_URL, set by the operator
            self.url, data=self.payload, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:  # noqa: S310
            if reply.status >= 300:
                raise RuntimeError(f"wake hook answered {reply.status}")

    async def __call__(self) -> None:
        await asyncio.to_thread(self._post)


class WakeOnEnqueue:
    """Decides, per process, whether a submit should try to wake the scaler, and does it."""

    def __init__(
        self,
        waker: Waker | None,
        telemetry: Telemetry,
        *,
        refresh_s: float = 1.0,
        guard_ttl_s: int = GUARD_TTL_S,
        timeout_s: float = 3.0,
    ) -> None:
        self.waker = waker
        self.telemetry = telemetry
        self.refresh_s = refresh_s
        self.guard_ttl_s = guard_ttl_s
        self.timeout_s = timeout_s
        self.desired: int | None = None
        self._checked_at = float("-inf")
        self._running_since: float | None = None

    def due(self) -> bool:
        """Hot path, no I/O: whether this submit should run :meth:`check` in the background."""
        if self.waker is None:
            return False
        now = time.monotonic()
        if self._running_since is not None and now - self._running_since < 2 * self.timeout_s:
            return False
        return now - self._checked_at >= self.refresh_s

    async def check(self, queue: Queue) -> None:
        """Read the scaler's decision; at zero, take the guard and wake. Never raises."""
        if self.waker is None:
            return
        self._running_since = time.monotonic()
        guard: str | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                state = await queue.scale_state()
                self.desired = _desired(state.get("desired"))
                self._checked_at = time.monotonic()
                if self.desired:
                    return
                token = secrets.token_hex(8)
                if not await queue.redis.set(queue.keys.wake, token, nx=True, ex=self.guard_ttl_s):
                    return
                guard = token
                await self.waker()
            self.telemetry.count("ScalerWakes")
            self.telemetry.logger.info("woke the scaler", extra={"queue": queue.settings.queue})
        except Exception as exc:
            self.telemetry.count("ScalerWakeFailures")
            self.telemetry.logger.warning(
                "scaler wake failed; the submit stands", extra={"error": f"{type(exc).__name__}: {exc}"}
            )
            if guard is not None:
                await self._release(queue, guard)
        finally:
            self._running_since = None

    async def _release(self, queue: Queue, token: str) -> None:
        """Give back the guard of a wake that failed (when it is still this one's), so the next submit wakes."""
        try:
            async with asyncio.timeout(self.timeout_s):
                if await queue.redis.get(queue.keys.wake) == token:
                    await queue.redis.delete(queue.keys.wake)
        except Exception as exc:  # it expires after guard_ttl_s anyway
            self.telemetry.logger.warning("scaler wake guard not given back; it expires by itself",
                                          extra={"error": type(exc).__name__})


def _desired(raw: str | None) -> int | None:
    try:
        return int(raw) if raw not in (None, "") else None
    except ValueError:
        return None
