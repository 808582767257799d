"""What a job's ``body`` (the OpenAI request the model server receives) may hold: an allowlist of fields per
endpoint, each field's value checked and bounded. The gateway's submit, its OpenAI front door and a batch's input
lines (:mod:`inferq.batches.lines`) all call :func:`check_body`; a body it refuses is a 422 that names the field
(``body.<field>: ...``) and is never queued.

The allowlist is the fields of OpenAI's chat completions and completions requests and vLLM 0.32's documented
extras (sampling: ``top_k``, ``min_p``, ``repetition_penalty``, ``seed``, ...; structured output:
``structured_outputs``, ``response_format``; the chat template's own switches), with each value's type and range.
A field it does not name is refused, not passed on: an engine field is an input to code on the GPU, and one we have
not looked at (``vllm_xargs``, ``mm_processor_kwargs``, ``kv_transfer_params``, ...) is one we cannot bound. A few
are refused by name with the reason (:data:`REFUSED`). ``mock`` (the mock backend's controls) is the mock backend's.

Structured output is parsed and bounded (:mod:`inferq.queue.structured`): JSON schemas, regexes, choices, EBNF
grammars, the whitespace pattern. vLLM 0.32 ignores the ``guided_*`` fields it once took (the output is then not
constrained at all), so :func:`check_body` rewrites each into ``structured_outputs``, in place: the body queued is
the one the engine will honour. Structural tags are refused: a format the gateway cannot bound.

Message content parts are ``text`` (and an assistant's ``refusal``); ``image_url`` only for a model the registry
marks ``multimodal``, and only as a ``data:`` URL of an image: the engine fetches nothing a tenant names (it has no
route to the internet in AWS), so no part can make it reach an address.
"""

from __future__ import annotations

from typing import Any

from .body_fields import (
    MAX_LOGPROBS,
    MAX_N,
    MAX_TOKENS,
    STRUCTURAL_TAG,
    STRUCTURED,
    STRUCTURED_OPTIONS,
    BodyError,
    Check,
    Messages,
    bad_words,
    boolean,
    chat_template_kwargs,
    constraint,
    int_range,
    logit_bias,
    metadata,
    mock_controls,
    number_range,
    one_of,
    prompt,
    response_format,
    seed,
    short_string,
    stop_sequences,
    stream_options,
    string,
    structured_outputs,
    token_ids,
    tool_choice,
    tool_list,
    top_k,
    truncate,
)

__all__ = ["CHAT", "COMPLETIONS", "BodyError", "allowed_fields", "check_body"]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

REFUSED = {
    "chat_template": "a chat template is the operator's choice, not a request's (it is rendered on the server)",
    "logits_processors": "custom logits processors run code on the server",
    "vllm_xargs": "extra arguments for the server's custom logits processors are the operator's",
    "mm_processor_kwargs": "the multimodal processor's settings are the operator's",
    "media_io_kwargs": "media loading settings are the operator's",
    "kv_transfer_params": "KV transfer is the deployment's, not a request's",
    "ec_transfer_params": "encoder-cache transfer is the deployment's, not a request's",
    "priority": "the engine's scheduling priority is the queue's to set (use the job's priority field)",
    "request_id": "the engine's request ids are the worker's",
    "prompt_embeds": "prompt embeddings are not accepted: a tensor the engine cannot check",
    "mm_payload": "raw multimodal payloads are not accepted",
    "guided_decoding_backend": "the structured-output backend is the operator's choice",
    "functions": "deprecated by OpenAI and not served: use tools",
    "function_call": "deprecated by OpenAI and not served: use tool_choice",
    "best_of": "not served by vLLM 0.32",
    "structural_tag": STRUCTURAL_TAG,
}
"""Fields refused by name, with the reason the 422 gives."""

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
"""The ``guided_*`` fields vLLM 0.32 no longer reads -> their ``structured_outputs`` key."""


# ------------------------------------------------------------------ the allowlists

SAMPLING: dict[str, Check] = {
    "model": string,
    "n": int_range(1, MAX_N),
    "max_tokens": int_range(1, MAX_TOKENS),
    "temperature": number_range(0, 100),
    "top_p": number_range(0, 1),
    "top_k": top_k,
    "min_p": number_range(0, 1),
    "seed": seed,
    "stop": stop_sequences,
    "stop_token_ids": token_ids,
    "presence_penalty": number_range(-2, 2),
    "frequency_penalty": number_range(-2, 2),
    "repetition_penalty": number_range(0.01, 100),
    "length_penalty": number_range(-100, 100),
    "logit_bias": logit_bias,
    "min_tokens": int_range(0, MAX_TOKENS),
    "ignore_eos": boolean,
    "include_stop_str_in_output": boolean,
    "skip_special_tokens": boolean,
    "spaces_between_special_tokens": boolean,
    "truncate_prompt_tokens": truncate,
    "truncation_side": one_of("left", "right"),
    "allowed_token_ids": token_ids,
    "bad_words": bad_words,
    "prompt_logprobs": int_range(0, MAX_LOGPROBS),
    "logprob_token_ids": token_ids,
    "use_beam_search": boolean,
    "add_special_tokens": boolean,
    "return_tokens_as_token_ids": boolean,
    "return_token_ids": boolean,
    "cache_salt": short_string,
    "thinking_token_budget": int_range(0, MAX_TOKENS),
    "echo": boolean,
    "user": short_string,
    "response_format": response_format,
    "structured_outputs": structured_outputs,
    "mock": mock_controls,
}
"""Fields of both endpoints (OpenAI's and vLLM 0.32's sampling and output options)."""

