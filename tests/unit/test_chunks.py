"""Streamed chunks put back together (gpu_worker/backends/chunks.py): tool calls by index, logprobs, completions."""

from __future__ import annotations

from gpu_worker.backends.chunks import Assembly, sse_data


def test_only_data_lines_carry_a_payload() -> None:
    assert sse_data("data: {}") == "{}" and sse_data("data:[DONE]") == "[DONE]"
    assert sse_data(": ping") is None and sse_data("event: x") is None and sse_data("") is None


def test_tool_calls_arguments_and_logprobs_are_joined() -> None:
    a = Assembly("/v1/chat/completions")
    top = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\""}}
    more = {"index": 0, "function": {"arguments": ": 1}"}}
    a.add({**top, "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]},
                               "logprobs": {"content": [{"token": "x"}]}}]})
    a.add({**top, "choices": [{"index": 0, "delta": {"tool_calls": [more]}, "logprobs": {"content": [{"token": "y"}]},
                               "finish_reason": "tool_calls"}]})
    answer = a.answer()
    message = answer["choices"][0]["message"]
    assert message == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}
    assert answer["choices"][0]["logprobs"] == {"content": [{"token": "x"}, {"token": "y"}]}
    assert answer["choices"][0]["finish_reason"] == "tool_calls" and answer["object"] == "chat.completion"


def test_completions_join_text_per_choice_and_report_the_first_choices_text() -> None:
    a = Assembly("/v1/completions")
    added = a.add({"id": "x", "object": "text_completion", "created": 1, "model": "m",
                   "choices": [{"index": 1, "text": "B"}, {"index": 0, "text": "A"}]})
    assert added == [(1, "B"), (0, "A")]
    a.add({"choices": [{"index": 0, "text": "a", "finish_reason": "stop", "stop_reason": None}],
           "usage": None})
    answer = a.answer()
    assert [c["text"] for c in answer["choices"]] == ["Aa", "B"]
    assert answer["choices"][0]["stop_reason"] is None and answer["choices"][1]["finish_reason"] is None
    assert list(answer)[:4] == ["id", "object", "created", "model"]
