"""vLLM's engine in-process (``INFERQ_BACKEND=vllm``; GPU images with the ``vllm`` extra only).

vLLM is imported only when this backend is chosen. The engine runs its model loop off the event loop (its engine
core is a separate process, its outputs arrive through asyncio), so generating never blocks lease renewal; the
chat template, the one piece of synchronous CPU work here, runs in a thread. The OpenAI request is translated
here into a prompt and ``SamplingParams``, and the engine's output back into an OpenAI response, so results look
the same whichever backend produced them."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from inferq.config.settings import Settings, SettingsError
from inferq.queue.jobs import Job

from .base import EngineDied, EngineLoad, FatalError, Output, RetryableError, continuation, strip_mock, with_kept

# OpenAI request field -> SamplingParams argument. Anything else in the body is not a sampling control
# (model, messages, prompt, stream, user, ...) and is ignored, like vLLM's own server ignores unknown fields.
SAMPLING_FIELDS = {
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "n": "n",
    "stop": "stop",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "ignore_eos": "ignore_eos",
}

ENGINE_DEAD = frozenset({"EngineDeadError", "AsyncEngineDeadError"})
"""vLLM's errors for an engine that died (``vllm.v1.engine.exceptions``; the V0 engine's), matched by name: their
module moved between releases."""

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # the OpenAI default for /v1/completions


def sampling_arguments(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams keyword arguments for an OpenAI request."""
    arguments: dict[str, Any] = {}
    for field, argument in SAMPLING_FIELDS.items():
        if body.get(field) is not None:
            arguments[argument] = body[field]
    if "max_tokens" not in arguments:
        # chat: until the context is full (vLLM's server does the same); completions: OpenAI's 16
        arguments["max_tokens"] = COMPLETIONS_DEFAULT_MAX_TOKENS if url == "/v1/completions" else None
    return arguments


