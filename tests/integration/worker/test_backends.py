"""The backends' contracts: the mock's echo and controls, how errors are classified, the OpenAI backend's HTTP
behaviour (through httpx's mock transport) and the vLLM backend's translation (through a fake engine)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from emulator.valkey import ValkeyProcess
from gpu_worker.backends import build_backend
from gpu_worker.backends.base import (
    EngineDied,
    FatalError,
    RetryableError,
    check_status,
    child_traceparent,
    strip_mock,
    trace_id,
)
from gpu_worker.backends.mock import MockBackend
from gpu_worker.backends.openai import OpenAIBackend
from gpu_worker.backends.vllm import VllmBackend, sampling_arguments
from inferq.config.settings import Settings, SettingsError
from inferq.queue.jobs import Job, JobStatus
from inferq.queue.protocol import Queue
from inferq.redis.coalescing import Coalescer
from tests.support.waiting import eventually_async

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def make_job(body: dict[str, Any], *, url: str = "/v1/chat/completions", attempts: int = 1, deliveries: int = 1,
             job_id: str = "job_test") -> Job:
    return Job(id=job_id, tenant="acme", status=JobStatus.RUNNING, url=url, body=body, attempts=attempts,
               deliveries=deliveries, created_at=1764400000.5)


async def call(backend: Any, job: Job) -> tuple[int, Any]:
    result: tuple[int, Any] = await backend.complete(job.url, job.body, timeout_s=5, traceparent=TRACE, job=job)
    return result


# ------------------------------------------------------------------ classification


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_timeouts_rate_limits_and_server_errors_are_retryable(status: int) -> None:
    with pytest.raises(RetryableError) as caught:
        check_status(status, {"error": {"message": "busy"}})
    assert caught.value.status_code == status
    assert caught.value.to_error("backend_error") == {"type": "backend_error",
                                                      "message": f"model server answered {status}: busy"}


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_other_client_errors_are_fatal(status: int) -> None:
    with pytest.raises(FatalError) as caught:
        check_status(status, {"object": "error", "message": "bad request"})
    error = caught.value.to_error("model_error")
    assert error == {"type": "model_error", "message": f"model server answered {status}: bad request"}


def test_success_passes_through() -> None:
    assert check_status(200, {"ok": True}) == (200, {"ok": True})


def test_traceparent_keeps_the_trace_and_makes_a_new_span() -> None:
    child = child_traceparent(TRACE)
    assert trace_id(child) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert child != TRACE and child.endswith("-01")
    fresh = child_traceparent(None)
    assert trace_id(fresh) is not None and trace_id(fresh) != trace_id(TRACE)
    assert trace_id("garbage") is None
    assert trace_id(child_traceparent("00-" + "0" * 32 + "-00f067aa0ba902b7-01")) != "0" * 32


def test_strip_mock_removes_only_the_mock_controls() -> None:
    body = {"model": "m", "mock": {"latency_ms": 5}}
    assert strip_mock(body) == {"model": "m"}
    assert body == {"model": "m", "mock": {"latency_ms": 5}}


# ------------------------------------------------------------------ mock backend contract


@pytest.fixture
async def mock(queue: Queue) -> MockBackend:
    return MockBackend(queue.redis, queue.keys)


async def test_mock_echoes_the_last_user_message_as_a_chat_completion(mock: MockBackend, queue: Queue) -> None:
    body = {"model": "llama", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": [{"type": "text", "text": "second"}, {"type": "text", "text": "question"}]},
    ]}
    status, answer = await call(mock, make_job(body))
    assert status == 200
    assert answer == {
        "id": "chatcmpl-job_test", "object": "chat.completion", "created": 1764400000, "model": "llama",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "second question"},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10},
    }
    assert (await call(mock, make_job(body)))[1] == answer  # deterministic
    assert await queue.redis.hget(queue.keys.mock_calls, "job_test") == "2"


async def _script_runs(queue: Queue) -> int:
    return int((await queue.redis.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0))


async def test_mock_counts_the_calls_of_one_turn_in_one_script_run_and_a_resent_run_counts_nothing(
    mock: MockBackend, queue: Queue
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    await call(mock, make_job(body, job_id="job_warm"))  # the script is loaded
    before = await _script_runs(queue)
    jobs = [make_job(body, job_id=f"job_{i % 5}") for i in range(10)]
    await asyncio.gather(*(call(mock, job) for job in jobs))
    assert await _script_runs(queue) - before == 1
    assert await queue.redis.hgetall(queue.keys.mock_calls) == {"job_warm": "1", **{f"job_{i}": "2" for i in range(5)}}
    # a run sent again with the same batch token (a resend after a timeout) answers the same counts, adds none
    assert await mock._count(["job_0", "job_1", "job_new"], token="token-a") == [3, 3, 1]
    assert await mock._count(["job_0", "job_1", "job_new"], token="token-a") == [3, 3, 1]
    assert await queue.redis.hgetall(queue.keys.mock_calls) == {
        "job_warm": "1", "job_0": "3", "job_1": "3", "job_new": "1", **{f"job_{i}": "2" for i in range(2, 5)}}
    # and one token key per run, not per call
    assert len([k async for k in queue.redis.scan_iter(f"{queue.keys.mock_calls}:*")]) == 3


async def _counted(queue: Queue, job_id: str) -> bool:
    return await queue.redis.hget(queue.keys.mock_calls, job_id) == "1"


async def test_mock_counts_a_call_alongside_its_latency_and_answers_or_fails_only_once_counted(
    mock: MockBackend, queue: Queue
) -> None:
    # the count is written while the simulated model time runs: no instrumentation round trip in a job's latency
    slow = {"messages": [{"role": "user", "content": "x"}], "mock": {"latency_ms": 5000}}
    running = asyncio.create_task(call(mock, make_job(slow, job_id="job_slow")))
    await eventually_async(lambda: _counted(queue, "job_slow"), what="the slow call counted", timeout=4)
    assert not running.done()
    running.cancel()  # an aborted call stays counted once
    with pytest.raises(asyncio.CancelledError):
        await running

    # a call cancelled before its count was even sent is still counted
    cancelled = asyncio.create_task(call(mock, make_job(slow, job_id="job_cancelled")))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await mock._calls.wait_idle()
    assert await queue.redis.hget(queue.keys.mock_calls, "job_cancelled") == "1"

    # with the count held back, no answer and no failure comes before it is written
    gate = asyncio.Event()
    count = mock._count

    waiting_for_count: set[str] = set()

    async def held(calls: list[str]) -> list[int]:
        waiting_for_count.update(calls)
        await gate.wait()
        return await count(calls)

    mock._calls = Coalescer(held)
    bodies = {
        "job_ok": {"messages": [{"role": "user", "content": "x"}], "mock": {"latency_ms": 1}},
        "job_fatal": {"messages": [{"role": "user", "content": "x"}], "mock": {"fatal": True}},
        "job_retry": {"messages": [{"role": "user", "content": "x"}], "mock": {"fail_attempts": 1}},
        "job_bad": {"messages": [{"role": "user", "content": "x"}], "mock": {"latency_ms": "slow"}},
    }
    calls = {job_id: asyncio.create_task(call(mock, make_job(body, job_id=job_id))) for job_id, body in bodies.items()}
    long = asyncio.create_task(call(mock, make_job(slow, job_id="job_long")))
    await eventually_async(lambda: waiting_for_count >= {*bodies, "job_long"},
                           what="every call waiting for its count")
    assert not any(task.done() for task in calls.values())
    assert (await mock.load()).running == 1  # the long call's model time runs while its count is held
    gate.set()
    long.cancel()
    assert (await calls["job_ok"])[0] == 200
    for job_id, error in (("job_fatal", FatalError), ("job_retry", RetryableError), ("job_bad", FatalError)):
        with pytest.raises(error):
            await calls[job_id]
    await mock._calls.wait_idle()
    assert {job_id: await queue.redis.hget(queue.keys.mock_calls, job_id) for job_id in [*bodies, "job_long"]} == (
        dict.fromkeys([*bodies, "job_long"], "1"))


async def test_mock_echoes_the_prompt_as_a_text_completion(mock: MockBackend) -> None:
    job = make_job({"model": "m", "prompt": "once upon a time"}, url="/v1/completions")
    _, answer = await call(mock, job)
    assert answer["object"] == "text_completion"
    assert answer["choices"] == [{"index": 0, "text": "once upon a time", "logprobs": None, "finish_reason": "stop"}]
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    _, many = await call(mock, make_job({"prompt": ["a b", "c"], "max_tokens": 1}, url="/v1/completions"))
    assert [(c["text"], c["finish_reason"]) for c in many["choices"]] == [("a", "length"), ("c", "stop")]


async def test_mock_fails_the_first_attempts_then_answers(mock: MockBackend) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "mock": {"fail_attempts": 2}}
    for attempt in (1, 2):
        with pytest.raises(RetryableError):
            await call(mock, make_job(body, attempts=attempt))
    assert (await call(mock, make_job(body, attempts=3)))[0] == 200


async def test_mock_fatal_is_a_non_retryable_400(mock: MockBackend) -> None:
    with pytest.raises(FatalError) as caught:
        await call(mock, make_job({"messages": [{"role": "user", "content": "x"}], "mock": {"fatal": True}}))
    assert caught.value.status_code == 400


async def test_mock_latency_is_an_asyncio_sleep(mock: MockBackend) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "mock": {"latency_ms": 200}}
    # ten calls at once are all in flight together, and the loop runs other work while they sleep
    calls = [asyncio.create_task(call(mock, make_job(body, job_id=f"job_{i}"))) for i in range(10)]
    ticks = 0
    while ticks < 5:
        await asyncio.sleep(0.01)
        ticks += 1
    assert not any(c.done() for c in calls)  # the loop ticked five times while every call still waits its 200 ms
    results = await asyncio.gather(*calls)
    assert [status for status, *_ in results] == [200] * 10


async def test_mock_hang_never_returns_until_cancelled(mock: MockBackend, queue: Queue) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "mock": {"hang": True}}
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(call(mock, make_job(body)), 0.3)
    assert await queue.redis.hget(queue.keys.mock_calls, "job_test") == "1"


async def test_mock_rejects_bad_controls_and_bodies(mock: MockBackend) -> None:
    with pytest.raises(FatalError):
        await call(mock, make_job({"messages": [{"role": "user", "content": "x"}], "mock": {"latency_ms": "slow"}}))
    with pytest.raises(FatalError):
        await call(mock, make_job({"messages": []}))
    with pytest.raises(FatalError) as caught:
        await call(mock, make_job({"prompt": "x"}, url="/v1/embeddings"))
    assert caught.value.status_code == 404


# ------------------------------------------------------------------ openai backend


@dataclass
class FakeServer:
    answers: list[Any] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if self.answers else (200, {"object": "chat.completion"})
        if isinstance(answer, Exception):
            raise answer
        status, body = answer
        return httpx.Response(status, json=body)


def openai_backend(server: FakeServer, **options: Any) -> OpenAIBackend:
    return OpenAIBackend("http://model:8000", window=4, transport=httpx.MockTransport(server.handle), **options)


async def test_openai_backend_posts_the_request_without_mock_with_trace_and_key() -> None:
    server = FakeServer()
    backend = openai_backend(server, api_key="sk-test")
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "mock": {"latency_ms": 1}}
    assert await call(backend, make_job(body)) == (200, {"object": "chat.completion"})
    request = server.requests[0]
    assert str(request.url) == "http://model:8000/v1/chat/completions"
    assert json.loads(request.content) == {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert request.headers["traceparent"] == TRACE
    assert request.headers["authorization"] == "Bearer sk-test"
    await backend.aclose()


async def test_openai_backend_classifies_answers_and_transport_errors() -> None:
    server = FakeServer(answers=[
        (400, {"object": "error", "message": "prompt too long", "code": 400}),
        (503, {"error": {"message": "overloaded"}}),
        (429, {"error": {"message": "slow down"}}),
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
    ])
    backend = openai_backend(server)
    job = make_job({"messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(FatalError) as fatal:
        await call(backend, job)
    assert fatal.value.status_code == 400 and fatal.value.message == "prompt too long"
    assert fatal.value.body == {"object": "error", "message": "prompt too long", "code": 400}
    for _ in range(4):
        with pytest.raises(RetryableError):
            await call(backend, job)
    await backend.aclose()


async def test_openai_backend_pool_is_sized_to_the_window() -> None:
    backend = OpenAIBackend("http://model:8000", window=7)
    pool = backend._client._transport._pool  # type: ignore[attr-defined]
    assert pool._max_connections == 7
    await backend.aclose()


# ------------------------------------------------------------------ vllm backend (fake engine)


@dataclass
class FakeCompletion:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str


@dataclass
class FakeOutput:
    prompt_token_ids: list[int]
    outputs: list[FakeCompletion]


class FakeTokenizer:
    def apply_chat_template(
        self, messages: list[dict[str, Any]], *, tokenize: bool, add_generation_prompt: bool
    ) -> str:
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class FakeEngine:
    def __init__(self, *, fail: Exception | None = None, hang: bool = False) -> None:
        self.calls: list[tuple[Any, dict[str, Any], str]] = []
        self.aborted: list[str] = []
        self.fail = fail
        self.hang = hang

    async def generate(self, prompt: Any, params: dict[str, Any], request_id: str) -> Any:
        self.calls.append((prompt, params, request_id))
        if self.fail:
            raise self.fail
        if self.hang:
            await asyncio.Event().wait()
        yield FakeOutput([1, 2, 3], [FakeCompletion(0, "par", [7], "")])
        yield FakeOutput([1, 2, 3], [FakeCompletion(0, "partial answer", [7, 8], "length")])

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def vllm_backend(engine: FakeEngine) -> VllmBackend:
    return VllmBackend(engine, FakeTokenizer(), "served-model", lambda **kwargs: kwargs)


async def test_vllm_backend_applies_the_chat_template_and_answers_like_openai() -> None:
    engine = FakeEngine()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0,
            "ignore_eos": True, "mock": {"fatal": True}, "user": "u1"}
    status, answer = await call(vllm_backend(engine), make_job(body))
    prompt, params, _ = engine.calls[0]
    assert prompt == "<user>hi<assistant>"
    assert params == {"max_tokens": 2, "temperature": 0, "ignore_eos": True}
    assert status == 200
    assert answer["object"] == "chat.completion" and answer["model"] == "served-model"
    assert answer["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "partial answer"},
                                  "logprobs": None, "finish_reason": "length"}]
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


async def test_vllm_backend_completions_take_a_prompt_or_token_ids() -> None:
    engine = FakeEngine()
    backend = vllm_backend(engine)
    _, answer = await call(backend, make_job({"model": "m", "prompt": ["once"]}, url="/v1/completions"))
    assert engine.calls[0][0] == "once" and engine.calls[0][1] == {"max_tokens": 16}
    assert answer["object"] == "text_completion" and answer["choices"][0]["text"] == "partial answer"
    await call(backend, make_job({"prompt": [5, 6]}, url="/v1/completions"))
    assert engine.calls[1][0] == {"prompt_token_ids": [5, 6]}
    with pytest.raises(FatalError):
        await call(backend, make_job({"prompt": ["a", "b"]}, url="/v1/completions"))
    assert sampling_arguments("/v1/chat/completions", {})["max_tokens"] is None


async def test_vllm_backend_maps_engine_errors() -> None:
    with pytest.raises(FatalError) as fatal:
        await call(vllm_backend(FakeEngine(fail=ValueError("prompt is longer than the model"))), make_job(
            {"messages": [{"role": "user", "content": "x"}]}))
    assert fatal.value.status_code == 400
    with pytest.raises(RetryableError):
        await call(vllm_backend(FakeEngine(fail=RuntimeError("engine dead"))), make_job(
            {"messages": [{"role": "user", "content": "x"}]}))


class EngineDeadError(RuntimeError):
    """Named as vLLM's (``vllm.v1.engine.exceptions.EngineDeadError``): the backend matches it by name."""


