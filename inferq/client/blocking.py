"""The blocking client: :class:`Client`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from .common import (
    DEFAULT_DATA_DIR,
    MAX_WAIT_SLICE_S,
    EventStream,
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


class Client:
    """A blocking client. ``base_url`` and ``api_key`` default to ``$INFERQ_URL`` and ``$INFERQ_API_KEY``, else to
    what ``inferq up`` wrote in ``data_dir`` (``.inferq``), else ``http://127.0.0.1:8080`` and no key.

    ``timeout`` bounds one request (a long-poll gets its ``wait`` on top); ``retry`` bounds ``submit``'s retries.
    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        data_dir: str | Path = DEFAULT_DATA_DIR,
    ) -> None:
        base, key = _resolve(base_url, api_key, data_dir)
        self.retry = retry or RetryPolicy()
        self.timeout = timeout
        self._http = httpx.Client(base_url=base, headers=_headers(key), timeout=timeout, transport=transport)

    @property
    def base_url(self) -> str:
        return str(self._http.base_url).rstrip("/")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, *, extra_timeout: float = 0.0, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, timeout=self.timeout + extra_timeout, **kwargs)
        except httpx.TransportError as exc:
            raise GatewayUnreachable(0, "unreachable", f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    def submit(
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
        """Submit one job (``body`` is the OpenAI-compatible request). Safe to call again with the same key.

        Fields left None are not sent. ``priority`` is sent only when given: a gateway without priority lanes
        answers it 422 (:class:`InvalidRequest`)."""
        request = submit_request(body, url=url, metadata=metadata, timeout_s=timeout_s, ttl_s=ttl_s,
                                 webhook_url=webhook_url, priority=priority)
        headers = {"Idempotency-Key": idempotency_key or new_idempotency_key()}
        retry = _Retry(self.retry)
        while True:
            retry.attempt += 1
            try:
                return _job(self._request("POST", "/v1/jobs", json=request, headers=headers))
            except InferqError as exc:
                delay = retry.next_delay(exc)
                if delay is None:
                    raise
            time.sleep(delay)

    def get(self, job_id: str, *, wait: float = 0) -> Job:
        """The job now, or (``wait`` > 0, at most 20) as soon as it ends within ``wait`` seconds."""
        params = {"wait": wait} if wait else None
        return self.read_result(_job(self._request("GET", f"/v1/jobs/{job_id}", params=params, extra_timeout=wait)))

    def read_result(self, job: Job) -> Job:
        """``job`` with a result given by URL (too large for one response, or from the events feed) read into
        ``result.body``, as if it had come inline; any other job as it is. :meth:`get` and :meth:`wait` do this."""
        url = body_url(job)
        if url is None:
            return job
        try:  # a presigned URL carries its own signature: never the API key with it
            response = httpx.get(url, timeout=self.timeout)
        except httpx.TransportError as exc:
            raise GatewayUnreachable(0, "unreachable", f"GET body_url of {job.id}: {type(exc).__name__}") from exc
        return with_body(job, response)

    def wait(self, job_id: str, timeout: float = 300.0) -> Job:
        """Long-poll until the job ends or ``timeout`` seconds pass; returns the job as it then is (check
        :attr:`Job.terminal`)."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(job_id, wait=_slice(deadline))
            if job.terminal or time.monotonic() >= deadline:
                return job

    def cancel(self, job_id: str) -> Job:
        """Cancel a queued job at once, or ask a running one to stop (it ends ``cancelled``); :class:`JobTerminal`
        when it has already ended."""
        return _job(self._request("POST", f"/v1/jobs/{job_id}/cancel"))

    def dlq(self, limit: int = 20) -> list[Job]:
        """The tenant's dead-lettered jobs, newest first."""
        data = _json(self._request("GET", "/v1/dlq", params={"limit": limit}))
        return [Job.from_api(item) for item in data["data"]]

    def redrive(self, job_id: str) -> Job:
        """Queue a dead-lettered job again with its attempts reset."""
        return _job(self._request("POST", f"/v1/dlq/{job_id}/redrive"))

    def scale(self) -> dict[str, Any]:
        """The scaler's view: lag, pending, unfinished, dlq, workers, desired, decision."""
        result: dict[str, Any] = _json(self._request("GET", "/v1/scale"))
        return result

    def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: the models served, each with its fleet's state under ``inferq``."""
        data: list[dict[str, Any]] = _json(self._request("GET", "/v1/models"))["data"]
        return data

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The queue's sampled counters, oldest first (``GET /v1/stats/history``)."""
        params = {"limit": limit} if limit else None
        data = _json(self._request("GET", "/v1/stats/history", params=params))
        return list(data["data"])

    def events(
        self,
        after: str | None = None,
        *,
        limit: int = 100,
        wait: float = MAX_WAIT_SLICE_S,
        timeout: float | None = None,
        max_jobs: int | None = None,
    ) -> EventStream:
        """The tenant's terminal jobs in the order they ended (``GET /v1/events``), from the cursor ``after``
        (None: as far back as the feed keeps), long-polling ``wait`` seconds at a time for more.

        Endless unless bounded: it stops after ``timeout`` seconds or ``max_jobs`` jobs, or, with ``wait=0``, once
        it has caught up (what has ended so far, then stop). Persist the returned
        stream's :attr:`EventStream.cursor` to resume later; see there for what it covers."""
        feed = _Feed(after, limit, wait, timeout, max_jobs)

        def fetch(params: dict[str, Any]) -> Any:
            return _json(self._request("GET", "/v1/events", params=params, extra_timeout=params["wait"]))

        return EventStream(fetch, feed)