def completion_prompt(body: dict[str, Any]) -> str | dict[str, list[int]]:
    """The engine prompt of a /v1/completions request: one string, or token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return {"prompt_token_ids": list(prompt)}
    raise FatalError("prompt must be one string or one list of token ids per job", status_code=400)


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise FatalError("messages must be a non-empty list of objects", status_code=400)
    return messages


def _usage(output: Any) -> dict[str, int]:
    prompt = len(getattr(output, "prompt_token_ids", None) or [])
    completion = sum(len(c.token_ids) for c in output.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def to_openai(url: str, model: str, request_id: str, output: Any) -> dict[str, Any]:
    """An engine ``RequestOutput`` as an OpenAI ``chat.completion`` or ``text_completion``."""
    created = int(time.time())
    if url == "/v1/chat/completions":
        choices: list[dict[str, Any]] = [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": None,
                "finish_reason": c.finish_reason,
            }
            for c in output.outputs
        ]
        return {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": created, "model": model,
                "choices": choices, "usage": _usage(output)}
    choices = [
        {"index": c.index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason} for c in output.outputs
    ]
    return {"id": f"cmpl-{request_id}", "object": "text_completion", "created": created, "model": model,
            "choices": choices, "usage": _usage(output)}


class LoadRecorder:
    """A vLLM stat logger (per engine) that keeps the scheduler's latest counts: the in-process engine's
    equivalent of ``vllm:num_requests_waiting``/``running``/``kv_cache_usage_perc``, and the finished requests'
    times summed (``vllm:e2e_request_latency_seconds``, ``vllm:request_inference_time_seconds``). vLLM calls
    ``record`` from its output loop on the event loop. ``SchedulerStats`` is not a stable vLLM interface: its
    fields are read with defaults, and a version without them simply yields no signal (the auto window then grows
    to its maximum)."""

    def __init__(self) -> None:
        self.latest: EngineLoad | None = None
        self.finished = 0
        self.latency_s = 0.0
        self.inference_s = 0.0

    def factory(self, vllm_config: Any, engine_index: int = 0) -> LoadRecorder:
        return self

    def record(self, scheduler_stats: Any, iteration_stats: Any = None, *args: Any, **kwargs: Any) -> None:
        for finished in getattr(iteration_stats, "finished_requests", None) or ():
            self.finished += 1
            self.latency_s += float(getattr(finished, "e2e_latency", 0.0))
            self.inference_s += float(getattr(finished, "inference_time", 0.0))
        if scheduler_stats is not None and hasattr(scheduler_stats, "num_waiting_reqs"):
            self.latest = EngineLoad(
                waiting=float(scheduler_stats.num_waiting_reqs),
                running=float(getattr(scheduler_stats, "num_running_reqs", 0)),
                kv_cache_usage=getattr(scheduler_stats, "kv_cache_usage", None),
            )
        if self.latest is not None and self.finished:
            self.latest = replace(self.latest, finished=float(self.finished), latency_s=self.latency_s,
                                  inference_s=self.inference_s)

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


class VllmBackend:
    name = "vllm"

    def __init__(
        self, engine: Any, tokenizer: Any, model: str, sampling_params: Callable[..., Any],
        recorder: LoadRecorder | None = None,
    ) -> None:
        self._engine = engine
        self._tokenizer = tokenizer
        self._model = model
        self._sampling_params = sampling_params
        self._recorder = recorder or LoadRecorder()

    @classmethod
    async def create(cls, settings: Settings) -> VllmBackend:
        if not settings.vllm_model:
            raise SettingsError("INFERQ_VLLM_MODEL", "is required when INFERQ_BACKEND=vllm")
        try:
            from vllm import AsyncEngineArgs, AsyncLLMEngine, SamplingParams
        except ImportError as exc:
            raise RuntimeError(
                "INFERQ_BACKEND=vllm needs vLLM in this image (pip install 'inferq[vllm]'); "
                "use INFERQ_BACKEND=openai with a vllm serve sidecar otherwise"
            ) from exc
        # the engine schedules at most the window's jobs at once (with auto, INFERQ_WINDOW_MAX): the worker never
        # gives it more
        args = AsyncEngineArgs(model=settings.vllm_model, max_num_seqs=settings.window_limit)
        recorder = LoadRecorder()
        engine = AsyncLLMEngine.from_engine_args(args, stat_loggers=[recorder.factory])
        tokenizer = await engine.get_tokenizer()
        return cls(engine, tokenizer, settings.vllm_model, SamplingParams, recorder)

    async def load(self) -> EngineLoad | None:
        """The scheduler's latest counts (see :class:`LoadRecorder`)."""
        return self._recorder.latest

    async def _prompt(self, url: str, body: dict[str, Any]) -> Any:
        if url == "/v1/chat/completions":
            messages = chat_messages(body)
            # a continuation (inferq.queue.output) ends with the kept output as an assistant message to continue
            go_on = {"continue_final_message": True} if body.get("continue_final_message") else {}
            try:
                return await asyncio.to_thread(
                    self._tokenizer.apply_chat_template, messages, tokenize=False, add_generation_prompt=not go_on,
                    **go_on,
                )
            except (ValueError, TypeError, KeyError) as exc:
                raise FatalError(f"cannot apply the chat template: {exc}", status_code=400) from exc
        if url == "/v1/completions":
            return completion_prompt(body)
        raise FatalError(f"unknown endpoint {url}", status_code=404)

    async def complete(
        self, url: str, body: dict[str, Any], *, timeout_s: float, traceparent: str, job: Job,
        output: Output | None = None,
    ) -> tuple[int, Any]:
        body = strip_mock(body)
        if output is not None:
            body = continuation(url, body, output.kept, output.kept_tokens)
        prompt = await self._prompt(url, body)
        try:
            params = self._sampling_params(**sampling_arguments(url, body))
        except (ValueError, TypeError) as exc:
            raise FatalError(f"invalid sampling parameters: {exc}", status_code=400) from exc
        request_id = f"{job.id}-{job.attempts}-{uuid.uuid4().hex[:8]}"
        final = None
        written = 0  # characters of the first choice's text written to ``output``
        try:
            async for request_output in self._engine.generate(prompt, params, request_id):
                final = request_output
                if output is not None:  # outputs are cumulative: the new text is what follows what was written
                    text = next((c.text for c in request_output.outputs if c.index == 0), "")
                    if len(text) > written:
                        output.write(text[written:], 1)
                        written = len(text)
        except asyncio.CancelledError:
            # timeout, cancellation or shutdown: free the sequence's KV cache now, not when it would have ended
            await asyncio.shield(self._abort(request_id))
            raise
        except ValueError as exc:  # vLLM's answer to a request it cannot take (e.g. prompt longer than the model)
            raise FatalError(str(exc), status_code=400, body={"error": {"message": str(exc), "code": 400}}) from exc
        except Exception as exc:
            if type(exc).__name__ in ENGINE_DEAD or getattr(self._engine, "errored", False):
                # the engine died running this request: the job is poison, never handed to another worker
                raise EngineDied(f"the vLLM engine died while running the request ({type(exc).__name__})") from exc
            # the engine failed otherwise: another attempt, maybe on another worker
            raise RetryableError(f"vLLM engine error: {type(exc).__name__}") from exc
        if final is None:
            raise RetryableError("vLLM engine returned no output")
        answer = to_openai(url, body.get("model") or self._model, request_id, final)
        if output is None:
            return 200, answer
        return 200, with_kept(url, answer, output.kept, output.kept_tokens)

    async def _abort(self, request_id: str) -> None:
        with contextlib.suppress(Exception):  # best effort: the request may already be gone
            await self._engine.abort(request_id)

    async def aclose(self) -> None:
        shutdown = getattr(self._engine, "shutdown", None)
        if callable(shutdown):
            result = shutdown()
            if asyncio.iscoroutine(result):
                await result
