"""Any OpenAI-compatible server (``vllm serve`` as a sidecar in production) over HTTP, with httpx.

Its load signals (for ``INFERQ_WINDOW=auto``) are vLLM's Prometheus metrics at ``/metrics`` of the same server:
``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and the KV-cache usage (``vllm:kv_cache_usage_perc``
since vLLM 0.10, ``vllm:gpu_cache_usage_perc`` before), summed over the label sets (one per model/engine), and the
sums and count of the ``vllm:e2e_request_latency_seconds`` and ``vllm:request_inference_time_seconds`` histograms
(the worker turns those counters into the mean numbers waiting and running between two reads: see
gpu_worker/window.py), with the worker's own count of the requests it sent that were answered and their seconds
from send to answer: what they spent outside the server's stamps, in its HTTP front end above all.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from inferq.queue.jobs import Job
from inferq.queue.output import first_choice_text

from .base import (
    EngineDied,
    EngineLoad,
    Output,
    RetryableError,
    check_status,
    continuation,
    error_message,
    is_retryable_status,
    parse_body,
    strip_mock,
    with_kept,
)
from .chunks import Assembly, sse_data

CONNECT_TIMEOUT_S = 5.0
METRICS_TIMEOUT_S = 2.0
HEALTH_PROBES = 3
"""After a connection dropped mid-request, the server's ``GET /health`` is asked this many times, ..."""
HEALTH_PROBE_GAP_S = 0.5
"""... this far apart: the server died with the request when every probe fails (a restart of the server's front
end alone answers again within that)."""
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
FINISHED = "vllm:e2e_request_latency_seconds_count"
LATENCY_S = "vllm:e2e_request_latency_seconds_sum"
INFERENCE_S = "vllm:request_inference_time_seconds_sum"


def _stream_error(chunk: dict[str, Any]) -> None:
    """An error the server sent in its stream, after its 200 (vLLM: ``{"error": {"message", "type", "code"}}``):
    raised as the status it names would be, retryable when it names none."""
    error = chunk.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    message = error_message(chunk) or "the model server failed mid-stream"
    if is_retryable_status(status):
        raise RetryableError(message, status_code=status, body=chunk)
    check_status(status, chunk)


