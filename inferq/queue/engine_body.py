"""Checks of a job's ``body`` (the OpenAI request the model server receives) against what the engine accepts: the
gateway's submit and a batch's input lines (:mod:`inferq.batches.lines`) run them.

A field that a model server cannot take should be a 422 at the gateway that names it, never a request that
reaches vLLM: a malformed ``guided_json``, ``guided_regex`` or ``response_format`` schema has crashed some vLLM
releases' API server, which takes the worker's task down with it (docs/api.md, "What the body may hold").

Only the fields present are looked at, each by one small function: a plain chat request (``model``, ``messages``,
``max_tokens``) costs three dictionary look-ups. Fields this module does not know are passed through untouched, as
vLLM's server ignores fields it does not know; the few that make the server run caller-supplied code or templates
(:data:`REFUSED`) are refused. ``mock`` (the mock backend's controls) is left to the mock backend.

The JSON Schema checks use ``jsonschema`` (its ``check_schema``, against the schema's own metaschema), imported on
the first request that carries a schema: a gateway that never sees one never pays its import.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from inferq import fastjson

MAX_N = 16
"""Choices per request (``n``, ``best_of``): each is a sequence the engine runs."""
MAX_TOKENS = 1_000_000
MAX_LOGPROBS = 20
"""OpenAI's bound of ``top_logprobs`` and of the completions API's ``logprobs``."""
MAX_STOP = 16
MAX_STOP_CHARS = 1024
MAX_REGEX_CHARS = 4096
MAX_CHOICES = 1024
MAX_CHOICE_CHARS = 4096
MAX_SCHEMA_DEPTH = 32
"""How deeply a JSON schema may nest (objects and arrays): the engines compile schemas recursively."""
MAX_TOOLS = 128
MAX_TOKEN_IDS = 4096
"""``stop_token_ids``, ``allowed_token_ids``, ``logit_bias`` entries."""

REFUSED = {
    "chat_template": "a chat template is the operator's choice, not a request's (it is rendered on the server)",
    "logits_processors": "custom logits processors run code on the server",
    "stream": None,  # refused only when true: see _stream
}
GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


class BodyError(ValueError):
    """A field of ``body`` the engine cannot take: ``field`` names it (``body.<field>``) in the 422."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"body.{field}: {message}")
        self.field = field


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_range(lo: int, hi: int) -> Callable[[str, Any, str], None]:
    def check(field: str, value: Any, url: str) -> None:
        if value is None:
            return
        if not _is_int(value) or not lo <= value <= hi:
            raise BodyError(field, f"must be an integer {lo} to {hi}")

    return check


def _number_range(lo: float, hi: float) -> Callable[[str, Any, str], None]:
    def check(field: str, value: Any, url: str) -> None:
        if value is None:
            return
        if not _is_number(value) or not lo <= value <= hi:
            raise BodyError(field, f"must be a number {lo:g} to {hi:g}")

    return check


def _top_k(field: str, value: Any, url: str) -> None:
    if value is not None and (not _is_int(value) or not (value == -1 or 0 <= value <= 1_000_000)):
        raise BodyError(field, "must be -1 (off) or an integer 0 to 1000000")


def _seed(field: str, value: Any, url: str) -> None:
    if value is not None and (not _is_int(value) or not -(2**63) <= value < 2**64):
        raise BodyError(field, "must be a 64-bit integer")


def _logprobs(field: str, value: Any, url: str) -> None:
    if value is None:
        return
    if url == "/v1/chat/completions":
        if not isinstance(value, bool):
            raise BodyError(field, "must be true or false (chat completions; the count is top_logprobs)")
    elif not _is_int(value) or not 0 <= value <= MAX_LOGPROBS:
        raise BodyError(field, f"must be an integer 0 to {MAX_LOGPROBS}")


def _stop(field: str, value: Any, url: str) -> None:
    if value is None:
        return
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > MAX_STOP:
        raise BodyError(field, f"must be a string or a list of at most {MAX_STOP} strings")
    for item in items:
        if not isinstance(item, str) or len(item) > MAX_STOP_CHARS:
            raise BodyError(field, f"each stop sequence must be a string of at most {MAX_STOP_CHARS} characters")


def _token_ids(field: str, value: Any, url: str) -> None:
    if value is None:
        return
    if not isinstance(value, list) or len(value) > MAX_TOKEN_IDS or not all(
            _is_int(t) and 0 <= t < 2**31 for t in value):
        raise BodyError(field, f"must be a list of at most {MAX_TOKEN_IDS} token ids")


