"""The mock backend (a contract: docs/api.md): a deterministic echo with failure controls, for tests,
benchmarks and the emulator. Every call is counted in ``inferq:{Q}:mock:calls`` (job id -> calls), so tests can
prove how many times the model was really called: once per call whatever the Redis faults (a turn's calls are
counted by one script run, resent with its batch's token until written; ``mock_count.lua`` counts a token once).
The count is sent as the call begins and runs alongside the simulated model time (``latency_ms``), as a real
model's latency has no instrumentation round trip in it; a call answers or fails only once its count is written,
and crashes (``crash_deliveries``) or hangs only after that too."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from inferq.queue.jobs import Job
from inferq.queue.keys import Keys
from inferq.queue.output import first_choice_text
from inferq.redis.coalescing import Coalescer
from inferq.redis.faults import FaultRun

from .base import EngineLoad, FatalError, Output, RetryableError

COUNT_SCRIPT = (Path(__file__).parent / "mock_count.lua").read_text()
CRASH_EXIT_CODE = 86
"""Exit status of a worker that ``crash_deliveries`` brought down (what a segfaulting CUDA kernel looks like)."""


def _control_int(controls: dict[str, Any], name: str) -> int:
    value = controls.get(name)
    if value is None or value is False:
        return 0
    if value is True:
        return 1
    if isinstance(value, int) and value >= 0:
        return value
    raise FatalError(f"mock.{name} must be a non-negative integer", status_code=400)


def _text_of(content: Any) -> str:
    """A message's text: a string, or the text parts of a content-parts list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _words(text: str) -> int:
    return len(text.split())


def _truncate(text: str, body: dict[str, Any]) -> tuple[str, str]:
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(limit, int) and limit >= 0:
        words = text.split()
        if len(words) > limit:
            return " ".join(words[:limit]), "length"
    return text, "stop"


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_answer(body: dict[str, Any], job: Job) -> dict[str, Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise FatalError("messages must be a non-empty list", status_code=400)
    last_user = ""
    prompt_words = 0
    for message in messages:
        if not isinstance(message, dict):
            raise FatalError("each message must be an object", status_code=400)
        text = _text_of(message.get("content"))
        prompt_words += _words(text)
        if message.get("role") == "user":
            last_user = text
    text, finish = _truncate(last_user, body)
    return {
        "id": f"chatcmpl-{job.id}",
        "object": "chat.completion",
        "created": int(job.created_at),
        "model": body.get("model") or "mock",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}
        ],
        "usage": _usage(prompt_words, _words(text)),
    }


def completion_answer(body: dict[str, Any], job: Job) -> dict[str, Any]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        prompts = [" ".join(map(str, prompt))]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    else:
        raise FatalError("prompt must be a string or a list of strings", status_code=400)
    choices = []
    completion_words = 0
    for index, text in enumerate(prompts):
        out, finish = _truncate(text, body)
        completion_words += _words(out)
        choices.append({"index": index, "text": out, "logprobs": None, "finish_reason": finish})
    return {
        "id": f"cmpl-{job.id}",
        "object": "text_completion",
        "created": int(job.created_at),
        "model": body.get("model") or "mock",
        "choices": choices,
        "usage": _usage(sum(_words(p) for p in prompts), completion_words),
    }


def _answer(url: str, body: dict[str, Any], job: Job) -> dict[str, Any]:
    if url == "/v1/chat/completions":
        return chat_answer(body, job)
    if url == "/v1/completions":
        return completion_answer(body, job)
    raise FatalError(f"unknown endpoint {url}", status_code=404)


_PIECE = re.compile(r"\s*\S+|\s+")
"""A piece of the echo as the mock streams it: a word with the spaces before it (as a tokenizer's pieces go)."""


@dataclass(frozen=True)
class Stream:
    """The pieces of the echo an attempt writes, the output they go to, and their share of the latency."""

    pieces: list[str]
    output: Output
    share: float


def _pieces(answer: dict[str, Any] | None, output: Output) -> Stream | None:
    """What an answering attempt streams: the rest of its echo after the output kept by earlier attempts (the first
    choice's text starts with it: the echo is deterministic), in the rest's share of the latency."""
    text = first_choice_text(answer) if answer is not None else None
    if text is None:
        return None
    if not text.startswith(output.kept):
        raise FatalError("mock: the kept output is not the start of this job's echo", status_code=400)
    rest = text[len(output.kept):]
    pieces = _PIECE.findall(rest)
    output.expect(len(pieces))  # the mock knows how much it will write: a stopping worker can tell when it ends
    return Stream(pieces, output, len(rest) / len(text) if text else 0.0)


