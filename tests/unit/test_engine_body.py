"""The checks of a job's body against what the engine accepts (inferq/queue/engine_body.py): each bad field is
named, good requests pass untouched, only the fields present are looked at, and the schema check is lazy."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from inferq.queue.engine_body import CHECKS, BodyError, check_body

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def _field(body: dict[str, Any], url: str = CHAT) -> str:
    with pytest.raises(BodyError) as excinfo:
        check_body(body, url)
    assert str(excinfo.value).startswith(f"body.{excinfo.value.field}: ")
    return excinfo.value.field


@pytest.mark.parametrize(("body", "field"), [
    ({"guided_json": {"type": "object", "properties": []}}, "guided_json"),
    ({"guided_json": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "objekt"}}, "guided_json"),
    ({"guided_json": 12}, "guided_json"),
    ({"guided_regex": "a{2,1}"}, "guided_regex"),
    ({"guided_regex": ""}, "guided_regex"),
    ({"guided_choice": ["a", 1]}, "guided_choice"),
    ({"guided_choice": ["x"] * 2000}, "guided_choice"),
    ({"guided_grammar": 5}, "guided_grammar"),
    ({"guided_choice": ["a"], "guided_grammar": "root ::= 'a'"}, "guided_grammar"),
    ({"structured_outputs": {"json": {"type": "string"}, "regex": "a"}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": "json"}, "response_format"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"n": 0}, "n"), ({"n": True}, "n"), ({"best_of": 17}, "best_of"),
    ({"max_tokens": 1.5}, "max_tokens"), ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"top_p": 1.5}, "top_p"), ({"presence_penalty": 3}, "presence_penalty"), ({"top_k": -2}, "top_k"),
    ({"seed": 2**70}, "seed"), ({"stop": [1]}, "stop"), ({"stop": "x" * 2000}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 500}}, "logit_bias"), ({"echo": "yes"}, "echo"),
    ({"logits_processors": ["my.module:Proc"]}, "logits_processors"),
    ({"prompt": [1, "a"]}, "prompt"), ({"prompt": []}, "prompt"), ({"model": 3}, "model"),
    ({"messages": []}, "messages"), ({"messages": [{"content": "no role"}]}, "messages"),
])
def test_each_field_the_engine_cannot_take_is_named(body: dict[str, Any], field: str) -> None:
    assert _field(body) == field


def test_logprobs_follow_the_endpoint() -> None:
    check_body({"logprobs": True, "top_logprobs": 20}, CHAT)
    check_body({"logprobs": 20}, COMPLETIONS)
    assert _field({"logprobs": 3}) == "logprobs"
    assert _field({"logprobs": False}, COMPLETIONS) == "logprobs"
    assert _field({"logprobs": 21}, COMPLETIONS) == "logprobs"


@pytest.mark.parametrize("body", [
    {},
    {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
    {"prompt": "a"}, {"prompt": ["a", "b"]}, {"prompt": [1, 2]}, {"prompt": [[1], [2, 3]]},
    {"guided_json": True}, {"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}},
                                            "$defs": {"x": {"type": "string"}}}},
    {"response_format": {"type": "structural_tag", "structures": []}},
    {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"},
    {"temperature": 0, "top_k": -1, "seed": -5, "stop": None, "max_tokens": None, "stream": False,
     "logit_bias": {"50256": -100}, "unknown_extra": [1, {"deep": True}], "user": "u", "mock": {"fatal": True}},
])
def test_ordinary_requests_pass(body: dict[str, Any]) -> None:
    check_body(body, CHAT)


def test_every_check_is_a_known_openai_or_vllm_field() -> None:
    assert {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "response_format",
            "structured_outputs", "n", "max_tokens", "logprobs", "stop"} <= set(CHECKS)
    assert "mock" not in CHECKS  # the mock backend's controls are its own


def test_jsonschema_is_imported_only_for_a_body_with_a_schema() -> None:
    code = ("import sys; from inferq.queue.engine_body import check_body; "
            "check_body({'model': 'm', 'messages': [{'role': 'user', 'content': 'x'}], 'max_tokens': 5}, "
            "'/v1/chat/completions'); assert 'jsonschema' not in sys.modules; "
            "check_body({'guided_json': {'type': 'string'}}, '/v1/chat/completions'); "
            "assert 'jsonschema' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_batch_input_line_the_engine_cannot_take_is_an_invalid_body_line_error() -> None:
    import json

    from inferq.batches.lines import parse_line

    good = {"custom_id": "a", "method": "POST", "url": CHAT, "body": {"model": "m", "messages": [
        {"role": "user", "content": "x"}], "guided_choice": ["y", "n"]}}
    request, error = parse_line(json.dumps(good).encode(), CHAT, 1)
    assert error is None and request == good
    bad = {**good, "body": {**good["body"], "guided_regex": "(", "guided_choice": None}}
    request, error = parse_line(json.dumps(bad).encode(), CHAT, 2)
    assert request is None and error is not None
    assert error.code == "invalid_body" and error.line == 2 and error.message.startswith("body.guided_regex:")
