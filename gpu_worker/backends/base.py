"""What every backend shares: the protocol, the two error kinds, and how an HTTP status is classified."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Any, Protocol

from inferq.queue.jobs import Job

RETRYABLE_STATUS = frozenset({408, 429})


class BackendError(Exception):
    """A model call that did not produce a result."""

    def __init__(self, message: str, *, status_code: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.body = body

    def to_error(self, type_: str) -> dict[str, Any]:
        """The job's ``error`` object, exactly ``{"type", "message"}`` (docs/api.md). The model server's
        status and its own error message go into the message text, so a client sees why without parsing more."""
        message = self.message
        detail = _server_message(self.body)
        if self.status_code is not None and str(self.status_code) not in message:
            message = f"model server answered {self.status_code}: {message}"
        if detail and detail not in message:
            message = f"{message}: {detail}"
        return {"type": type_, "message": message[:2000]}


def _server_message(body: Any) -> str | None:
    """The OpenAI-style ``{"error": {"message": ...}}`` of a model server's answer, if it has one."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return None


class RetryableError(BackendError):
    """Worth another attempt after a backoff: a timeout, a dropped connection, 408, 429 or 5xx."""


class FatalError(BackendError):
    """The request itself is wrong (any other 4xx): another attempt would fail the same way."""


class EngineDied(BackendError):
    """The model server died while running this request (the connection dropped mid-request and the server's
    health check failed afterwards; vLLM's engine-dead error in-process). The request is taken for the cause: the
    job is dead-lettered at once, never handed to another worker whose engine it would kill too."""


class Output(Protocol):
    """Where a backend writes a job's output as it is made: the text of the first choice, in deltas (the worker's
    :class:`gpu_worker.output.OutputWriter`, which batches them into the job's output stream)."""

    kept: str
    """The output earlier attempts of the job kept: the backend continues after it (chat: as an assistant prefix
    the model continues; completions: the prompt plus this text; the mock: the rest of its echo), and the first
    choice's text of its answer is this plus what it made."""
    kept_tokens: int
    """The tokens of :attr:`kept`, as the backends counted them: taken off ``max_tokens``."""

    def write(self, delta: str, tokens: int = 1) -> None:
        """More text of the first choice (``tokens``: how many tokens it is). Never blocks."""

    def expect(self, tokens: int) -> None:
        """How many tokens this attempt will write in all, when the backend knows before it ends (the mock's echo):
        a stopping worker keeps a job that will end in time and hands back one that will not
        (:mod:`gpu_worker.interruption`). A backend that cannot tell does not call it."""


class Backend(Protocol):
    """A model server. ``complete`` returns ``(status_code, body)`` for a 2xx answer and raises
    :class:`RetryableError` or :class:`FatalError` otherwise. It must never block the event loop: the worker
    renews leases from the same loop.

    With ``output`` (a request :func:`continuable` says can stream), the backend writes the first choice's text to
    it as it is made, and continues after ``output.kept``; the answer is the same as without, whole: the first
    choice's text is the kept output and everything written after it."""

    name: str

    async def complete(
        self, url: str, body: dict[str, Any], *, timeout_s: float, traceparent: str, job: Job,
        output: Output | None = None,
    ) -> tuple[int, Any]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class EngineLoad:
    """What a model server says about its own load: the signals ``INFERQ_WINDOW=auto`` sizes the window from
    (gpu_worker/window.py). A backend that can read them has ``async def load(self) -> EngineLoad | None``
    (None: the server publishes no such signals)."""

    waiting: float
    """Requests queued inside the engine, not yet scheduled: work no other replica can take."""
    running: float
    """Requests the engine is running (its batch)."""
    kv_cache_usage: float | None = None
    """Fraction of the KV cache in use, 0 to 1, when the engine reports it."""
    finished: float | None = None
    """Requests the server has finished since it started (a counter), when it counts them with the two below."""
    latency_s: float | None = None
    """Seconds those requests spent in the server, arrival to last token, summed (a counter)."""
    inference_s: float | None = None
    """Seconds of that from their first scheduling on (prefill and decode), summed (a counter): the rest,
    ``latency_s - inference_s``, is what they waited inside the server before the engine first ran them."""
    answered: float | None = None
    """Requests this worker sent the server and got a 2xx answer to (a counter of the worker's own), when its
    backend times them, with the one below: a backend that talks to the server over HTTP."""
    answered_s: float | None = None
    """Seconds those requests took, from the worker's send to the answer read, summed (a counter): compared with
    the server's ``latency_s`` per request, the time they spent outside its stamps (its HTTP front end, the
    connection, the worker's own client)."""
    path: float = 0.0
    """Mean requests of the worker's on the path to the engine and back, outside the server's stamps: sent but
    not yet stamped (its HTTP front end, the connection), or finished with their answers on the way back. Set by
    the adaptive window (:class:`gpu_worker.window.Refill`) from the two counters above; 0 where it cannot tell."""


