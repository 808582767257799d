"""Every client method without its I/O, written once for both clients.

A method is a flow: a generator that yields the steps it needs (a request to the gateway, a read of a presigned URL,
a pause before a retry) and is sent each step's answer, or thrown its typed error. :class:`~inferq.client.Client`
and :class:`~inferq.client.AsyncClient` differ only in how they carry a step out (blocking or awaited), so the
request building, the answer reading, submit's retries and wait's slicing cannot drift apart between them."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypedDict, TypeVar

import httpx

from .answers import GatewayUnreachable, InferqError, Job
from .common import RetryPolicy, _job, _json, _Retry, _slice, body_url, new_idempotency_key, submit_request, with_body

T = TypeVar("T")


class SubmitOptions(TypedDict, total=False):
    """``submit``'s keyword arguments; those left out or None are not sent, so the gateway's defaults apply."""

    url: str | None
    idempotency_key: str | None
    metadata: Mapping[str, str] | None
    timeout_s: int | None
    ttl_s: int | None
    webhook_url: str | None
    priority: str | None


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request to the gateway with the client's key, and how its answer becomes a value (or a typed error)."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    headers: dict[str, str] | None = None
    extra_timeout: float = 0.0  # a long-poll's wait, on top of the client's timeout

    def unreachable(self, exc: httpx.TransportError) -> GatewayUnreachable:
        return GatewayUnreachable(0, "unreachable", f"{self.method} {self.path}: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class Presigned:
    """A GET of a job's result by its presigned ``body_url``: the URL carries its own signature, so it is sent
    WITHOUT the client's API key, by a plain HTTP client."""

    job: Job

    @property
    def url(self) -> str:
        url = body_url(self.job)
        assert url is not None  # a Presigned step is made only for a job with an unread body_url
        return url

    def read(self, response: httpx.Response) -> Job:
        return with_body(self.job, response)

    def unreachable(self, exc: httpx.TransportError) -> GatewayUnreachable:
        # the exception's text may hold the URL, signature and all: only its type is told
        return GatewayUnreachable(0, "unreachable", f"GET body_url of {self.job.id}: {type(exc).__name__}")


@dataclass(frozen=True)
class Pause:
    """Wait this long before the next step (submit's backoff)."""

    seconds: float


Step = Call[Any] | Presigned | Pause
Flow = Generator[Step, Any, T]


class Runner(Generic[T]):
    """Steps one flow: ``for step in runner`` gives the steps in turn; each is answered with :meth:`answer` or
    :meth:`fail` before the next; :attr:`result` holds what the flow returned once the loop ends."""

    def __init__(self, flow: Flow[T]) -> None:
        self._flow = flow
        self._reply: Any = None
        self._error: InferqError | None = None
        self.result: T

    def __iter__(self) -> Runner[T]:
        return self

    def __next__(self) -> Step:
        error, self._error = self._error, None
        try:
            return self._flow.throw(error) if error is not None else self._flow.send(self._reply)
        except StopIteration as stop:
            self.result = stop.value
            raise StopIteration from None

    def answer(self, reply: Any) -> None:
        self._reply = reply

    def fail(self, error: InferqError) -> None:
        self._error = error


# ---------------------------------------------------------------------- the flows, one per client method


def submit(body: Mapping[str, Any], options: SubmitOptions, policy: RetryPolicy) -> Flow[Job]:
    """``POST /v1/jobs``, retried on 503, 429 and a lost connection with THE SAME idempotency key."""
    request = submit_request(body, url=options.get("url"), metadata=options.get("metadata"),
                             timeout_s=options.get("timeout_s"), ttl_s=options.get("ttl_s"),
                             webhook_url=options.get("webhook_url"), priority=options.get("priority"))
    headers = {"Idempotency-Key": options.get("idempotency_key") or new_idempotency_key()}
    retry = _Retry(policy)
    while True:
        retry.attempt += 1
        try:
            job: Job = yield Call("POST", "/v1/jobs", _job, json=request, headers=headers)
            return job
        except InferqError as exc:
            delay = retry.next_delay(exc)
            if delay is None:
                raise
        yield Pause(delay)