def parse_vllm_metrics(text: str) -> EngineLoad | None:
    """vLLM's load from its Prometheus exposition text; None when the text has no vLLM request gauges (another
    OpenAI-compatible server)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (WAITING, RUNNING, *KV_CACHE_USAGE, FINISHED, LATENCY_S, INFERENCE_S):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    if WAITING not in totals or RUNNING not in totals:
        return None
    usage = next((totals[name] for name in KV_CACHE_USAGE if name in totals), None)
    counted = all(name in totals for name in (FINISHED, LATENCY_S, INFERENCE_S))
    return EngineLoad(waiting=totals[WAITING], running=totals[RUNNING], kv_cache_usage=usage,
                      finished=totals[FINISHED] if counted else None, latency_s=totals[LATENCY_S] if counted else None,
                      inference_s=totals[INFERENCE_S] if counted else None)


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
        # the worker's own requests answered, and their seconds from send to answer (EngineLoad.answered)
        self._answered = 0
        self._answered_s = 0.0
        # a client of its own: the load is read while every connection of the window is busy with a job
        self._metrics = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers={"User-Agent": "inferq-worker"}, transport=transport,
            timeout=httpx.Timeout(METRICS_TIMEOUT_S), limits=httpx.Limits(max_connections=1),
        )

    async def complete(
        self, url: str, body: dict[str, Any], *, timeout_s: float, traceparent: str, job: Job,
        output: Output | None = None,
    ) -> tuple[int, Any]:
        if output is not None:
            return await self._stream(url, body, timeout_s, traceparent, output)
        timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
        sent = time.perf_counter()
        try:
            response = await self._client.post(
                url, json=strip_mock(body), headers={"traceparent": traceparent}, timeout=timeout
            )
            raw = await response.aread()
        except httpx.HTTPError as exc:
            raise await self._failed(exc) from exc
        if 200 <= response.status_code < 300:  # the requests the server counts as finished
            self._answered += 1
            self._answered_s += time.perf_counter() - sent
        return check_status(response.status_code, parse_body(raw))

    async def _stream(self, url: str, body: dict[str, Any], timeout_s: float, traceparent: str, output: Output
                      ) -> tuple[int, Any]:
        """The request with ``stream: true`` (and the usage in a last chunk), continuing after the kept output: the
        first choice's text written to ``output`` chunk by chunk (a chunk is a token, as vLLM streams them), the
        chunks put back together into the unstreamed answer (:mod:`.chunks`). Closing the connection (a cancel, a
        timeout) is what aborts the request in vLLM."""
        request = continuation(url, strip_mock(body), output.kept, output.kept_tokens)
        options = request.get("stream_options")
        request = {**request, "stream": True,
                   "stream_options": {**(options if isinstance(options, dict) else {}), "include_usage": True}}
        timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
        sent = time.perf_counter()
        assembly = Assembly(url)
        try:
            async with self._client.stream("POST", url, json=request, headers={"traceparent": traceparent},
                                           timeout=timeout) as response:
                if not 200 <= response.status_code < 300:
                    return check_status(response.status_code, parse_body(await response.aread()))
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    # a server that does not stream answers whole: its text is the output, all at once
                    answer = parse_body(await response.aread())
                    text = first_choice_text(answer)
                    if text:
                        output.write(text, 1)
                    self._answered += 1
                    self._answered_s += time.perf_counter() - sent
                    return 200, with_kept(url, answer, output.kept, output.kept_tokens)
                ended = False
                async for line in response.aiter_lines():
                    data = sse_data(line)
                    if data is None:
                        continue
                    if data == "[DONE]":
                        ended = True
                        break
                    chunk = parse_body(data.encode())
                    if not isinstance(chunk, dict):
                        continue
                    if chunk.get("error") is not None:
                        _stream_error(chunk)
                    for index, text in assembly.add(chunk):
                        if index == 0:
                            output.write(text, 1)
        except httpx.HTTPError as exc:
            raise await self._failed(exc) from exc
        if not ended:
            raise RetryableError("the model server's stream ended before [DONE]")
        self._answered += 1
        self._answered_s += time.perf_counter() - sent
        return 200, with_kept(url, assembly.answer(), output.kept, output.kept_tokens)

    async def _failed(self, exc: httpx.HTTPError) -> Exception:
        """What a failed request to the server is: retryable, or the server died with it."""
        if isinstance(exc, httpx.TimeoutException):
            return RetryableError(f"the model server did not answer in time ({type(exc).__name__})")
        if isinstance(exc, httpx.ConnectError | httpx.UnsupportedProtocol | httpx.ProxyError):  # never got it
            return RetryableError(f"cannot reach the model server: {type(exc).__name__}")
        # the request was sent and the connection dropped: did the server die with it?
        if not await self.healthy():
            return EngineDied(f"the model server died while running the request ({type(exc).__name__})")
        return RetryableError(f"the connection to the model server dropped: {type(exc).__name__}")

    async def healthy(self) -> bool:
        """Whether the server is alive: its ``GET /health`` answers within :data:`HEALTH_PROBES` tries with anything
        but a 5xx (vLLM answers 503 once its engine is dead; a server without the route answers 404, and is up)."""
        for probe in range(HEALTH_PROBES):
            if probe:
                await asyncio.sleep(HEALTH_PROBE_GAP_S)
            try:
                response = await self._metrics.get("/health")
            except httpx.HTTPError:
                continue
            if response.status_code < 500:
                return True
        return False

    async def load(self) -> EngineLoad | None:
        """The server's load from ``GET /metrics``; None when it publishes no vLLM gauges there. Raises
        :class:`httpx.HTTPError` when the server cannot be read now (the window then holds its size)."""
        response = await self._metrics.get("/metrics")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        load = parse_vllm_metrics(response.text)
        if load is None or load.finished is None:
            return load
        return replace(load, answered=float(self._answered), answered_s=self._answered_s)

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._metrics.aclose()