async def test_vllm_backend_tells_a_dead_engine_from_a_failed_request() -> None:
    chat = make_job({"messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(EngineDied):
        await call(vllm_backend(FakeEngine(fail=EngineDeadError("EngineCore encountered an issue"))), chat)
    errored = FakeEngine(fail=RuntimeError("background loop stopped"))
    errored.errored = True  # type: ignore[attr-defined]  # AsyncLLM.errored: the engine is dead
    with pytest.raises(EngineDied):
        await call(vllm_backend(errored), chat)
    with pytest.raises(RetryableError) as retryable:
        await call(vllm_backend(FakeEngine(fail=RuntimeError("a request failed"))), chat)
    assert not isinstance(retryable.value, EngineDied)


async def test_vllm_backend_aborts_the_request_when_cancelled() -> None:
    engine = FakeEngine(hang=True)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(call(vllm_backend(engine), make_job({"messages": [{"role": "user", "content": "x"}]})),
                               0.2)
    assert engine.aborted == [engine.calls[0][2]]


async def test_vllm_backend_is_imported_only_when_chosen(settings: Settings, queue: Queue) -> None:
    with pytest.raises(SettingsError, match="INFERQ_VLLM_MODEL"):
        await build_backend(settings.replace(backend="vllm"), queue.redis)
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="vllm"):
            await build_backend(settings.replace(backend="vllm", vllm_model="/models/x"), queue.redis)
    assert (await build_backend(settings, queue.redis)).name == "mock"


# ------------------------------------------------------------------ hiredis packing


def test_hiredis_packing_sends_the_same_bytes_as_redis_py() -> None:
    from redis.asyncio.connection import Connection
    from redis.exceptions import DataError

    from inferq.redis.fastpack import HiredisPacking

    class Packing(HiredisPacking, Connection):
        pass

    plain, fast = Connection(), Packing()
    for args in [("SET", "k", "v"), ("EVALSHA", "abc", 2, "k1", "k2", 1.5, 0.1, 10**20, -3, b"raw", "ünï"),
                 ("CLIENT SETNAME", "x"), (b"CLIENT SETNAME", "x")]:
        assert b"".join(fast.pack_command(*args)) == b"".join(plain.pack_command(*args))
    with pytest.raises(DataError):
        fast.pack_command("SET", "k", None)


async def test_every_connection_inferq_opens_packs_with_hiredis(queue: Queue) -> None:
    from inferq.redis.fastpack import HiredisPacking, use_hiredis_packing

    client = Queue.connect(queue.settings).redis  # the gateway's, the worker's and the scaler's clients alike
    assert issubclass(client.connection_pool.connection_class, HiredisPacking)
    assert use_hiredis_packing(client) and use_hiredis_packing(client)
    assert issubclass(client.connection_pool.connection_class, HiredisPacking)
    assert await client.set("packed", "yes") and await client.get("packed") == "yes"
    await client.aclose()


async def test_a_cluster_client_packs_with_hiredis_too(valkey_cluster: ValkeyProcess) -> None:
    """ElastiCache Serverless is always cluster mode: the nodes it knows at start and those it finds later (built
    from the client's connection settings) pack with hiredis, and what they send is what redis-py would."""
    from inferq.redis.fastpack import HiredisPacking

    client = Queue.connect(Settings(redis_url=valkey_cluster.url, queue="packed")).redis
    assert client.nodes_manager.connection_kwargs["connection_class"] is not None
    assert issubclass(client.nodes_manager.connection_kwargs["connection_class"], HiredisPacking)
    assert await client.set("{packed}k", "yes") and await client.get("{packed}k") == "yes"
    assert await client.hmget("{packed}h", ["a", "b"]) == [None, None]
    nodes = client.get_nodes()
    assert nodes and all(issubclass(node.connection_class, HiredisPacking) for node in nodes)
    async with client.pipeline() as pipe:
        pipe.set("{packed}p", "1").incr("{packed}p")
        assert await pipe.execute() == [True, 2]
    await client.aclose()