def get(job_id: str, wait: float) -> Flow[Job]:
    params = {"wait": wait} if wait else None
    job: Job = yield Call("GET", f"/v1/jobs/{job_id}", _job, params=params, extra_timeout=wait)
    return (yield from read_result(job))


def read_result(job: Job) -> Flow[Job]:
    if body_url(job) is None:
        return job
    read: Job = yield Presigned(job)
    return read


WAITS_BUSY_PAUSE_S = 1.0
"""How often ``wait`` looks at a job without waiting while its tenant holds all its long polls (429 ``rate_limited``
on a wait, ``INFERQ_TENANT_MAX_WAITS``): most of those end with their jobs, long before the ``Retry-After`` that
bounds them."""


def wait(job_id: str, timeout: float) -> Flow[Job]:
    # reaching the deadline is an answer (the job as it is), not an error
    deadline = time.monotonic() + timeout
    while True:
        try:
            job = yield from get(job_id, _slice(deadline))
        except InferqError as exc:
            if exc.status != 429 or exc.type != "rate_limited" or not _slice(deadline):
                raise
            # every long poll of this key is taken: a look without waiting takes none, then a pause, then a wait
            job = yield from get(job_id, 0)
            if not job.terminal and time.monotonic() < deadline:
                yield Pause(min(WAITS_BUSY_PAUSE_S, exc.retry_after_s or WAITS_BUSY_PAUSE_S,
                                max(0.0, deadline - time.monotonic())))
                continue
        if job.terminal or time.monotonic() >= deadline:
            return job


def one(call: Call[T]) -> Flow[T]:
    """A method that is one request."""
    value: T = yield call
    return value


def cancel(job_id: str) -> Flow[Job]:
    return one(Call("POST", f"/v1/jobs/{job_id}/cancel", _job))


def dlq(limit: int) -> Flow[list[Job]]:
    data = yield from one(Call("GET", "/v1/dlq", _json, params={"limit": limit}))
    return [Job.from_api(item) for item in data["data"]]


def redrive(job_id: str) -> Flow[Job]:
    return one(Call("POST", f"/v1/dlq/{job_id}/redrive", _job))


def scale() -> Flow[dict[str, Any]]:
    return one(Call("GET", "/v1/scale", _json))


def models() -> Flow[list[dict[str, Any]]]:
    data = yield from one(Call("GET", "/v1/models", _json))
    return list(data["data"])


def history(limit: int | None) -> Flow[list[dict[str, Any]]]:
    data = yield from one(Call("GET", "/v1/stats/history", _json, params={"limit": limit} if limit else None))
    return list(data["data"])


def usage(start: float | datetime | None, end: float | datetime | None, tenant: str | None,
          bucket: str | None) -> Flow[dict[str, Any]]:
    """``GET /v1/usage``: the usage object as the gateway answers it."""
    params = {name: value for name, value in (("start", _unix(start)), ("end", _unix(end)), ("tenant", tenant),
                                              ("bucket", bucket)) if value is not None}
    return one(Call("GET", "/v1/usage", _json, params=params or None))


def _unix(moment: float | datetime | None) -> int | None:
    """Unix seconds of a ``datetime`` (a naive one is UTC) or a number."""
    if moment is None:
        return None
    if isinstance(moment, datetime):
        return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())
    return int(moment)


def webhook_secret() -> Flow[dict[str, Any]]:
    return one(Call("GET", "/v1/webhooks/secret", _json))


def rotate_webhook_secret(keep_previous_s: int | None) -> Flow[dict[str, Any]]:
    body = {"keep_previous_s": keep_previous_s} if keep_previous_s is not None else None
    return one(Call("POST", "/v1/webhooks/secret/rotate", _json, json=body))


def events_page(params: dict[str, Any]) -> Flow[Any]:
    """One page of the results feed, long-polling ``params["wait"]`` seconds."""
    return one(Call("GET", "/v1/events", _json, params=params, extra_timeout=params["wait"]))


def output_page(job_id: str, params: dict[str, Any]) -> Flow[Any]:
    """One page of a job's output, long-polling ``params["wait"]`` seconds."""
    return one(Call("GET", f"/v1/jobs/{job_id}/stream", _json, params=params, extra_timeout=params["wait"]))