CHAT_ONLY: dict[str, Check] = {
    "max_completion_tokens": int_range(1, MAX_TOKENS),
    "logprobs": boolean,
    "top_logprobs": int_range(0, MAX_LOGPROBS),
    "tools": tool_list,
    "tool_choice": tool_choice,
    "parallel_tool_calls": boolean,
    "reasoning_effort": one_of("none", "minimal", "low", "medium", "high", "xhigh", "max"),
    "include_reasoning": boolean,
    "add_generation_prompt": boolean,
    "continue_final_message": boolean,
    "chat_template_kwargs": chat_template_kwargs,
    # OpenAI's, which vLLM ignores: accepted so the official client's requests pass
    "store": boolean,
    "metadata": metadata,
    "service_tier": one_of("auto", "default", "flex", "scale", "priority"),
    "safety_identifier": short_string,
    "prompt_cache_key": short_string,
}
COMPLETIONS_ONLY: dict[str, Check] = {
    "logprobs": int_range(0, MAX_LOGPROBS),
    "suffix": string,
}
STREAMING: dict[str, Check] = {"stream": boolean, "stream_options": stream_options}
"""Allowed where the answer can stream (the OpenAI front door), not on a queued job's ``POST /v1/jobs``."""
REQUIRED = {CHAT: ("messages", Messages), COMPLETIONS: ("prompt", None)}


def _refused(field: str) -> Check:
    def check(name: str, value: Any) -> None:
        raise BodyError(name, f"not accepted by this gateway: {REFUSED[field]}")

    return check


def allowed_fields(url: str, *, streaming: bool = False) -> set[str]:
    """The body fields an endpoint takes (``guided_*`` are rewritten into ``structured_outputs``)."""
    fields = set(SAMPLING) | set(CHAT_ONLY if url == CHAT else COMPLETIONS_ONLY) | set(GUIDED)
    fields |= {"guided_whitespace_pattern", REQUIRED[url][0]}
    return fields | (set(STREAMING) if streaming else set())


def _rewrite_guided(body: dict[str, Any]) -> None:
    """``guided_json``/``_regex``/``_choice``/``_grammar`` (and ``guided_whitespace_pattern``) into
    ``structured_outputs``, which is what vLLM 0.32 reads; the field names of a refusal stay the ones sent."""
    present = [name for name in (*GUIDED, "guided_whitespace_pattern") if name in body]
    if not present:
        return
    if "structured_outputs" in body:
        raise BodyError(present[0], "give structured_outputs or the guided_ fields, not both")
    constraints = [name for name in GUIDED if body.get(name) is not None]
    if len(constraints) > 1:
        raise BodyError(constraints[1], f"give at most one of {', '.join(GUIDED)}")
    for name in constraints:
        constraint(STRUCTURED[GUIDED[name]])(name, body[name])
    if body.get("guided_whitespace_pattern") is not None:
        STRUCTURED_OPTIONS["whitespace_pattern"]("guided_whitespace_pattern", body["guided_whitespace_pattern"])
        if not constraints:
            raise BodyError("guided_whitespace_pattern", "applies to a guided_json constraint, which is missing")
    outputs = {GUIDED[name]: body[name] for name in constraints}
    if body.get("guided_whitespace_pattern") is not None:
        outputs["whitespace_pattern"] = body["guided_whitespace_pattern"]
    for name in present:
        del body[name]
    if outputs:
        body["structured_outputs"] = outputs


def check_body(body: dict[str, Any], url: str, *, multimodal: bool = False, streaming: bool = False) -> None:
    """Raise :class:`BodyError` naming the first field of ``body`` the endpoint does not take, or whose value the
    engine cannot take; rewrite ``guided_*`` fields into ``structured_outputs`` in place (see the module).

    ``multimodal``: the model takes ``image_url`` parts (the registry's ``multimodal``). ``streaming``: the answer
    may stream (the OpenAI front door), so ``stream`` and ``stream_options`` are fields it takes."""
    if url not in REQUIRED:
        raise BodyError("url", f"must be {CHAT} or {COMPLETIONS}")
    for field in body:
        if not isinstance(field, str):
            raise BodyError(str(field), "field names are strings")
    required, messages = REQUIRED[url]
    if required not in body:
        raise BodyError(required, f"is required for {url}")
    checks: dict[str, Check] = {**SAMPLING, **(CHAT_ONLY if url == CHAT else COMPLETIONS_ONLY)}
    checks[required] = messages(multimodal) if messages is not None else prompt
    if streaming:
        checks.update(STREAMING)
    for field, value in body.items():
        if field in GUIDED or field == "guided_whitespace_pattern":
            continue
        check = checks.get(field)
        if check is None:
            if field in REFUSED:
                _refused(field)(field, value)
            if field in STREAMING:
                if field == "stream" and not value:
                    continue  # "stream": false asks for what a queued job does anyway
                raise BodyError(field, "a queued job is not streamed: read GET /v1/jobs/{id}/stream, or use "
                                       "POST /v1/chat/completions")
            other = COMPLETIONS if url == CHAT else CHAT
            hint = f" (a field of {other})" if field in (CHAT_ONLY if other == CHAT else COMPLETIONS_ONLY) else ""
            raise BodyError(field, f"is not a field {url} takes here{hint}; docs/api.md lists them")
        check(field, value)
    _rewrite_guided(body)
