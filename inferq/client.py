"""The Python client of HTTP API v1: :class:`Client` (blocking) and :class:`AsyncClient`, both on httpx.

What every caller of the API writes again otherwise, done once:

- ``submit`` sends an ``Idempotency-Key`` (a random one when none is given) and retries a 503 (outcome unknown),
  a 429 (queue full) and a lost connection with THE SAME key after ``Retry-After``, within a bounded number of
  attempts and a bounded total time. The key makes the retry safe: a job accepted before the failure comes back
  as the same job (200, ``Idempotent-Replayed``), never as a second one.
- ``wait`` long-polls ``GET /v1/jobs/{id}?wait=`` in slices of at most 20 s until the job ends or the deadline.
- Answers are typed: :class:`Job` (the job object) with :class:`~inferq.jobs.JobStatus`, and one exception class
  per error ``type`` of the envelope, each carrying the HTTP status and the envelope itself.
- :func:`verify_webhook` checks a delivery's Standard Webhooks signature.

The typed answers live in :mod:`inferq.answers` and the webhook check in :mod:`inferq.webhook_signing`; all are
importable from here. This module is the only one in ``inferq`` that imports httpx: the queue protocol never
needs it.
- ``events`` iterates the results feed (``GET /v1/events``): the tenant's terminal jobs in the order they ended,
  long-polling for more, resumable from a cursor the caller persists, bounded by an optional deadline or count.

Files, Uploads and Batches (``/v1/files``, ``/v1/uploads``, ``/v1/batches``) have no typed objects here: they are
the OpenAI API, so the official ``openai`` client, its ``base_url`` set to the gateway's ``/v1``, is the client for
them.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx

from .answers import (
    BadRequest,
    Conflict,
    GatewayUnreachable,
    IdempotencyConflict,
    InferqError,
    InvalidRequest,
    Job,
    JobTerminal,
    ModelNotFound,
    NotDeadLettered,
    NotFound,
    QueueFull,
    RequestTooLarge,
    ServerError,
    Unauthorized,
    Unavailable,
    error_for,
)
from .jobs import JobStatus
from .retry import backoff
from .webhook_signing import WebhookVerificationError, verify_webhook

__all__ = [
    "AsyncClient",
    "AsyncEventStream",
    "BadRequest",
    "Client",
    "Conflict",
    "EventStream",
    "GatewayUnreachable",
    "IdempotencyConflict",
    "InferqError",
    "InvalidRequest",
    "Job",
    "JobStatus",
    "JobTerminal",
    "ModelNotFound",
    "NotDeadLettered",
    "NotFound",
    "QueueFull",
    "RequestTooLarge",
    "ServerError",
    "Unauthorized",
    "Unavailable",
    "WebhookVerificationError",
    "verify_webhook",
]

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_DATA_DIR = ".inferq"
"""Where ``inferq up`` (``make up``) writes its URL and development key: a client started next to it finds both."""
MAX_WAIT_SLICE_S = 20
"""The gateway's longest ``?wait=``: a longer wait is several requests."""
RETRY_STATUSES = frozenset({429, 503})
DEFAULT_RETRY_AFTER_S = 1.0
"""Used when a 503/429 carries no usable ``Retry-After``, and as the base of the backoff after a lost connection."""
MAX_RETRY_AFTER_S = 30.0
"""A ``Retry-After`` above this is capped: the total retry budget is what bounds the wait."""
MAX_EVENTS_PAGE = 1000
"""The gateway's largest ``GET /v1/events`` ``limit``."""
_RANDOM = secrets.SystemRandom()  # resubmit timing that other clients cannot predict


# ---------------------------------------------------------------------- answers


def retry_after_s(response: httpx.Response) -> float | None:
    """``Retry-After`` as seconds (delta-seconds or an HTTP date), None when absent or unreadable."""
    raw = response.headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def error_from(response: httpx.Response) -> InferqError:
    """The typed exception of an error answer."""
    try:
        body = response.json()
    except ValueError:
        body = None
    return error_for(response.status_code, body, response.text, retry_after_s(response))


def _job(response: httpx.Response) -> Job:
    if response.status_code >= 400:
        raise error_from(response)
    return Job.from_api(response.json())


