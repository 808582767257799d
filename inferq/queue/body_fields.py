"""The checks of the values of a job's body fields (:mod:`inferq.queue.engine_body` holds which field takes which):
scalars and their ranges, messages and their content parts, tools, the chat template's switches, and structured
output (:mod:`inferq.queue.structured` parses and bounds the constraints). Each raises :class:`BodyError` naming the
field, down to the part that is wrong (``messages[2].content[0].image_url``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from . import structured

MAX_N = 16
"""Choices per request (``n``): each is a sequence the engine runs."""
MAX_TOKENS = 1_000_000
MAX_LOGPROBS = 20
"""OpenAI's bound of ``top_logprobs`` and of the completions API's ``logprobs``."""
MAX_STOP = 16
MAX_STOP_CHARS = 1024
MAX_TOOLS = 128
MAX_TOKEN_IDS = 4096
"""``stop_token_ids``, ``allowed_token_ids``, ``logit_bias`` entries."""
MAX_SHORT = 256
"""A short string: a user id, a name, a salt."""
MAX_METADATA = 16
MAX_TEMPLATE_KWARGS = 16
MAX_BAD_WORDS = 256
IMAGE_DATA_URL = re.compile(r"^data:image/(png|jpeg|jpg|gif|webp);base64,[A-Za-z0-9+/]+={0,2}$")
STRUCTURAL_TAG = "structural tags are not accepted (a format the gateway cannot bound)"


class BodyError(ValueError):
    """A field of ``body`` the engine cannot take: ``field`` names it (``body.<field>``) in the 422."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"body.{field}: {message}")
        self.field = field


Check = Callable[[str, Any], None]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def int_range(lo: int, hi: int) -> Check:
    def check(field: str, value: Any) -> None:
        if value is not None and (not _is_int(value) or not lo <= value <= hi):
            raise BodyError(field, f"must be an integer {lo} to {hi}")

    return check


def number_range(lo: float, hi: float) -> Check:
    def check(field: str, value: Any) -> None:
        if value is not None and (not _is_number(value) or not lo <= value <= hi):
            raise BodyError(field, f"must be a number {lo:g} to {hi:g}")

    return check


def one_of(*choices: str) -> Check:
    def check(field: str, value: Any) -> None:
        if value is not None and value not in choices:
            raise BodyError(field, f"must be one of {', '.join(choices)}")

    return check


