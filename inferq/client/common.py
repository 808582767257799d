"""What the blocking and the asyncio client share: answers turned into typed errors, the submit request, the
retry policy, how the gateway and its key are found, and the results feed's paging."""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, TypedDict

import httpx

from inferq.retry import backoff

from .answers import (
    EngineCoolOff,
    GatewayUnreachable,
    InferqError,
    Job,
    QuotaExceeded,
    error_for,
)

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


def body_url(job: Job) -> str | None:
    """The presigned URL of a result given by URL (docs/api.md, "Large payloads") not yet read, else None."""
    result = job.result or {}
    url = result.get("body_url")
    return url if isinstance(url, str) and "body" not in result else None


def with_body(job: Job, response: httpx.Response) -> Job:
    """``job`` with the body read from its ``body_url`` in ``result.body``, as if it had come inline."""
    if response.status_code != 200:
        raise InferqError(response.status_code, "result_unavailable",
                          f"reading the result of {job.id} from its body_url answered {response.status_code}")
    return dataclasses.replace(job, result={**(job.result or {}), "body": response.json()})


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
        retryable = isinstance(error, GatewayUnreachable) or (
            error.status in RETRY_STATUSES and not isinstance(error, (QuotaExceeded, EngineCoolOff)))
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


class FeedBounds(TypedDict, total=False):
    """``events``' keyword arguments: the page size, each long-poll's wait, and the optional deadline and count."""

    limit: int
    wait: float
    timeout: float | None
    max_jobs: int | None


class _Feed:
    """The bookkeeping of one results-feed read, shared by :class:`EventStream` and :class:`AsyncEventStream`: what
    to ask for next, and when to stop (deadline or count reached).

    The cursor moves a whole page at a time, and only once the page's last job has been handed out; the page asked
    for never holds more jobs than ``max_jobs`` still allows, so a stream that stops by its own bounds stops exactly
    at a page end and resuming from :attr:`cursor` sees every later job once."""

    def __init__(self, after: str | None, *, limit: int = 100, wait: float = MAX_WAIT_SLICE_S,
                 timeout: float | None = None, max_jobs: int | None = None) -> None:
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


# ---------------------------------------------------------------------- a job's output


class _Output:
    """The bookkeeping of one read of a job's output (``GET /v1/jobs/{id}/stream``), shared by :class:`TextStream`
    and :class:`AsyncTextStream`: what to ask for next, and when to stop (the job ended, or the deadline)."""

    def __init__(self, job_id: str, after: str | None, wait: float, timeout: float | None) -> None:
        self.job_id = job_id
        self.cursor = after
        self.wait = max(0.0, min(float(wait), MAX_WAIT_SLICE_S))
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.buffer: list[str] = []
        self.done = False
        self.status: str | None = None

    def finished(self) -> bool:
        return self.done or (self.deadline is not None and time.monotonic() >= self.deadline)

    def params(self) -> dict[str, Any]:
        wait = self.wait if self.deadline is None else max(0.0, min(self.wait, self.deadline - time.monotonic()))
        params: dict[str, Any] = {"wait": round(wait, 3)}
        if self.cursor is not None:
            params["after"] = self.cursor
        return params

    def take_page(self, body: Any) -> None:
        self.buffer.extend(str(item["delta"]) for item in body["data"])
        self.cursor = body["cursor"]
        self.done = bool(body["done"])
        self.status = body.get("status")


class TextStream(Iterator[str]):
    """A job's output as it is made, as an iterator of text pieces (from :meth:`Client.stream`): pieces of the first
    choice's text that, joined, are its final text. It ends when the job ends (:attr:`status` then says how) or at
    its ``timeout``; :attr:`cursor` resumes it (``client.stream(job_id, after=stream.cursor)``)."""

    def __init__(self, fetch: Callable[[str, dict[str, Any]], Any], output: _Output) -> None:
        self._fetch = fetch
        self._output = output

    @property
    def cursor(self) -> str | None:
        return self._output.cursor

    @property
    def status(self) -> str | None:
        """The job's status when the last page was read (``succeeded``, ... once it ended)."""
        return self._output.status

    @property
    def done(self) -> bool:
        return self._output.done

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        out = self._output
        while not out.buffer:
            if out.finished():
                raise StopIteration
            out.take_page(self._fetch(out.job_id, out.params()))
        return out.buffer.pop(0)


class AsyncTextStream(AsyncIterator[str]):
    """:class:`TextStream` for asyncio (from :meth:`AsyncClient.stream`): ``async for text in stream``."""

    def __init__(self, fetch: Callable[[str, dict[str, Any]], Awaitable[Any]], output: _Output) -> None:
        self._fetch = fetch
        self._output = output

    @property
    def cursor(self) -> str | None:
        return self._output.cursor

    @property
    def status(self) -> str | None:
        return self._output.status

    @property
    def done(self) -> bool:
        return self._output.done

    def __aiter__(self) -> AsyncTextStream:
        return self

    async def __anext__(self) -> str:
        out = self._output
        while not out.buffer:
            if out.finished():
                raise StopAsyncIteration
            out.take_page(await self._fetch(out.job_id, out.params()))
        return out.buffer.pop(0)
