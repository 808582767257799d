"""The backends' streaming (``output``): the mock's echo in pieces spread over ``latency_ms`` and continued after kept
output; the OpenAI backend's ``stream: true`` request, its chunks put back together and continued (through httpx's
mock transport; tests/integration/vllm has the real server); the in-process vLLM backend's cumulative outputs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from gpu_worker.backends.base import FatalError, RetryableError, continuable, continuation, with_kept
from gpu_worker.backends.mock import MockBackend
from gpu_worker.backends.openai import OpenAIBackend
from inferq.queue.protocol import Queue
from tests.integration.worker.test_backends import TRACE, FakeEngine, make_job, vllm_backend


@dataclass
class Written:
    """An :class:`~gpu_worker.backends.base.Output` that records what is written, and when (loop time)."""

    kept: str = ""
    kept_tokens: int = 0
    pieces: list[str] = field(default_factory=list)
    tokens: int = 0
    at: list[float] = field(default_factory=list)
    expected: int | None = None

    def expect(self, tokens: int) -> None:
        self.expected = tokens

    def write(self, delta: str, tokens: int = 1) -> None:
        import asyncio

        self.pieces.append(delta)
        self.tokens += tokens
        self.at.append(asyncio.get_running_loop().time())

    @property
    def text(self) -> str:
        return self.kept + "".join(self.pieces)


async def stream(backend: Any, body: dict[str, Any], output: Written, url: str = "/v1/chat/completions",
                 **job: Any) -> dict[str, Any]:
    status, answer = await backend.complete(url, body, timeout_s=5, traceparent=TRACE,
                                            job=make_job(body, url=url, **job), output=output)
    assert status == 200
    result: dict[str, Any] = answer
    return result


def chat(text: str, **mock: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "mock": mock}


# ------------------------------------------------------------------ what can stream


def test_one_choice_of_a_chat_or_a_text_prompt_can_stream_and_continue() -> None:
    assert continuable("/v1/chat/completions", chat("hi"))
    assert continuable("/v1/completions", {"prompt": "once"}) and continuable("/v1/completions", {"prompt": ["a"]})
    assert continuable("/v1/chat/completions", {**chat("hi"), "n": 1})
    assert not continuable("/v1/chat/completions", {**chat("hi"), "n": 2})
    assert not continuable("/v1/completions", {"prompt": "a", "best_of": 3})
    assert not continuable("/v1/completions", {"prompt": "a", "echo": True})
    assert not continuable("/v1/completions", {"prompt": [1, 2, 3]})
    assert not continuable("/v1/completions", {"prompt": ["a", "b"]})
    assert not continuable("/v1/embeddings", {"input": "a"})


def test_a_continuation_asks_for_the_rest_and_its_answer_reads_as_the_whole() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    asked = continuation("/v1/chat/completions", body, "Hello", 3)
    assert asked["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert asked["continue_final_message"] is True and asked["add_generation_prompt"] is False
    assert asked["max_tokens"] == 7 and body["max_tokens"] == 10
    assert continuation("/v1/completions", {"prompt": "Say", "max_tokens": 2}, " yes", 5) == {
        "prompt": "Say yes", "max_tokens": 1}
    assert continuation("/v1/completions", {"prompt": ["Say"]}, " yes", 1)["prompt"] == ["Say yes"]
    assert continuation("/v1/chat/completions", body, "", 0) == body
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": " world"}}],
              "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}}
    whole = with_kept("/v1/chat/completions", answer, "Hello", 3)
    assert whole["choices"][0]["message"]["content"] == "Hello world"
    assert whole["usage"] == {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}


# ------------------------------------------------------------------ mock


@pytest.fixture
async def mock(queue: Queue) -> MockBackend:
    return MockBackend(queue.redis, queue.keys)


async def test_the_mock_streams_its_echo_in_pieces_spread_over_its_latency(mock: MockBackend) -> None:
    out = Written()
    answer = await stream(mock, chat("one two three four five six seven eight", latency_ms=400), out)
    assert out.text == answer["choices"][0]["message"]["content"] == "one two three four five six seven eight"
    assert out.pieces == ["one", " two", " three", " four", " five", " six", " seven", " eight"]
    # evenly spread: the last piece comes at the end of the latency, the first an eighth of the way in
    assert out.at[-1] - out.at[0] >= 0.35 * 7 / 8


async def test_the_mock_continues_after_the_kept_output_and_answers_the_echo_once(mock: MockBackend) -> None:
    out = Written(kept="one two", kept_tokens=2)
    answer = await stream(mock, chat("one two three four", latency_ms=40), out, attempts=2)
    assert out.pieces == [" three", " four"]
    assert answer["choices"][0]["message"]["content"] == out.text == "one two three four"
    assert answer["usage"]["completion_tokens"] == 4
    done = Written(kept="one two three four", kept_tokens=4)
    assert (await stream(mock, chat("one two three four", latency_ms=40), done))["choices"][0]["message"][
        "content"] == "one two three four"
    assert done.pieces == []
    with pytest.raises(FatalError, match="kept output"):
        await stream(mock, chat("one two"), Written(kept="other"))


async def test_the_mock_streams_completions_and_an_attempt_that_fails_streams_nothing(mock: MockBackend) -> None:
    out = Written()
    answer = await stream(mock, {"prompt": "a b c", "mock": {"latency_ms": 10}}, out, url="/v1/completions")
    assert out.text == answer["choices"][0]["text"] == "a b c"
    failing = Written()
    with pytest.raises(RetryableError):
        await stream(mock, chat("a b c", latency_ms=10, fail_attempts=1), failing)
    with pytest.raises(FatalError):
        await stream(mock, chat("a b c", fatal=True), failing)
    assert failing.pieces == []


# ------------------------------------------------------------------ openai


def sse(*chunks: Any) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n" for c in chunks)


def chunk(content: str | None = None, *, role: str | None = None, finish: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "tiny",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


USAGE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "tiny", "choices": [],
         "usage": {"prompt_tokens": 9, "total_tokens": 12, "completion_tokens": 3}, "system_fingerprint": "fp"}


def openai_with(*answers: httpx.Response) -> tuple[OpenAIBackend, list[httpx.Request]]:
    seen: list[httpx.Request] = []
    queued = list(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return queued.pop(0)

    return OpenAIBackend("http://model", window=2, transport=httpx.MockTransport(handle)), seen


async def test_the_openai_backend_streams_and_answers_as_unstreamed() -> None:
    body = sse(chunk("", role="assistant"), chunk("Hel"), chunk("lo"), chunk("!", finish=None),
               chunk("", finish="stop"), USAGE, b"[DONE]")
    backend, seen = openai_with(httpx.Response(200, content=body, headers={"content-type": "text/event-stream"}))
    out = Written()
    answer = await stream(backend, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                    "stream_options": {"continuous_usage_stats": False}, "mock": {}}, out)
    sent = json.loads(seen[0].content)
    assert sent["stream"] is True and sent["stream_options"] == {"continuous_usage_stats": False,
                                                                 "include_usage": True}
    assert "mock" not in sent
    assert out.pieces == ["Hel", "lo", "!"] and out.tokens == 3
    assert answer == {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 5, "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "logprobs": None,
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "total_tokens": 12, "completion_tokens": 3}, "system_fingerprint": "fp",
    }
    await backend.aclose()


async def test_the_openai_backend_continues_after_the_kept_output() -> None:
    body = sse(chunk(" world", role="assistant"), chunk("", finish="length"), USAGE, b"[DONE]")
    backend, seen = openai_with(httpx.Response(200, content=body, headers={"content-type": "text/event-stream"}))
    out = Written(kept="Hello", kept_tokens=2)
    answer = await stream(backend, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 5}, out)
    sent = json.loads(seen[0].content)
    assert sent["messages"][-1] == {"role": "assistant", "content": "Hello"} and sent["max_tokens"] == 3
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert answer["choices"][0]["message"]["content"] == "Hello world" == out.text
    assert answer["usage"] == {"prompt_tokens": 7, "total_tokens": 12, "completion_tokens": 5}
    await backend.aclose()


async def test_a_server_that_does_not_stream_is_read_whole() -> None:
    whole = {"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": " b"}}]}
    backend, _ = openai_with(httpx.Response(200, json=whole))
    out = Written(kept="a", kept_tokens=1)
    answer = await stream(backend, chat("x"), out)
    assert out.pieces == [" b"] and answer["choices"][0]["message"]["content"] == "a b"
    await backend.aclose()


async def test_the_openai_backend_classifies_an_error_before_and_during_the_stream() -> None:
    events = {"content-type": "text/event-stream"}
    backend, _ = openai_with(
        httpx.Response(400, json={"error": {"message": "bad", "code": 400}}),
        httpx.Response(200, content=sse(chunk("a"), {"error": {"message": "engine hiccup", "code": 500}}),
                       headers=events),
        httpx.Response(200, content=sse(chunk("a")), headers=events),  # the server stopped without [DONE]
    )
    with pytest.raises(FatalError, match="bad"):
        await stream(backend, chat("x"), Written())
    with pytest.raises(RetryableError, match="engine hiccup"):
        await stream(backend, chat("x"), Written())
    with pytest.raises(RetryableError, match="before"):
        await stream(backend, chat("x"), Written())
    await backend.aclose()


# ------------------------------------------------------------------ vllm in-process


async def test_the_vllm_backend_writes_what_each_cumulative_output_adds() -> None:
    engine = FakeEngine()
    out = Written()
    answer = await stream(vllm_backend(engine), {"messages": [{"role": "user", "content": "hi"}]}, out)
    assert out.pieces == ["par", "tial answer"]
    assert answer["choices"][0]["message"]["content"] == "partial answer"


async def test_the_vllm_backend_continues_a_completion_after_the_kept_output() -> None:
    engine = FakeEngine()
    out = Written(kept="so far ", kept_tokens=2)
    answer = await stream(vllm_backend(engine), {"prompt": "once", "max_tokens": 5}, out, url="/v1/completions")
    prompt, params, _ = engine.calls[0]
    assert prompt == "once" + "so far " and params == {"max_tokens": 3}
    assert answer["choices"][0]["text"] == "so far partial answer" == out.text
    assert answer["usage"] == {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