def boolean(field: str, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise BodyError(field, "must be true or false")


def short_string(field: str, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or len(value) > MAX_SHORT):
        raise BodyError(field, f"must be a string of at most {MAX_SHORT} characters")


def string(field: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise BodyError(field, "must be a string")


def top_k(field: str, value: Any) -> None:
    if value is not None and (not _is_int(value) or not (value == -1 or 0 <= value <= 1_000_000)):
        raise BodyError(field, "must be -1 (off) or an integer 0 to 1000000")


def seed(field: str, value: Any) -> None:
    if value is not None and (not _is_int(value) or not -(2**63) <= value < 2**63):
        raise BodyError(field, "must be a 64-bit integer")


def stop_sequences(field: str, value: Any) -> None:
    if value is None:
        return
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > MAX_STOP:
        raise BodyError(field, f"must be a string or a list of at most {MAX_STOP} strings")
    for item in items:
        if not isinstance(item, str) or len(item) > MAX_STOP_CHARS:
            raise BodyError(field, f"each stop sequence must be a string of at most {MAX_STOP_CHARS} characters")


def token_ids(field: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or len(value) > MAX_TOKEN_IDS or not all(
            _is_int(t) and 0 <= t < 2**31 for t in value):
        raise BodyError(field, f"must be a list of at most {MAX_TOKEN_IDS} token ids")


def logit_bias(field: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or len(value) > MAX_TOKEN_IDS:
        raise BodyError(field, f"must be an object of at most {MAX_TOKEN_IDS} token id -> bias pairs")
    for token, bias in value.items():
        if not token.isdigit() or len(token) > 10 or not _is_number(bias) or not -100 <= bias <= 100:
            raise BodyError(field, "each key must be a token id and each value a number -100 to 100")


def bad_words(field: str, value: Any) -> None:
    if value is not None and (not isinstance(value, list) or len(value) > MAX_BAD_WORDS or not all(
            isinstance(w, str) and 0 < len(w) <= MAX_SHORT for w in value)):
        raise BodyError(field, f"must be a list of at most {MAX_BAD_WORDS} words of 1 to {MAX_SHORT} characters")


def truncate(field: str, value: Any) -> None:
    if value is not None and (not _is_int(value) or not -1 <= value <= MAX_TOKENS):
        raise BodyError(field, f"must be -1 (the model's length) or an integer 0 to {MAX_TOKENS}")


def metadata(field: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or len(value) > MAX_METADATA or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512 for k, v in value.items()):
        raise BodyError(field, f"must be at most {MAX_METADATA} string pairs (keys 64, values 512 characters)")


def mock_controls(field: str, value: Any) -> None:
    if not isinstance(value, dict):
        raise BodyError(field, "must be an object (the mock backend's controls)")


TEMPLATE_RESERVED = {"chat_template", "tokenize", "tools", "documents", "messages", "conversation",
                     "add_generation_prompt", "continue_final_message", "return_dict", "tokenizer"}
"""Names the chat template renderer takes for itself: a request may not set them through
``chat_template_kwargs`` (``chat_template`` would replace the operator's template)."""
_KWARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def chat_template_kwargs(field: str, value: Any) -> None:
    """The chat template's own switches (``enable_thinking``, ...): named scalars, none of the renderer's."""
    if value is None:
        return
    if not isinstance(value, dict) or len(value) > MAX_TEMPLATE_KWARGS:
        raise BodyError(field, f"must be an object of at most {MAX_TEMPLATE_KWARGS} switches")
    for name, item in value.items():
        if not isinstance(name, str) or not _KWARG_NAME.match(name):
            raise BodyError(field, "each name must be an identifier of at most 64 characters")
        if name in TEMPLATE_RESERVED:
            raise BodyError(f"{field}.{name}", "is the renderer's, not a request's")
        if not (isinstance(item, bool | str) or _is_number(item)) or (isinstance(item, str) and len(item) > MAX_SHORT):
            raise BodyError(f"{field}.{name}", f"must be true/false, a number or a string of at most {MAX_SHORT}")


def stream_options(field: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not set(value) <= {"include_usage", "continuous_usage_stats"} or not all(
            isinstance(v, bool) for v in value.values()):
        raise BodyError(field, "must be {\"include_usage\": bool, \"continuous_usage_stats\": bool}")


# ------------------------------------------------------------------ prompts and messages


def prompt(field: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if isinstance(value, list) and value and (
            all(isinstance(p, str) for p in value) or all(_is_int(t) for t in value)
            or all(isinstance(p, list) and all(_is_int(t) for t in p) for p in value)):
        return
    raise BodyError(field, "must be a string, a list of strings, a list of token ids or a list of such lists")


ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "reasoning",
                "reasoning_content"}


class Messages:
    """The ``messages`` check, knowing whether the model takes images."""

    def __init__(self, multimodal: bool) -> None:
        self.multimodal = multimodal

    def __call__(self, field: str, value: Any) -> None:
        if not isinstance(value, list) or not value:
            raise BodyError(field, "must be a non-empty list of message objects")
        for i, message in enumerate(value):
            where = f"{field}[{i}]"
            if not isinstance(message, dict) or message.get("role") not in ROLES:
                raise BodyError(where, f"must be an object whose role is one of {', '.join(ROLES)}")
            unknown = sorted(set(message) - MESSAGE_KEYS)
            if unknown:
                raise BodyError(f"{where}.{unknown[0]}", "is not a field of a message")
            for key in ("name", "tool_call_id"):
                short_string(f"{where}.{key}", message.get(key))
            for key in ("refusal", "reasoning", "reasoning_content"):
                string(f"{where}.{key}", message.get(key))
            self._content(f"{where}.content", message.get("content"), message["role"])
            if message.get("tool_calls") is not None:
                _tool_calls(f"{where}.tool_calls", message["tool_calls"])

    def _content(self, field: str, content: Any, role: str) -> None:
        if content is None or isinstance(content, str):
            if content is None and role not in ("assistant",):
                raise BodyError(field, "is required")
            return
        if not isinstance(content, list):
            raise BodyError(field, "must be a string or a list of content parts")
        for j, part in enumerate(content):
            where = f"{field}[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str) and set(part) <= {"type", "text"}:
                continue
            if kind == "refusal" and role == "assistant" and isinstance(part.get("refusal"), str):
                continue
            if kind == "image_url":
                self._image(where, part)
                continue
            takes = "text and image_url" if self.multimodal else "text"
            raise BodyError(where, f"must be a content part this model takes ({takes}), got {str(kind)[:32]!r}")

    def _image(self, field: str, part: Mapping[str, Any]) -> None:
        if not self.multimodal:
            raise BodyError(f"{field}.image_url", "this model takes text only (the registry does not mark it "
                                                  "multimodal)")
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else None
        if not isinstance(image, dict) or not isinstance(url, str) or not IMAGE_DATA_URL.match(url):
            raise BodyError(f"{field}.image_url.url", "must be a data: URL of a png, jpeg, gif or webp image "
                                                      "(data:image/png;base64,...): the engine fetches no address")
        if image.get("detail") not in (None, "auto", "low", "high") or not set(image) <= {"url", "detail"}:
            raise BodyError(f"{field}.image_url", "takes url and detail (auto, low, high) only")


def _tool_calls(field: str, value: Any) -> None:
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise BodyError(field, f"must be a list of at most {MAX_TOOLS} tool calls")
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not isinstance(
                function.get("arguments", ""), str):
            raise BodyError(f"{field}[{i}]", "must be {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                                             "\"arguments\"}}")


# ------------------------------------------------------------------ structured output


def constraint(check: Callable[[Any], None]) -> Check:
    def checked(field: str, value: Any) -> None:
        if value is None:
            return
        try:
            check(value)
        except ValueError as exc:
            raise BodyError(field, str(exc)) from None

    return checked


STRUCTURED: dict[str, Callable[[Any], None]] = {
    "json": structured.check_schema,
    "regex": structured.check_regex,
    "choice": structured.check_choice,
    "grammar": structured.check_grammar,
}
STRUCTURED_OPTIONS: dict[str, Check] = {
    "json_object": boolean,
    "disable_any_whitespace": boolean,
    "disable_additional_properties": boolean,
    "whitespace_pattern": constraint(structured.check_whitespace_pattern),
}


def structured_outputs(field: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise BodyError(field, "must be an object (json, regex, choice, grammar or json_object)")
    for name in value:
        if name == "structural_tag":
            raise BodyError(f"{field}.structural_tag", STRUCTURAL_TAG)
        if name not in STRUCTURED and name not in STRUCTURED_OPTIONS:
            raise BodyError(f"{field}.{name}", "is not a structured output option")
    given = [name for name in (*STRUCTURED, "json_object") if value.get(name) is not None]
    if len(given) != 1:
        raise BodyError(field, "give exactly one of json, regex, choice, grammar, json_object")
    for name, item in value.items():
        if name in STRUCTURED:
            constraint(STRUCTURED[name])(f"{field}.{name}", item)
        else:
            STRUCTURED_OPTIONS[name](f"{field}.{name}", item)


_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def response_format(field: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise BodyError(field, "must be an object with a type")
    kind = value["type"]
    if kind == "structural_tag":
        raise BodyError(f"{field}.type", STRUCTURAL_TAG)
    if kind not in ("text", "json_object", "json_schema"):
        raise BodyError(f"{field}.type", "must be text, json_object or json_schema")
    if kind != "json_schema":
        if set(value) != {"type"}:
            raise BodyError(field, f"a {kind} format takes no other field")
        return
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise BodyError(f"{field}.json_schema", "must be an object with name and schema")
    if not isinstance(spec.get("name"), str) or not _SCHEMA_NAME.match(spec["name"]):
        raise BodyError(f"{field}.json_schema.name", "must be 1 to 64 of a-z, A-Z, 0-9, _ and -")
    unknown = sorted(set(spec) - {"name", "description", "schema", "strict"})
    if unknown:
        raise BodyError(f"{field}.json_schema.{unknown[0]}", "is not a field of a JSON schema format")
    string(f"{field}.json_schema.description", spec.get("description"))
    boolean(f"{field}.json_schema.strict", spec.get("strict"))
    if spec.get("schema") is None:
        raise BodyError(f"{field}.json_schema.schema", "is required")
    constraint(structured.check_schema)(f"{field}.json_schema.schema", spec["schema"])


def tool_list(field: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise BodyError(field, f"must be a list of at most {MAX_TOOLS} tools")
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (not isinstance(function, dict) or tool.get("type", "function") != "function"
                or not isinstance(function.get("name"), str) or not _SCHEMA_NAME.match(function["name"])):
            raise BodyError(f"{field}[{i}]", "must be {\"type\": \"function\", \"function\": {\"name\", ...}}, the "
                                             "name 1 to 64 of a-z, A-Z, 0-9, _ and -")
        string(f"{field}[{i}].function.description", function.get("description"))
        boolean(f"{field}[{i}].function.strict", function.get("strict"))
        if function.get("parameters") is not None:
            constraint(structured.check_schema)(f"{field}[{i}].function.parameters", function["parameters"])


def tool_choice(field: str, value: Any) -> None:
    if value is None or value in ("none", "auto", "required"):
        return
    function = value.get("function") if isinstance(value, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BodyError(field, "must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\"}}")
