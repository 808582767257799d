"""The blocking client: :class:`Client`."""

from __future__ import annotations

import time
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
    EventStream,
    FeedBounds,
    RetryPolicy,
    TextStream,
    _Feed,
    _headers,
    _Output,
    _resolve,
)

T = TypeVar("T")


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

    def _run(self, flow: calls.Flow[T]) -> T:
        runner = calls.Runner(flow)
        for step in runner:
            try:
                runner.answer(self._carry_out(step))
            except InferqError as exc:
                runner.fail(exc)
        return runner.result

    def _carry_out(self, step: Step) -> Any:
        """The one place this client does I/O: a step of a flow (see :mod:`.calls`), done blocking."""
        if isinstance(step, calls.Pause):
            time.sleep(step.seconds)
            return None
        try:
            if isinstance(step, calls.Presigned):
                response = httpx.get(step.url, timeout=self.timeout)
            else:
                response = self._http.request(step.method, step.path, params=step.params, json=step.json,
                                              headers=step.headers, timeout=self.timeout + step.extra_timeout)
        except httpx.TransportError as exc:
            raise step.unreachable(exc) from exc
        return step.read(response)

    def submit(self, body: Mapping[str, Any], **options: Unpack[SubmitOptions]) -> Job:
        """Submit one job (``body`` is the OpenAI-compatible request) with the keyword arguments of
        :class:`~inferq.client.calls.SubmitOptions` (``url``, ``idempotency_key``, ``metadata``, ``timeout_s``,
        ``ttl_s``, ``webhook_url``, ``priority``). Safe to call again with the same key.

        Fields left None are not sent. ``priority`` is sent only when given: a gateway without priority lanes
        answers it 422 (:class:`InvalidRequest`)."""
        return self._run(calls.submit(body, options, self.retry))

    def get(self, job_id: str, *, wait: float = 0) -> Job:
        """The job now, or (``wait`` > 0, at most 20) as soon as it ends within ``wait`` seconds."""
        return self._run(calls.get(job_id, wait))

    def read_result(self, job: Job) -> Job:
        """``job`` with a result given by URL (too large for one response, or from the events feed) read into
        ``result.body``, as if it had come inline; any other job as it is. :meth:`get` and :meth:`wait` do this."""
        return self._run(calls.read_result(job))

    def wait(self, job_id: str, timeout: float = 300.0) -> Job:
        """Long-poll until the job ends or ``timeout`` seconds pass; returns the job as it then is (check
        :attr:`Job.terminal`)."""
        return self._run(calls.wait(job_id, timeout))

    def cancel(self, job_id: str) -> Job:
        """Cancel a queued job at once, or ask a running one to stop (it ends ``cancelled``); :class:`JobTerminal`
        when it has already ended."""
        return self._run(calls.cancel(job_id))

    def dlq(self, limit: int = 20) -> list[Job]:
        """The tenant's dead-lettered jobs, newest first."""
        return self._run(calls.dlq(limit))

    def redrive(self, job_id: str) -> Job:
        """Queue a dead-lettered job again with its attempts reset."""
        return self._run(calls.redrive(job_id))

    def webhook_secret(self) -> dict[str, Any]:
        """The tenant's webhook signing secret (``secret``, ``whsec_…``) and, during a rotation's overlap, the one
        it replaced (``previous``: ``secret``, ``expires_at``); made on first use."""
        return self._run(calls.webhook_secret())

    def rotate_webhook_secret(self, keep_previous_s: int | None = None) -> dict[str, Any]:
        """Replace the tenant's webhook signing secret; the old one keeps signing for ``keep_previous_s`` seconds
        (the gateway's default: a day). Not retried: a second rotation would end the old secret's overlap."""
        return self._run(calls.rotate_webhook_secret(keep_previous_s))

    def scale(self) -> dict[str, Any]:
        """The scaler's view: lag, pending, unfinished, dlq, workers, desired, decision."""
        return self._run(calls.scale())

    def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: the models served, each with its fleet's state under ``inferq``."""
        return self._run(calls.models())

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The queue's sampled counters, oldest first (``GET /v1/stats/history``)."""
        return self._run(calls.history(limit))

    def usage(self, start: float | datetime | None = None, end: float | datetime | None = None, *,
              tenant: str | None = None, bucket: str | None = None) -> dict[str, Any]:
        """Metered usage per model and lane (``GET /v1/usage``): ``[start, end)`` in Unix seconds or datetimes
        (default the last 24 hours), whole hours; ``tenant`` another tenant's or ``"*"`` (operators only: else
        :class:`~inferq.client.answers.Forbidden`, ``operator_only``); ``bucket`` ``"hour"`` or ``"day"``."""
        return self._run(calls.usage(start, end, tenant, bucket))

    def events(self, after: str | None = None, **bounds: Unpack[FeedBounds]) -> EventStream:
        """The tenant's terminal jobs in the order they ended (``GET /v1/events``), from the cursor ``after``
        (None: as far back as the feed keeps), long-polling ``wait`` seconds at a time for more; the page size is
        ``limit`` (default 100).

        Endless unless bounded: it stops after ``timeout`` seconds or ``max_jobs`` jobs, or, with ``wait=0``, once
        it has caught up (what has ended so far, then stop). Persist the returned
        stream's :attr:`EventStream.cursor` to resume later; see there for what it covers."""
        return EventStream(lambda params: self._run(calls.events_page(params)), _Feed(after, **bounds))

    def stream(self, job_id: str, *, after: str | None = None, wait: float = MAX_WAIT_SLICE_S,
               timeout: float | None = None) -> TextStream:
        """The job's output as it is made (``GET /v1/jobs/{id}/stream``): an iterator of text pieces that, joined, are
        the first choice's final text (``message.content``, or ``text``), long-polling ``wait`` seconds at a time.
        It ends when the job ends (the stream's ``status`` says how), or after ``timeout`` seconds; ``after`` (a
        stream's ``cursor``) resumes where an earlier one stopped."""
        return TextStream(lambda job, params: self._run(calls.output_page(job, params)),
                          _Output(job_id, after, wait, timeout))