def _json(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise error_from(response)
    return response.json()


# ---------------------------------------------------------------------- what both clients share


def submit_request(
    body: Mapping[str, Any],
    *,
    url: str | None,
    metadata: Mapping[str, str] | None,
    timeout_s: int | None,
    ttl_s: int | None,
    webhook_url: str | None,
    priority: str | None,
) -> dict[str, Any]:
    """The ``POST /v1/jobs`` body; fields left None are left out, so the gateway's defaults apply."""
    request: dict[str, Any] = {"body": dict(body)}
    optional = {"url": url, "metadata": dict(metadata) if metadata is not None else None, "timeout_s": timeout_s,
                "ttl_s": ttl_s, "webhook_url": webhook_url, "priority": priority}
    request.update({name: value for name, value in optional.items() if value is not None})
    return request


def new_idempotency_key() -> str:
    return "iq-" + secrets.token_urlsafe(24)


@dataclass(frozen=True)
class RetryPolicy:
    """How ``submit`` retries: at most ``attempts`` requests, none started after ``budget_s`` since the first."""

    attempts: int = 6
    budget_s: float = 60.0

    def delay_s(self, attempt: int, hint_s: float | None) -> float:
        """The wait before request ``attempt + 1``: the gateway's ``Retry-After`` when it gave one, else
        exponential backoff with full jitter (a lost connection says nothing about when to come back)."""
        if hint_s is not None:
            return min(hint_s, MAX_RETRY_AFTER_S)
        return backoff(attempt, DEFAULT_RETRY_AFTER_S, MAX_RETRY_AFTER_S, rng=_RANDOM)


class _Retry:
    """One submit's retry bookkeeping: whether to try again after a failure, and how long to wait first."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.attempt = 0
        self.deadline = time.monotonic() + policy.budget_s

    def next_delay(self, error: InferqError) -> float | None:
        """Seconds to wait before retrying, or None to give up (raise ``error``)."""
        retryable = isinstance(error, GatewayUnreachable) or error.status in RETRY_STATUSES
        if not retryable or self.attempt >= self.policy.attempts:
            return None
        delay = self.policy.delay_s(self.attempt, error.retry_after_s)
        if time.monotonic() + delay > self.deadline:
            return None
        return delay


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"User-Agent": "inferq-client"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _resolve(base_url: str | None, api_key: str | None, data_dir: str | Path) -> tuple[str, str | None]:
    """What was given, else ``$INFERQ_URL``/``$INFERQ_API_KEY``, else what ``inferq up`` left in its data dir."""
    folder = Path(data_dir)
    url = base_url or os.environ.get("INFERQ_URL") or _read(folder / "url") or DEFAULT_URL
    key = api_key or os.environ.get("INFERQ_API_KEY") or _read(folder / "dev-api-key")
    return url.rstrip("/"), key


def _slice(deadline: float) -> int:
    return max(0, min(MAX_WAIT_SLICE_S, int(deadline - time.monotonic())))


class _Feed:
    """The bookkeeping of one results-feed read, shared by :class:`EventStream` and :class:`AsyncEventStream`: what
    to ask for next, and when to stop (deadline or count reached).

    The cursor moves a whole page at a time, and only once the page's last job has been handed out; the page asked
    for never holds more jobs than ``max_jobs`` still allows, so a stream that stops by its own bounds stops exactly
    at a page end and resuming from :attr:`cursor` sees every later job once."""

    def __init__(self, after: str | None, limit: int, wait: float, timeout: float | None,
                 max_jobs: int | None) -> None:
        if not 1 <= limit <= MAX_EVENTS_PAGE:
            raise ValueError(f"limit must be 1..{MAX_EVENTS_PAGE}, got {limit}")
        if max_jobs is not None and max_jobs < 0:
            raise ValueError(f"max_jobs must be >= 0, got {max_jobs}")
        self.cursor = after
        self.limit = limit
        self.wait = max(0.0, min(float(wait), MAX_WAIT_SLICE_S))
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.left = max_jobs
        self.buffer: list[Job] = []
        self.page_cursor: str | None = None
        self.caught_up = False

    def done(self) -> bool:
        if self.left == 0 or (self.caught_up and self.wait == 0):
            return True
        return self.deadline is not None and time.monotonic() >= self.deadline

    def params(self) -> dict[str, Any]:
        limit = self.limit if self.left is None else min(self.limit, self.left)
        wait = self.wait if self.deadline is None else max(0.0, min(self.wait, self.deadline - time.monotonic()))
        params: dict[str, Any] = {"limit": limit, "wait": round(wait, 3)}
        if self.cursor is not None:
            params["after"] = self.cursor
        return params

    def take_page(self, body: Any) -> None:
        jobs = [Job.from_api(item) for item in body["data"]]
        self.caught_up = not jobs and not body["has_more"]
        if jobs:
            self.buffer, self.page_cursor = jobs, body["cursor"]
        else:  # nothing handed out: move on at once (the gateway skipped other tenants' entries)
            self.cursor = body["cursor"]

    def pop(self) -> Job:
        job = self.buffer.pop(0)
        if self.left is not None:
            self.left -= 1
        if not self.buffer:
            self.cursor = self.page_cursor
        return job


class EventStream(Iterator[Job]):
    """The results feed as an iterator of :class:`Job` (from :meth:`Client.events`).

    :attr:`cursor` is where to resume (``client.events(after=stream.cursor)``): it covers every job handed out once
    the stream stops by its own deadline or count, or after the last job of a page. A caller that breaks out
    mid-page and resumes from it sees the rest of that page's jobs again (at least once, never missed)."""

    def __init__(self, fetch: Callable[[dict[str, Any]], Any], feed: _Feed) -> None:
        self._fetch = fetch
        self._feed = feed

    @property
    def cursor(self) -> str | None:
        return self._feed.cursor

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Job:
        feed = self._feed
        while not feed.buffer:
            if feed.done():
                raise StopIteration
            feed.take_page(self._fetch(feed.params()))
        return feed.pop()


class AsyncEventStream(AsyncIterator[Job]):
    """:class:`EventStream` for asyncio (from :meth:`AsyncClient.events`): ``async for job in stream``."""

    def __init__(self, fetch: Callable[[dict[str, Any]], Awaitable[Any]], feed: _Feed) -> None:
        self._fetch = fetch
        self._feed = feed

    @property
    def cursor(self) -> str | None:
        return self._feed.cursor

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> Job:
        feed = self._feed
        while not feed.buffer:
            if feed.done():
                raise StopAsyncIteration
            feed.take_page(await self._fetch(feed.params()))
        return feed.pop()


# ---------------------------------------------------------------------- the blocking client


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
        return _job(self._request("GET", f"/v1/jobs/{job_id}", params=params, extra_timeout=wait))

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


# ---------------------------------------------------------------------- the asyncio client


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
        return _job(await self._request("GET", f"/v1/jobs/{job_id}", params=params, extra_timeout=wait))

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
