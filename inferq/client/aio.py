"""The asyncio client: :class:`AsyncClient`, method for method the same as :class:`~inferq.client.Client`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from .common import (
    DEFAULT_DATA_DIR,
    MAX_WAIT_SLICE_S,
    AsyncEventStream,
    GatewayUnreachable,
    InferqError,
    Job,
    RetryPolicy,
    _Feed,
    _headers,
    _job,
    _json,
    _resolve,
    _Retry,
    _slice,
    body_url,
    new_idempotency_key,
    submit_request,
    with_body,
)


class AsyncClient:
    """:class:`Client` for asyncio: the same methods, awaited. Use ``async with``, or await :meth:`aclose`."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 100,
        data_dir: str | Path = DEFAULT_DATA_DIR,
    ) -> None:
        base, key = _resolve(base_url, api_key, data_dir)
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self._http = httpx.AsyncClient(base_url=base, headers=_headers(key), timeout=timeout, transport=transport,
                                       limits=httpx.Limits(max_connections=max_connections))

    @property
    def base_url(self) -> str:
        return str(self._http.base_url).rstrip("/")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, *, extra_timeout: float = 0.0, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, timeout=self.timeout + extra_timeout, **kwargs)
        except httpx.TransportError as exc:
            raise GatewayUnreachable(0, "unreachable", f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    async def submit(
        self,
        body: Mapping[str, Any],
        *,
        url: str | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, str] | None = None,
        timeout_s: int | None = None,
        ttl_s: int | None = None,
        webhook_url: str | None = None,
        priority: str | None = None,
    ) -> Job:
        """See :meth:`Client.submit`."""
        request = submit_request(body, url=url, metadata=metadata, timeout_s=timeout_s, ttl_s=ttl_s,
                                 webhook_url=webhook_url, priority=priority)
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        retry = _Retry(self.retry)
        while True:
            retry.attempt += 1
            try:
                return _job(await self._request("POST", "/v1/jobs", json=request, headers=headers))
            except InferqError as exc:
                delay = retry.next_delay(exc)
                if delay is None:
                    raise
            await asyncio.sleep(delay)

    async def get(self, job_id: str, *, wait: float = 0) -> Job:
        params = {"wait": wait} if wait else None
        job = _job(await self._request("GET", f"/v1/jobs/{job_id}", params=params, extra_timeout=wait))
        return await self.read_result(job)

    async def read_result(self, job: Job) -> Job:
        url = body_url(job)
        if url is None:
            return job
        try:  # a presigned URL carries its own signature: never the API key with it
            async with httpx.AsyncClient(timeout=self.timeout) as plain:
                response = await plain.get(url)
        except httpx.TransportError as exc:
            raise GatewayUnreachable(0, "unreachable", f"GET body_url of {job.id}: {type(exc).__name__}") from exc
        return with_body(job, response)

    async def wait(self, job_id: str, timeout: float = 300.0) -> Job:  # noqa: ASYNC109
        # not asyncio.timeout: reaching the deadline is an answer (the job as it is), not an error
        deadline = time.monotonic() + timeout
        while True:
            job = await self.get(job_id, wait=_slice(deadline))
            if job.terminal or time.monotonic() >= deadline:
                return job

    async def cancel(self, job_id: str) -> Job:
        return _job(await self._request("POST", f"/v1/jobs/{job_id}/cancel"))

    async def dlq(self, limit: int = 20) -> list[Job]:
        data = _json(await self._request("GET", "/v1/dlq", params={"limit": limit}))
        return [Job.from_api(item) for item in data["data"]]

    async def redrive(self, job_id: str) -> Job:
        return _job(await self._request("POST", f"/v1/dlq/{job_id}/redrive"))

    async def scale(self) -> dict[str, Any]:
        result: dict[str, Any] = _json(await self._request("GET", "/v1/scale"))
        return result

    async def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        params = {"limit": limit} if limit else None
        data = _json(await self._request("GET", "/v1/stats/history", params=params))
        return list(data["data"])

    def events(
        self,
        after: str | None = None,
        *,
        limit: int = 100,
        wait: float = MAX_WAIT_SLICE_S,
        timeout: float | None = None,
        max_jobs: int | None = None,
    ) -> AsyncEventStream:
        """See :meth:`Client.events`; iterate with ``async for``."""
        feed = _Feed(after, limit, wait, timeout, max_jobs)

        async def fetch(params: dict[str, Any]) -> Any:
            return _json(await self._request("GET", "/v1/events", params=params, extra_timeout=params["wait"]))

        return AsyncEventStream(fetch, feed)