def continuable(url: str, body: dict[str, Any]) -> bool:
    """Whether a request's output can stream, and a later attempt continue after what an earlier one made: one
    choice (``n``, ``best_of`` absent or 1), no ``echo``, and for a completion one text prompt (a continuation is the
    prompt plus the text so far; token ids cannot be joined with text). Other requests are answered whole, their
    text at the end."""
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is not None and value != 1:
            return False
    if url == "/v1/chat/completions":
        return isinstance(body.get("messages"), list)
    if url == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        return isinstance(prompt, str) and not body.get("echo")
    return False


def reduced_max_tokens(body: dict[str, Any], kept_tokens: int) -> dict[str, Any]:
    """``body`` with ``max_tokens``/``max_completion_tokens`` less the tokens already made (at least 1), so the
    attempts together make no more than the request allows."""
    if kept_tokens <= 0:
        return body
    changed = dict(body)
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            changed[name] = max(1, value - kept_tokens)
    return changed


def continuation(url: str, body: dict[str, Any], kept: str, kept_tokens: int) -> dict[str, Any]:
    """The request that continues after ``kept``, the output earlier attempts made (:func:`continuable` requests
    only): chat, with ``kept`` as an assistant message the model continues (vLLM's ``continue_final_message``,
    which takes no generation prompt); a completion, with ``kept`` after the prompt. ``max_tokens`` less what was
    made."""
    body = reduced_max_tokens(body, kept_tokens)
    if not kept:
        return body
    if url == "/v1/chat/completions":
        messages = [*body["messages"], {"role": "assistant", "content": kept}]
        return {**body, "messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    prompt = body["prompt"]
    return {**body, "prompt": [prompt[0] + kept] if isinstance(prompt, list) else prompt + kept}


def with_kept(url: str, answer: Any, kept: str, kept_tokens: int) -> Any:
    """A continuation's answer as the whole request's: ``kept`` put before the first choice's text, and its tokens
    counted as output (:func:`with_kept_usage`)."""
    if not kept or not isinstance(answer, dict):
        return answer
    for choice in answer.get("choices") or ():
        if not isinstance(choice, dict) or (choice.get("index") or 0) != 0:
            continue
        if url == "/v1/chat/completions" and isinstance(choice.get("message"), dict):
            choice["message"]["content"] = kept + (choice["message"].get("content") or "")
        elif url == "/v1/completions":
            choice["text"] = kept + (choice.get("text") or "")
    return with_kept_usage(answer, kept_tokens)


def with_kept_usage(answer: Any, kept_tokens: int) -> Any:
    """An answer's ``usage`` with the kept tokens counted as output, not prompt (a continuation sends them as
    prompt)."""
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if kept_tokens <= 0 or not isinstance(usage, dict):
        return answer
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        moved = min(kept_tokens, prompt)
        usage["prompt_tokens"] = prompt - moved
        usage["completion_tokens"] = completion + moved
    return answer


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS or status >= 500


def check_status(status: int, body: Any) -> tuple[int, Any]:
    """Pass a 2xx answer through; turn anything else into the right error."""
    if 200 <= status < 300:
        return status, body
    message = error_message(body) or f"the model server answered {status}"
    if is_retryable_status(status):
        raise RetryableError(message, status_code=status, body=body)
    raise FatalError(message, status_code=status, body=body)


def error_message(body: Any) -> str | None:
    """The human message inside an OpenAI-style error body (``{"error": {"message"}}`` or ``{"message"}``)."""
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
        if isinstance(inner, str):
            return inner
    if isinstance(body, str) and body:
        return body[:500]
    return None


def digest(text: str) -> str:
    """A short fingerprint of an error text for the logs: the text itself can echo the prompt (a model server's
    message quoting its input), the digest tells equal errors apart without carrying it."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:12]


def strip_mock(body: dict[str, Any]) -> dict[str, Any]:
    """The request without ``mock``: only the mock backend ever sees its controls."""
    if "mock" not in body:
        return body
    return {k: v for k, v in body.items() if k != "mock"}


def parse_body(raw: bytes) -> Any:
    """A model server's answer as JSON when it is JSON, else as (bounded) text."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw[:4000].decode("utf-8", errors="replace")


# ---------------------------------------------------------------- W3C trace context


def new_traceparent() -> str:
    return f"00-{random.getrandbits(128) or 1:032x}-{_span_id()}-01"


def _span_id() -> str:
    # trace and span ids need uniqueness, not secrecy: the cheap generator is enough (this runs once per job)
    return f"{random.getrandbits(64) or 1:016x}"


def trace_id(traceparent: str | None) -> str | None:
    """The trace id of a ``traceparent`` header (``00-<32 hex>-<16 hex>-<2 hex>``), or None when malformed."""
    if not traceparent:
        return None
    parts = traceparent.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        int(parts[1], 16)
        int(parts[2], 16)
    except ValueError:
        return None
    if parts[1] == "0" * 32:
        return None
    return parts[1].lower()


def child_traceparent(traceparent: str | None) -> str:
    """The header to send the model server: same trace, a new span (the worker's call) — or a new trace."""
    tid = trace_id(traceparent)
    if tid is None:
        return new_traceparent()
    flags = traceparent.strip().split("-")[3][:2] if traceparent else "01"
    return f"00-{tid}-{_span_id()}-{flags}"