def _logit_bias(field: str, value: Any, url: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or len(value) > MAX_TOKEN_IDS:
        raise BodyError(field, f"must be an object of at most {MAX_TOKEN_IDS} token id -> bias pairs")
    for token, bias in value.items():
        if not token.isdigit() or len(token) > 10 or not _is_number(bias) or not -100 <= bias <= 100:
            raise BodyError(field, "each key must be a token id and each value a number -100 to 100")


def _bool(field: str, value: Any, url: str) -> None:
    if value is not None and not isinstance(value, bool):
        raise BodyError(field, "must be true or false")


def _stream(field: str, value: Any, url: str) -> None:
    if value:
        raise BodyError(field, "streaming is not available for queued jobs; leave it out or false")


def _refused(field: str, value: Any, url: str) -> None:
    raise BodyError(field, f"not accepted by this gateway: {REFUSED[field]}")


def _messages(field: str, value: Any, url: str) -> None:
    if not isinstance(value, list) or not value:
        raise BodyError(field, "must be a non-empty list of message objects")
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BodyError(field, "each message must be an object with a string role")


def _prompt(field: str, value: Any, url: str) -> None:
    if isinstance(value, str):
        return
    if isinstance(value, list) and value and (
            all(isinstance(p, str) for p in value) or all(_is_int(t) for t in value)
            or all(isinstance(p, list) and all(_is_int(t) for t in p) for p in value)):
        return
    raise BodyError(field, "must be a string, a list of strings, a list of token ids or a list of such lists")


def _model(field: str, value: Any, url: str) -> None:
    if value is not None and not isinstance(value, str):
        raise BodyError(field, "must be a string")


# ------------------------------------------------------------------ structured output


def _depth(value: Any, field: str, level: int = 0) -> None:
    """Refuse a JSON value nested deeper than :data:`MAX_SCHEMA_DEPTH` (iterative engines are rare: most compile
    schemas recursively, and so does ``jsonschema``)."""
    if level > MAX_SCHEMA_DEPTH:
        raise BodyError(field, f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
    if isinstance(value, dict):
        for item in value.values():
            if isinstance(item, dict | list):
                _depth(item, field, level + 1)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict | list):
                _depth(item, field, level + 1)


_VALID_SCHEMAS: dict[bytes, None] = {}
"""Digests of schemas found valid, newest last (a client sends the same schema with many jobs; checking one
against its metaschema takes about a millisecond): at most :data:`VALID_SCHEMAS_KEPT`."""
VALID_SCHEMAS_KEPT = 1024


def check_schema(field: str, schema: Any) -> None:
    """A JSON Schema the engine can compile: an object (or a JSON text of one) valid against its metaschema."""
    if isinstance(schema, str):
        import json

        try:
            schema = json.loads(schema)
        except ValueError:
            raise BodyError(field, "must be a JSON schema (an object, or a string holding one)") from None
    if isinstance(schema, bool):
        return  # true/false are schemas too
    if not isinstance(schema, dict):
        raise BodyError(field, "must be a JSON schema (an object, or a string holding one)")
    _depth(schema, field)
    try:
        key = hashlib.sha256(fastjson.dumps(schema)).digest()
    except (TypeError, ValueError):  # not JSON after all (cannot come from a parsed request)
        raise BodyError(field, "must be a JSON schema") from None
    if key in _VALID_SCHEMAS:
        return
    from jsonschema import SchemaError, validators  # lazily: only requests with a schema pay the import

    try:
        validators.validator_for(schema, default=validators.Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the schema's root"
        raise BodyError(field, f"is not a valid JSON schema at {where}: {exc.message[:200]}") from None
    except RecursionError:
        raise BodyError(field, "the schema is too deeply nested") from None
    _VALID_SCHEMAS[key] = None
    if len(_VALID_SCHEMAS) > VALID_SCHEMAS_KEPT:
        del _VALID_SCHEMAS[next(iter(_VALID_SCHEMAS))]


def check_regex(field: str, pattern: Any) -> None:
    """A bounded pattern that compiles. Python's ``re`` stands in for the engines' regex dialects (outlines,
    xgrammar, llguidance), which are close to it: a pattern it cannot compile is refused."""
    if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_REGEX_CHARS:
        raise BodyError(field, f"must be a regular expression of 1 to {MAX_REGEX_CHARS} characters")
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise BodyError(field, f"is not a valid regular expression: {str(exc)[:200]}") from None


def check_choice(field: str, choices: Any) -> None:
    if not isinstance(choices, list) or not choices or len(choices) > MAX_CHOICES or not all(
            isinstance(c, str) and len(c) <= MAX_CHOICE_CHARS for c in choices):
        raise BodyError(field, f"must be a list of 1 to {MAX_CHOICES} strings of at most {MAX_CHOICE_CHARS} "
                               "characters")


def check_grammar(field: str, grammar: Any) -> None:
    if not isinstance(grammar, str) or not grammar.strip():
        raise BodyError(field, "must be a non-empty grammar text")


def _guided(check: Callable[[str, Any], None]) -> Callable[[str, Any, str], None]:
    def guided(field: str, value: Any, url: str) -> None:
        if value is not None:
            check(field, value)

    return guided


def _response_format(field: str, value: Any, url: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise BodyError(field, "must be an object with a type")
    kind = value["type"]
    if kind in ("text", "json_object"):
        return
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise BodyError(f"{field}.json_schema", "must be an object with name and schema")
        if spec.get("name") is not None and not isinstance(spec["name"], str):
            raise BodyError(f"{field}.json_schema.name", "must be a string")
        schema = spec.get("schema", spec.get("json_schema"))
        if schema is None:
            raise BodyError(f"{field}.json_schema.schema", "is required")
        check_schema(f"{field}.json_schema.schema", schema)
        return
    if kind == "structural_tag":
        return  # vLLM validates its structure itself (a pydantic model on the server)
    raise BodyError(f"{field}.type", "must be text, json_object, json_schema or structural_tag")


STRUCTURED = {"json": check_schema, "regex": check_regex, "choice": check_choice, "grammar": check_grammar}


def _structured_outputs(field: str, value: Any, url: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise BodyError(field, "must be an object (json, regex, choice, grammar, ...)")
    given = [name for name in STRUCTURED if value.get(name) is not None]
    if len(given) > 1:
        raise BodyError(field, f"give at most one of {', '.join(STRUCTURED)}")
    for name in given:
        STRUCTURED[name](f"{field}.{name}", value[name])


def _tools(field: str, value: Any, url: str) -> None:
    if value is None:
        return
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise BodyError(field, f"must be a list of at most {MAX_TOOLS} tools")
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BodyError(f"{field}[{i}]", "must be {\"type\": \"function\", \"function\": {\"name\", ...}}")
        if function.get("parameters") is not None:
            check_schema(f"{field}[{i}].function.parameters", function["parameters"])


CHECKS: dict[str, Callable[[str, Any, str], None]] = {
    "model": _model,
    "messages": _messages,
    "prompt": _prompt,
    "n": _int_range(1, MAX_N),
    "best_of": _int_range(1, MAX_N),
    "max_tokens": _int_range(1, MAX_TOKENS),
    "max_completion_tokens": _int_range(1, MAX_TOKENS),
    "min_tokens": _int_range(0, MAX_TOKENS),
    "logprobs": _logprobs,
    "top_logprobs": _int_range(0, MAX_LOGPROBS),
    "prompt_logprobs": _int_range(0, MAX_LOGPROBS),
    "temperature": _number_range(0, 100),
    "top_p": _number_range(0, 1),
    "min_p": _number_range(0, 1),
    "top_k": _top_k,
    "seed": _seed,
    "presence_penalty": _number_range(-2, 2),
    "frequency_penalty": _number_range(-2, 2),
    "repetition_penalty": _number_range(0.01, 100),
    "stop": _stop,
    "stop_token_ids": _token_ids,
    "allowed_token_ids": _token_ids,
    "logit_bias": _logit_bias,
    "echo": _bool,
    "ignore_eos": _bool,
    "stream": _stream,
    "chat_template": _refused,
    "logits_processors": _refused,
    "guided_json": _guided(check_schema),
    "guided_regex": _guided(check_regex),
    "guided_choice": _guided(check_choice),
    "guided_grammar": _guided(check_grammar),
    "response_format": _response_format,
    "structured_outputs": _structured_outputs,
    "tools": _tools,
}
"""Field -> its check, for the fields of vLLM's ``ChatCompletionRequest`` and ``CompletionRequest`` whose bad
values reach the engine (sampling bounds, structured output); the others pass as they are."""


def check_body(body: dict[str, Any], url: str) -> None:
    """Raise :class:`BodyError` naming the first field of ``body`` the engine cannot take."""
    for field, value in body.items():
        check = CHECKS.get(field)
        if check is not None:
            check(field, value, url)
    guided = [name for name in GUIDED if body.get(name) is not None]
    if len(guided) > 1:
        raise BodyError(guided[1], f"give at most one of {', '.join(GUIDED)}")
