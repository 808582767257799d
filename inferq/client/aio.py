"""The asyncio client: :class:`AsyncClient`, method for method the same as :class:`~inferq.client.Client`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar, Unpack

import httpx

from . import calls
from .answers import InferqError, Job
from .calls import Step, SubmitOptions
from .common import (
    DEFAULT_DATA_DIR,
    MAX_WAIT_SLICE_S,
    AsyncEventStream,
    AsyncTextStream,
    FeedBounds,
    RetryPolicy,
    _Feed,
    _headers,
    _Output,
    _resolve,
)

T = TypeVar("T")


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

    async def _run(self, flow: calls.Flow[T]) -> T:
        runner = calls.Runner(flow)
        for step in runner:
            try:
                runner.answer(await self._carry_out(step))
            except InferqError as exc:
                runner.fail(exc)
        return runner.result

    async def _carry_out(self, step: Step) -> Any:
        """The one place this client does I/O: a step of a flow (see :mod:`.calls`), awaited."""
        if isinstance(step, calls.Pause):
            await asyncio.sleep(step.seconds)
            return None
        try:
            if isinstance(step, calls.Presigned):
                async with httpx.AsyncClient(timeout=self.timeout) as plain:
                    response = await plain.get(step.url)
            else:
                response = await self._http.request(step.method, step.path, params=step.params, json=step.json,
                                                    headers=step.headers, timeout=self.timeout + step.extra_timeout)
        except httpx.TransportError as exc:
            raise step.unreachable(exc) from exc
        return step.read(response)

    async def submit(self, body: Mapping[str, Any], **options: Unpack[SubmitOptions]) -> Job:
        """See :meth:`Client.submit`."""
        return await self._run(calls.submit(body, options, self.retry))

    async def get(self, job_id: str, *, wait: float = 0) -> Job:
        return await self._run(calls.get(job_id, wait))

    async def read_result(self, job: Job) -> Job:
        return await self._run(calls.read_result(job))

    async def wait(self, job_id: str, timeout: float = 300.0) -> Job:  # noqa: ASYNC109
        return await self._run(calls.wait(job_id, timeout))

    async def cancel(self, job_id: str) -> Job:
        return await self._run(calls.cancel(job_id))

    async def dlq(self, limit: int = 20) -> list[Job]:
        return await self._run(calls.dlq(limit))

    async def redrive(self, job_id: str) -> Job:
        return await self._run(calls.redrive(job_id))

    async def webhook_secret(self) -> dict[str, Any]:
        return await self._run(calls.webhook_secret())

    async def rotate_webhook_secret(self, keep_previous_s: int | None = None) -> dict[str, Any]:
        return await self._run(calls.rotate_webhook_secret(keep_previous_s))

    async def scale(self) -> dict[str, Any]:
        return await self._run(calls.scale())

    async def models(self) -> list[dict[str, Any]]:
        return await self._run(calls.models())

    async def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        return await self._run(calls.history(limit))

    async def usage(self, start: float | datetime | None = None, end: float | datetime | None = None, *,
                    tenant: str | None = None, bucket: str | None = None) -> dict[str, Any]:
        """See :meth:`Client.usage`."""
        return await self._run(calls.usage(start, end, tenant, bucket))

    def events(self, after: str | None = None, **bounds: Unpack[FeedBounds]) -> AsyncEventStream:
        """See :meth:`Client.events`; iterate with ``async for``."""

        async def fetch(params: dict[str, Any]) -> Any:
            return await self._run(calls.events_page(params))

        return AsyncEventStream(fetch, _Feed(after, **bounds))

    def stream(self, job_id: str, *, after: str | None = None, wait: float = MAX_WAIT_SLICE_S,
               timeout: float | None = None) -> AsyncTextStream:
        """See :meth:`Client.stream`; iterate with ``async for``."""

        async def fetch(job: str, params: dict[str, Any]) -> Any:
            return await self._run(calls.output_page(job, params))

        return AsyncTextStream(fetch, _Output(job_id, after, wait, timeout))
