"""Any OpenAI-compatible server (``vllm serve`` as a sidecar in production) over HTTP, with httpx."""

from __future__ import annotations

from typing import Any

import httpx

from inferq.jobs import Job

from .base import RetryableError, check_status, parse_body, strip_mock

CONNECT_TIMEOUT_S = 5.0


class OpenAIBackend:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        *,
        window: int,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Content-Type": "application/json", "User-Agent": "inferq-worker"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        # one connection per job of the window: a job never queues behind another for a socket
        limits = httpx.Limits(max_connections=window, max_keepalive_connections=window)
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            limits=limits,
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            transport=transport,
        )

    async def complete(
        self, url: str, body: dict[str, Any], *, timeout_s: float, traceparent: str, job: Job
    ) -> tuple[int, Any]:
        timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
        try:
            response = await self._client.post(
                url, json=strip_mock(body), headers={"traceparent": traceparent}, timeout=timeout
            )
            raw = await response.aread()
        except httpx.TimeoutException as exc:
            raise RetryableError(f"the model server did not answer in time ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise RetryableError(f"cannot reach the model server: {type(exc).__name__}: {exc}") from exc
        return check_status(response.status_code, parse_body(raw))

    async def aclose(self) -> None:
        await self._client.aclose()
