"""What a job's body may hold (inferq/queue/engine_body.py): an allowlist of fields per endpoint, each value checked
and bounded; every refusal names the field; structured output is parsed (schemas, regexes, grammars, the
whitespace pattern) and bounded; image parts only for a multimodal model, as data: URLs; the removed guided_
fields become structured_outputs, which vLLM 0.32 reads; the schema check is lazy."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

import pytest

from inferq.queue.engine_body import CHAT, COMPLETIONS, REFUSED, BodyError, allowed_fields, check_body

MESSAGES = [{"role": "user", "content": "hi"}]
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
       "AAAABJRU5ErkJggg==")


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": copy.deepcopy(MESSAGES), **fields}


def _field(body: dict[str, Any], url: str = CHAT, **options: Any) -> str:
    with pytest.raises(BodyError) as excinfo:
        check_body(body, url, **options)
    assert str(excinfo.value).startswith(f"body.{excinfo.value.field}: ")
    return excinfo.value.field


# --- issue 47, M1: what the review found accepted


@pytest.mark.parametrize(("fields", "field"), [
    ({"guided_grammar": "((((("}, "guided_grammar"),
    ({"guided_json": {"type": "object"}, "guided_whitespace_pattern": "(["}, "guided_whitespace_pattern"),
    ({"guided_json": {"type": "object"}, "guided_whitespace_pattern": "[ \\n]*x"}, "guided_whitespace_pattern"),
    ({"guided_regex": "(a{65535}){65535}"}, "guided_regex"),
    ({"guided_json": {"type": "string", "minLength": 1e8}}, "guided_json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "array", "minItems": 100000000}}}}, "response_format.json_schema.schema"),
    ({"chat_template_kwargs": {"chat_template": "{{ 7*7 }}"}}, "chat_template_kwargs.chat_template"),
    ({"structural_tag": {"structures": []}}, "structural_tag"),
    ({"response_format": {"type": "structural_tag", "format": {}}}, "response_format.type"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}]},
     "messages[0].content[0].image_url"),
])
def test_what_the_review_found_accepted_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    assert _field(chat(**fields)) == field


def test_vllms_sampling_extras_are_accepted() -> None:
    body = chat(top_k=40, min_p=0.05, repetition_penalty=1.1, seed=1234, response_format={"type": "json_object"},
                min_tokens=1, length_penalty=1.0, bad_words=["x"], ignore_eos=False, truncate_prompt_tokens=-1,
                include_stop_str_in_output=True, skip_special_tokens=True, cache_salt="s")
    check_body(body, CHAT)
    check_body({"prompt": "a", "top_k": -1, "min_p": 0.1, "repetition_penalty": 1.2, "seed": 7, "echo": True,
                "logprobs": 3, "suffix": "!"}, COMPLETIONS)


# --- the allowlist


def test_a_field_no_endpoint_takes_is_refused_not_passed_on() -> None:
    assert _field(chat(some_engine_extra={"kept": True})) == "some_engine_extra"
    assert _field(chat(suffix="x")) == "suffix"  # a completions field
    assert _field({"prompt": "x", "tools": []}, COMPLETIONS) == "tools"  # a chat field
    for name in REFUSED:
        with pytest.raises(BodyError) as refused:
            check_body(chat(**{name: {}}), CHAT)
        assert str(refused.value).startswith(f"body.{name}: not accepted by this gateway"), refused.value


def test_messages_or_prompt_is_required() -> None:
    assert _field({"model": "m"}) == "messages"
    assert _field({"model": "m"}, COMPLETIONS) == "prompt"
    assert _field({"messages": []}) == "messages"
    assert _field({"messages": [{"content": "no role"}]}) == "messages[0]"
    assert _field({"messages": [{"role": "user", "content": "x", "template_var": 1}]}) == "messages[0].template_var"
    assert _field({"messages": [{"role": "user"}]}) == "messages[0].content"
    check_body({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "42"}]}, CHAT)


def test_stream_is_a_field_of_the_front_door_only() -> None:
    assert _field(chat(stream=True)) == "stream"
    check_body(chat(stream=False), CHAT)
    assert _field(chat(stream_options={"include_usage": True})) == "stream_options"
    check_body(chat(stream=True, stream_options={"include_usage": True}), CHAT, streaming=True)
    assert _field(chat(stream=True, stream_options={"x": 1}), streaming=True) == "stream_options"
    assert {"stream", "stream_options"} <= allowed_fields(CHAT, streaming=True)
    assert "stream" not in allowed_fields(CHAT) and "messages" in allowed_fields(CHAT)


@pytest.mark.parametrize(("fields", "field"), [
    ({"n": 0}, "n"), ({"n": True}, "n"), ({"n": 17}, "n"),
    ({"max_tokens": 1.5}, "max_tokens"), ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"top_p": 1.5}, "top_p"), ({"presence_penalty": 3}, "presence_penalty"), ({"top_k": -2}, "top_k"),
    ({"min_p": 2}, "min_p"), ({"repetition_penalty": 0}, "repetition_penalty"), ({"temperature": "hot"}, "temperature"),
    ({"seed": 2**70}, "seed"), ({"stop": [1]}, "stop"), ({"stop": "x" * 2000}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 500}}, "logit_bias"), ({"echo": "yes"}, "echo"), ({"logprobs": 3}, "logprobs"),
    ({"top_logprobs": 21}, "top_logprobs"), ({"model": 3}, "model"), ({"user": "u" * 300}, "user"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"), ({"metadata": {"k": 1}}, "metadata"),
    ({"chat_template_kwargs": {"enable_thinking": [1]}}, "chat_template_kwargs.enable_thinking"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"required": "a"}}}]},
     "tools[0].function.parameters"),
    ({"tool_choice": {"type": "function"}}, "tool_choice"),
    ({"response_format": "json"}, "response_format"), ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x y", "schema": {}}}},
     "response_format.json_schema.name"),
])
def test_each_value_out_of_bounds_is_named(fields: dict[str, Any], field: str) -> None:
    assert _field(chat(**fields)) == field


def test_logprobs_follow_the_endpoint() -> None:
    check_body(chat(logprobs=True, top_logprobs=20), CHAT)
    check_body({"prompt": "x", "logprobs": 20}, COMPLETIONS)
    assert _field({"prompt": "x", "logprobs": False}, COMPLETIONS) == "logprobs"
    assert _field({"prompt": "x", "logprobs": 21}, COMPLETIONS) == "logprobs"


# --- structured output


@pytest.mark.parametrize(("outputs", "field"), [
    ({"json": {"type": "string"}, "regex": "a"}, "structured_outputs"),
    ({}, "structured_outputs"),
    ({"choice": []}, "structured_outputs.choice"),
    ({"regex": "[z-a]"}, "structured_outputs.regex"),
    ({"regex": "(a)\\1"}, "structured_outputs.regex"),  # a backreference: no automaton
    ({"regex": "(?=a)b"}, "structured_outputs.regex"),  # a lookahead
    ({"regex": "a++"}, "structured_outputs.regex"),  # possessive
    ({"regex": "(?i)a"}, "structured_outputs.regex"),  # an inline flag
    ({"regex": "((a{64}){64}){2}"}, "structured_outputs.regex"),  # unrolls past the bound
    ({"grammar": "root: 'lark'"}, "structured_outputs.grammar"),
    ({"grammar": 'root ::= "a" missing'}, "structured_outputs.grammar"),
    ({"grammar": 'root ::= ("a"{100}){100}'}, "structured_outputs.grammar"),
    ({"json": {"type": "string", "pattern": "(a{2000})"}}, "structured_outputs.json"),
    ({"json": {"$ref": "https://example.com/schema.json"}}, "structured_outputs.json"),
    ({"json": {"type": "object", "properties": {"a": {"maxLength": 1.5}}}}, "structured_outputs.json"),
    ({"json": {"enum": list(range(2000))}}, "structured_outputs.json"),
    ({"json": {"type": "object"}, "whitespace_pattern": "[ a]*"}, "structured_outputs.whitespace_pattern"),
    ({"json": {"type": "object"}, "backend": "xgrammar"}, "structured_outputs.backend"),
])
def test_structured_outputs_are_parsed_and_bounded(outputs: dict[str, Any], field: str) -> None:
    assert _field(chat(structured_outputs=outputs)) == field


@pytest.mark.parametrize("outputs", [
    {"json": {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "string",
                                                                                           "maxLength": 64}}}},
    {"json": '{"type": "string", "pattern": "^[a-z]{1,8}$"}'},
    {"regex": r"\d{3}-[a-z]+(?:\.[a-z]{2,})?"},
    {"regex": "(?P<year>[0-9]{4})-(?P<month>[0-9]{2})"},
    {"choice": ["yes", "no"]},
    {"grammar": 'root ::= item ("," item)*\nitem ::= [a-z]+ | "\\"" [^"]* "\\""  # strings too\n'},
    {"json_object": True, "disable_any_whitespace": True},
    {"json": {"type": "object"}, "whitespace_pattern": "[ \\t\\n]{0,4}"},
])
def test_bounded_structured_outputs_pass(outputs: dict[str, Any]) -> None:
    check_body(chat(structured_outputs=outputs), CHAT)


def test_the_guided_fields_vllm_no_longer_reads_become_structured_outputs() -> None:
    body = chat(guided_json={"type": "object"}, guided_whitespace_pattern="[ ]*")
    check_body(body, CHAT)
    assert body == chat(structured_outputs={"json": {"type": "object"}, "whitespace_pattern": "[ ]*"})
    for name, key, value in (("guided_regex", "regex", "a+"), ("guided_choice", "choice", ["y", "n"]),
                             ("guided_grammar", "grammar", 'root ::= "x"')):
        body = chat(**{name: value})
        check_body(body, CHAT)
        assert body == chat(structured_outputs={key: value})
    assert _field(chat(guided_json={"type": "string"}, guided_regex="a+")) == "guided_regex"
    assert _field(chat(guided_regex="a", structured_outputs={"regex": "b"})) == "guided_regex"
    assert _field(chat(guided_whitespace_pattern=" *")) == "guided_whitespace_pattern"  # nothing to apply it to
    assert _field(chat(guided_decoding_backend="outlines")) == "guided_decoding_backend"


# --- content parts


def test_image_parts_only_for_a_multimodal_model_and_only_as_data_urls() -> None:
    parts = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": PNG}}]
    body = chat(messages=[{"role": "user", "content": parts}])
    assert _field(copy.deepcopy(body)) == "messages[0].content[1].image_url"
    check_body(copy.deepcopy(body), CHAT, multimodal=True)
    for url in ("https://example.com/cat.png", "http://169.254.169.254/latest/meta-data/", "file:///etc/passwd",
                "data:text/html;base64,PGh0bWw+"):
        remote = chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
        assert _field(remote, multimodal=True) == "messages[0].content[0].image_url.url"
    for kind in ("input_audio", "video_url", "file", "image_embeds"):
        other = chat(messages=[{"role": "user", "content": [{"type": kind, kind: {}}]}])
        assert _field(other, multimodal=True) == "messages[0].content[0]"


# --- laziness, batch lines


def test_jsonschema_is_imported_only_for_a_body_with_a_schema() -> None:
    code = ("import sys; from inferq.queue.engine_body import check_body; "
            "check_body({'model': 'm', 'messages': [{'role': 'user', 'content': 'x'}], 'max_tokens': 5}, "
            "'/v1/chat/completions'); assert 'jsonschema' not in sys.modules; "
            "check_body({'messages': [{'role': 'user', 'content': 'x'}], 'guided_json': {'type': 'string'}}, "
            "'/v1/chat/completions'); assert 'jsonschema' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_batch_input_line_is_checked_as_a_submit_is() -> None:
    from inferq.batches.lines import parse_line

    good = {"custom_id": "a", "method": "POST", "url": CHAT, "body": chat(guided_choice=["y", "n"])}
    request, error = parse_line(json.dumps(good).encode(), CHAT, 1)
    assert error is None and request is not None
    assert request["body"] == chat(structured_outputs={"choice": ["y", "n"]})  # what the engine honours
    bad = {**good, "body": chat(guided_regex="(", top_k=5)}
    request, error = parse_line(json.dumps(bad).encode(), CHAT, 2)
    assert request is None and error is not None
    assert error.code == "invalid_body" and error.line == 2 and error.message.startswith("body.guided_regex:")
    image = {**good, "body": chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": PNG}}]}])}
    assert parse_line(json.dumps(image).encode(), CHAT, 3)[1] is not None
    assert parse_line(json.dumps(image).encode(), CHAT, 3, lambda model: model == "m")[1] is None
