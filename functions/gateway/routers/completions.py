"""The OpenAI front door: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (docs/api.md), so an application
written against the official ``openai`` client uses the queue by pointing ``base_url`` at the gateway.

The body is queued as a job (lane ``normal``, or the ``inferq-priority`` header's; ``inferq-continuation: off`` to
opt out of continuation; ``Idempotency-Key`` as on ``POST /v1/jobs``) and the call waits for it: the answer is the
model server's response once the job succeeds, or the job's error with its status; not ended within
``INFERQ_SYNC_WAIT_S``, a 504 ``timeout`` naming the job, which goes on (a retry with the same ``Idempotency-Key``
waits for the same job). ``stream: true`` answers Server-Sent Events (:mod:`.sse`) as the output arrives, where the
server can stream (uvicorn: ``inferq up``, compose, a gateway in a container); on Lambda behind API Gateway's HTTP
API, which buffers a response whole, the same events come together once the job ends. ``stream`` and
``stream_options`` are the answer's, not the job's: the job's body is the request without them, so a streamed and an
unstreamed call with one key are the same job. Every answer about a job carries its id in ``inferq-job-id``."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from inferq.queue.engine_body import BodyError, check_body
from inferq.queue.jobs import Job, JobRequest, JobStatus, Priority
from inferq.queue.output import Cursor, Page
from inferq.queue.protocol import Queue

from ..dependencies import GatewayDep, Tenant
from ..errors import ApiError
from ..gateway import Gateway
from ..joboutput import final_text, reader
from ..jobs import TRACEPARENT_RE
from ..metering import check_budget
from ..openapi import JOB_ERRORS, errors
from ..request_schemas import IDEMPOTENCY_KEY_MAX
from ..responses import JSONResponse
from ..sse import KEEPALIVE, Chunks, job_error
from ..waits import wait_slot

router = APIRouter()

JOB_HEADER = "inferq-job-id"
PRIORITY_HEADER = "inferq-priority"
CONTINUATION_HEADER = "inferq-continuation"
"""``off``: the job opts out of continuation (every attempt starts over), as a job's ``"continuation": false``."""
KEEPALIVE_S = 15.0
STREAM_SLOT_S = 3600
"""How long a streamed answer's wait slot lasts at most once its first output came: the longest attempt a job may
ask for (``timeout_s``). The stream gives it back when it ends; this bounds a slot whose gateway died."""
"""A streamed answer quiet this long gets a comment line."""
_SERVER_STATUS = re.compile(r"model server answered (\d{3})")
_background: set[asyncio.Future[None]] = set()
"""Wake checks under way (a task must be referenced until it ends)."""


def _status_of(job: Job) -> int:
    """The HTTP status of a job that ended without a result: the model server's own 4xx for a request it refused,
    502 when the model server kept failing, 409 for a cancelled job, 504 for one that expired unstarted."""
    if job.status is JobStatus.CANCELLED:
        return 409
    if job.status is JobStatus.EXPIRED:
        return 504
    error = job.error or {}
    if error.get("type") == "model_error":
        found = _SERVER_STATUS.search(str(error.get("message") or ""))
        status = int(found.group(1)) if found else 400
        return status if 400 <= status < 500 else 400
    return 502


def _parse(raw: bytes) -> dict[str, Any]:
    """The request body: a JSON object, strictly (no NaN, no lone surrogate)."""
    import orjson

    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ApiError(422, "body: must be a JSON object (OpenAI's request)") from None
    if not isinstance(body, dict):
        raise ApiError(422, "body: must be a JSON object (OpenAI's request)")
    return body


def _job_request(request: Request, url: str, body: dict[str, Any], gw: Gateway, tenant: str, stream: bool
                 ) -> JobRequest:
    headers = request.headers
    key = headers.get("idempotency-key")
    if key is not None and not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX:
        raise ApiError(422, f"Idempotency-Key: 1 to {IDEMPOTENCY_KEY_MAX} characters")
    lane = headers.get(PRIORITY_HEADER)
    if lane is not None:
        try:
            priority = Priority(lane)
        except ValueError:
            raise ApiError(422, f"{PRIORITY_HEADER}: one of high, normal, low") from None
        if not gw.settings.priority_allowed(tenant, priority):
            ceiling = gw.settings.max_priority_of(tenant).value
            raise ApiError(403, f"priority {lane!r} is above this tenant's ceiling ({ceiling!r})",
                           type_="priority_not_allowed")
    else:
        priority = Priority.NORMAL
    trace = headers.get("traceparent")
    continuation = headers.get(CONTINUATION_HEADER, "on")
    if continuation not in ("on", "off"):
        raise ApiError(422, f"{CONTINUATION_HEADER}: on or off")
    return JobRequest(body=body, url=url, idempotency_key=key, priority=priority, watch=stream,
                      traceparent=trace if trace and TRACEPARENT_RE.match(trace) else None,
                      continuation=continuation == "on")


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    """Take ``stream`` and ``stream_options`` out of the body: whether to stream, and whether to end with usage."""
    stream = body.pop("stream", None)
    options = body.pop("stream_options", None)
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(422, "body.stream: must be true or false")
    if options is not None and not isinstance(options, dict):
        raise ApiError(422, "body.stream_options: must be an object")
    usage = (options or {}).get("include_usage", False)
    if not isinstance(usage, bool):
        raise ApiError(422, "body.stream_options.include_usage: must be true or false")
    return bool(stream), usage