async def _elapse(latency_ms: int, stream: Stream | None) -> None:
    """``latency_ms`` of model time; with ``stream``, its pieces written evenly over their share of it, each at
    its own moment (no drift: a late write does not push back the next)."""
    if stream is None:
        await asyncio.sleep(latency_ms / 1000.0)
        return
    loop = asyncio.get_running_loop()
    started = loop.time()
    pieces = stream.pieces
    gap = latency_ms * stream.share / 1000.0 / max(1, len(pieces))
    for i, piece in enumerate(pieces):
        delay = started + gap * (i + 1) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        stream.output.write(piece, 1)
    if not pieces:  # nothing left to continue with: the rest's share of the time, which is none
        await asyncio.sleep(latency_ms * stream.share / 1000.0)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a count nobody awaits any more as seen (its failure is the count's own, logged where it is retried)."""
    if not future.cancelled():
        future.exception()


class MockBackend:
    """``engine_slots`` simulates a model engine with that many batch slots (tests and benchmarks of
    ``INFERQ_WINDOW=auto``): a call's ``latency_ms`` then runs in a slot, calls beyond the slots queue for one, and
    :meth:`load` reports them as waiting, as vLLM's ``num_requests_waiting`` does. Answers are the same either way."""

    name = "mock"

    def __init__(self, redis: Any, keys: Keys, *, engine_slots: int | None = None) -> None:
        self._redis = redis
        self._key = keys.mock_calls
        self._count_script = redis.register_script(COUNT_SCRIPT)
        self._calls: Coalescer[str, int] = Coalescer(self._count)
        self._slots = asyncio.Semaphore(engine_slots) if engine_slots else None
        self._waiting = 0
        self._running = 0

    async def load(self) -> EngineLoad:
        return EngineLoad(waiting=self._waiting, running=self._running)

    async def _compute(self, latency_ms: int, stream: Stream | None = None) -> None:
        """The model's time: in a slot of the simulated engine, queued for one when all are taken."""
        if self._slots is None:
            self._running += 1
            try:
                await _elapse(latency_ms, stream)
            finally:
                self._running -= 1
            return
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._running += 1
        try:
            await _elapse(latency_ms, stream)
        finally:
            self._running -= 1
            self._slots.release()

    async def _count(self, job_ids: list[str], token: str | None = None) -> list[int]:
        """One script run counts every call of the batch (a job id each; standalone and cluster alike: its keys
        share the queue's hash tag), resent whole with the batch's one token until it is written."""
        faults = FaultRun("mock: counting calls failed", logging.getLogger(__name__), clients=[self._redis])
        keys = [self._key, f"{self._key}:{token or secrets.token_hex(8)}"]
        args = list(job_ids)
        while True:
            try:
                return [int(count) for count in await self._count_script(keys=keys, args=args)]
            except NoScriptError:  # a new primary after a failover: the script is loaded there on the next run
                continue
            except Exception as exc:
                await asyncio.sleep(await faults.absorb(exc))

    async def complete(
        self, url: str, body: dict[str, Any], *, timeout_s: float, traceparent: str, job: Job,
        output: Output | None = None,
    ) -> tuple[int, Any]:
        controls = body.get("mock") or {}
        if not isinstance(controls, dict):
            raise FatalError("mock must be an object", status_code=400)
        # the count is sent now and runs alongside the simulated model time: a real model's latency has no
        # instrumentation round trip in it. Nothing is answered, raised, crashed or hung before it is written.
        counted = self._calls.put(job.id)
        try:
            answer: dict[str, Any] | None = _answer(url, body, job)
            refusal: FatalError | None = None
        except FatalError as exc:  # raised when the call would have answered, as a model server would
            answer, refusal = None, exc
        try:
            stream = _pieces(answer, output) if output is not None else None
            await self._run(controls, job, counted, stream)
        except asyncio.CancelledError:  # an aborted call (timeout, cancel, shutdown): its count goes ahead alone
            counted.add_done_callback(_retrieve)
            raise
        except Exception:
            await counted  # a failure is raised only once the call is counted
            raise
        await counted  # and an answer given only then
        if refusal is not None:
            raise refusal
        assert answer is not None
        return 200, answer

    async def _run(self, controls: dict[str, Any], job: Job, counted: asyncio.Future[int],
                   stream: Stream | None = None) -> None:
        """What the controls ask for, the simulated model time included (with ``stream``, the echo written to it in
        pieces spread over that time: only by an attempt that answers); raises the failures they ask for."""
        crash = _control_int(controls, "crash_deliveries")
        if crash or controls.get("hang"):
            await counted
        if crash and job.deliveries <= crash:
            logging.getLogger(__name__).error(
                "mock: crashing the worker on delivery %d of job %s", job.deliveries, job.id
            )
            for handler in logging.getLogger().handlers:
                handler.flush()
            sys.stderr.flush()
            os._exit(CRASH_EXIT_CODE)
        if controls.get("hang"):
            await asyncio.Event().wait()  # never set: only the job timeout or a cancellation ends this
        latency = _control_int(controls, "latency_ms")
        fail = _control_int(controls, "fail_attempts")
        fails = bool(controls.get("fatal")) or job.attempts <= fail
        if latency or self._slots is not None or (stream is not None and not fails):
            await self._compute(latency, None if fails else stream)
        if controls.get("fatal"):
            message = "mock: fatal error requested"
            raise FatalError(
                message, status_code=400,
                body={"error": {"message": message, "type": "invalid_request_error", "code": 400}},
            )
        if job.attempts <= fail:
            message = f"mock: failing attempt {job.attempts} of the first {fail}"
            raise RetryableError(message, status_code=503, body={"error": {"message": message, "code": 503}})

    async def aclose(self) -> None:
        await self._calls.wait_idle()