def _headers(job: Job) -> dict[str, str]:
    return {JOB_HEADER: job.id, "Location": f"/v1/jobs/{job.id}"}


def _timeout(gw: Gateway, job: Job, has_key: bool) -> JSONResponse:
    wait = gw.settings.sync_wait_s
    return JSONResponse(
        {"error": {"type": "timeout", "message": f"the job {job.id} has not ended within {wait:g} s; it goes on: read "
                   f"it with GET /v1/jobs/{job.id}, or retry with the same Idempotency-Key to wait for it again"},
         "job_id": job.id},
        504, headers={**_headers(job), "x-should-retry": "true" if has_key else "false"})


async def _ended(gw: Gateway, job: Job) -> Response:
    """The answer for a job that has ended: the model server's response, or the job's error with its status."""
    if job.status is JobStatus.SUCCEEDED:
        api = await gw.claim_check.present(job)
        result = api.get("result") or {}
        if "body" not in result:  # too large for one response: where to read it
            return JSONResponse(api, 200, headers=_headers(job))
        return JSONResponse(result["body"], int(result.get("status_code") or 200), headers=_headers(job))
    return JSONResponse(job_error(job), _status_of(job),
                        headers={**_headers(job), "x-should-retry": "false"})


@dataclass
class Call:
    """One front-door call: its request checked, then its job (once queued)."""

    gw: Gateway
    url: str
    request: JobRequest
    queue: Queue
    raw_bytes: int
    stream: bool
    usage: bool
    job: Job | None = None
    replayed: bool = False

    @property
    def model(self) -> Any:
        return self.request.body.get("model")

    @property
    def has_key(self) -> bool:
        return self.request.idempotency_key is not None


async def _checked(request: Request, gw: Gateway, url: str, tenant: str) -> Call:
    """The call's request, checked (a refusal queues nothing)."""
    raw = await request.body()
    body = _parse(raw)
    try:
        # the one check of a job's body, as on POST /v1/jobs, taking the fields of an answer that streams
        check_body(body, url, streaming=True)
    except BodyError as exc:
        raise ApiError(422, str(exc)) from None
    stream, usage = _stream_options(body)
    # watched from its enqueue only where the answer streams: behind API Gateway the events come together at the
    # end, and a worker writing output nobody reads as it comes would spend Redis for nothing
    job_request = _job_request(request, url, body, gw, tenant, stream and gw.streams)
    queue = gw.model_queue(body.get("model"))  # an unknown model is a 404 before anything is stored
    return Call(gw, url, job_request, queue, len(raw), stream, usage)


async def _enqueue(request: Request, call: Call, tenant: str) -> Job:
    gw = call.gw
    # past its monthly budget: 429 quota_exceeded, before anything is stored (a retry of an accepted job replays)
    await check_budget(gw, tenant, call.queue, call.request.idempotency_key)
    job_request = await gw.claim_check.check_in(tenant, call.request, call.raw_bytes)  # a large body goes to S3 first
    job, replayed = await gw.call(call.queue.enqueue(tenant, job_request))
    request.state.job_id = job.id
    gw.telemetry.count("IdempotentReplays" if replayed else "JobsEnqueued")
    wake = gw.wake_check(call.queue)
    if wake is not None:
        # now, not after the answer (the answer waits for a fleet that may be at zero), beside the wait: not in
        # the time to first token (the check never raises)
        task = asyncio.ensure_future(wake())
        _background.add(task)
        task.add_done_callback(_background.discard)
    call.job = job
    call.replayed = replayed
    return job


async def _answer(request: Request, gw: Gateway, url: str, tenant: str) -> Response:
    call = await _checked(request, gw, url, tenant)
    wait = gw.settings.sync_wait_s
    streams = call.stream and gw.streams
    # one of the tenant's wait slots, taken before the job is queued (a refused wait queues nothing), for the wait
    # and, streaming, for the stream after it, whose generator then gives it back when the stream ends
    slot = wait_slot(gw, tenant, wait + (STREAM_SLOT_S if streams else 0))
    await slot.__aenter__()
    handed = False
    try:
        job = await _enqueue(request, call, tenant)
        if streams:
            fresh = None if call.replayed else job  # just queued here: no output yet, nothing to look at first
            # followed from the start (the output feed): the first output, or the end, within the wait
            pages = reader(gw, job.id, tenant).follow(Cursor(), fresh=fresh)
            try:
                first = await gw.call(_first_output(pages, wait), extra_s=wait)
            except BaseException:
                await pages.aclose()
                raise
            if first.job is not None and (first.deltas or (first.done and first.job.status is JobStatus.SUCCEEDED)):
                handed = True
                return _streamed(call, first, pages, slot)
            await pages.aclose()
            ended = first.job
        else:
            ended = await gw.call(call.queue.wait(job.id, tenant, wait, shared=gw.shared_waits, with_body=False),
                                  extra_s=wait)
    finally:
        if not handed:
            await slot.__aexit__(None, None, None)
    if ended is None:
        raise ApiError(404, "no such job")  # gone between the submit and the wait: its record expired
    if not ended.status.terminal:
        return _timeout(gw, ended, call.has_key)
    if not call.stream or ended.status is not JobStatus.SUCCEEDED:
        return await _ended(gw, ended)
    # stream: true where the host buffers an answer whole (Lambda): the same events, together
    chunks = Chunks(url, ended.id, ended.created_at, call.model)
    body = (await gw.claim_check.present(ended)).get("result", {}).get("body")
    text = await final_text(gw, ended)
    events = chunks.start() + (chunks.text(text) if text else b"") + chunks.end(ended, body, call.usage)
    return Response(events, 200, media_type="text/event-stream", headers=_headers(ended))


async def _first_output(pages: AsyncGenerator[Page, None], wait_s: float) -> Page:
    """The first page of ``pages`` with output, or with the job ended or gone, within ``wait_s``; else the last page
    seen (the job goes on)."""
    deadline = time.monotonic() + wait_s
    page = await pages.__anext__()  # the job as it is (at once for a job just queued here)
    while page.job is not None and not page.deltas and not page.done:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            page = await asyncio.wait_for(pages.__anext__(), remaining)
        except TimeoutError:
            break  # the generator was cancelled with the wait: the caller closes it
    return page


def _streamed(call: Call, first: Page, pages: AsyncGenerator[Page, None], slot: AbstractAsyncContextManager[None]
              ) -> Response:
    """The events from the first output on, as the output arrives, until the job ends (a host that streams; the
    first page came within ``INFERQ_SYNC_WAIT_S``). The stream holds the tenant's wait ``slot`` (taken) while it
    runs, and gives it back when it ends."""
    gw, job = call.gw, call.job
    assert job is not None
    chunks = Chunks(call.url, job.id, job.created_at, call.model)

    async def events() -> AsyncIterator[bytes]:
        async with contextlib.AsyncExitStack() as held:
            held.push_async_exit(slot)
            try:
                yield chunks.start()
                page = first
                quiet_since = time.monotonic()
                while True:
                    assert page.job is not None
                    for delta in page.deltas:
                        yield chunks.text(delta["delta"])
                    if page.done:
                        if page.job.status is JobStatus.SUCCEEDED:
                            body = (await gw.claim_check.present(page.job)).get("result", {}).get("body")
                            yield chunks.end(page.job, body, call.usage)
                        else:
                            yield chunks.failed(page.job)
                        return
                    if page.deltas:
                        quiet_since = time.monotonic()
                    elif time.monotonic() - quiet_since >= KEEPALIVE_S:
                        quiet_since = time.monotonic()
                        yield KEEPALIVE
                    page = await pages.__anext__()
                    if page.job is None:  # its record went (expired): nothing more will come
                        yield chunks.failed(job)
                        return
            finally:
                await pages.aclose()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={**_headers(job), "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


ANSWERS = {
    200: {"description": "OpenAI's response; with `stream: true`, `text/event-stream` of its chunks, then "
                         "`data: [DONE]`. Header `inferq-job-id`: the job",
          "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": {
              "type": "string"}}}},
    **errors(400, 401, 403, 404, 409, 413, 422, 429, 502, 503, 504, texts={
        **JOB_ERRORS,
        429: "Unfinished jobs reached INFERQ_MAX_QUEUE_DEPTH, the key's rate limit, or the key holds "
             "INFERQ_TENANT_MAX_WAITS waits already",
        409: "The job was cancelled (`cancelled`), or the Idempotency-Key was used with another request",
        502: "The job failed: the model server kept failing (the job's error)",
        504: "The job has not ended within INFERQ_SYNC_WAIT_S (`timeout`, naming the job, which goes on)",
    }),
}


@router.post("/v1/chat/completions", summary="OpenAI's chat completion, through the queue", response_model=None,
             responses=ANSWERS)
async def chat_completions(request: Request, gw: GatewayDep, tenant: Tenant) -> Response:
    return await _answer(request, gw, "/v1/chat/completions", tenant)


@router.post("/v1/completions", summary="OpenAI's completion, through the queue", response_model=None,
             responses=ANSWERS)
async def completions(request: Request, gw: GatewayDep, tenant: Tenant) -> Response:
    return await _answer(request, gw, "/v1/completions", tenant)
