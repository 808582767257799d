"""A job that kills the model server is poison (issue 40): with the openai backend against a small model server on
loopback (real sockets) that drops the connection and dies on one prompt, the job is dead-lettered after its first
attempt with error type ``engine_died``, never handed to another worker; a connection that drops while the server
stays healthy is an ordinary retry. Log lines carry a digest of the error, never the prompt."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpu_worker.backends.openai import OpenAIBackend
from gpu_worker.worker import Worker
from inferq.config.settings import Settings
from inferq.queue.protocol import Queue
from tests.support.waiting import eventually_async

from .support import chat, running_worker, submit, terminal

POISON = "poison-prompt-7f3a: please crash"
FLAKY = "flaky-prompt-91bc"
SLOW = "slow-prompt-c4d2"


class ModelServer:
    """An OpenAI-compatible server on 127.0.0.1 (asyncio streams): ``POST /v1/chat/completions`` answers a
    completion; a request whose prompt holds :data:`POISON` gets its connection dropped and the server dies (every
    connection dropped, its listener closed: health and everything after is refused, until :meth:`start` again);
    one holding :data:`FLAKY` has its connection dropped once while the server stays up; one holding :data:`SLOW`
    is answered after half a second the first time."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.health_checks = 0
        self.dead = False
        self.deaths = 0
        self._flaked = False
        self._slowed = False
        self.slow_answers = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.dead = False
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _hold_poison(self) -> None:
        """Order the deaths for the shared-server test: the first comes while a :data:`SLOW` request is in flight
        (a bystander), a later one only once that request has been answered (the bystander is done)."""
        for _ in range(100):
            if (self.deaths == 0 and self._slowed) or (self.deaths > 0 and self.slow_answers) \
                    or not any(SLOW in p for p in self.prompts):
                return
            await asyncio.sleep(0.01)

    def _die(self) -> None:
        self.dead = True
        self.deaths += 1
        for writer in self._writers:
            writer.transport.abort()
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while not self.dead:
                request = await reader.readline()
                if not request:
                    break
                method, path, _ = request.decode().split(" ", 2)
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                body = json.loads(await reader.readexactly(length)) if length else None
                if path == "/health":
                    self.health_checks += 1
                    await self._answer(writer, 200, {})
                elif path == "/metrics":
                    await self._answer(writer, 404, {})
                elif method == "POST" and path == "/v1/chat/completions":
                    prompt = body["messages"][-1]["content"]
                    self.prompts.append(prompt)
                    if POISON in prompt:  # the engine dies with the request: no answer, no server
                        await self._hold_poison()
                        self._die()
                        return
                    if SLOW in prompt and not self._slowed:
                        self._slowed = True
                        await asyncio.sleep(0.5)
                        if self.dead:
                            return
                    if SLOW in prompt:
                        self.slow_answers += 1
                    if FLAKY in prompt and not self._flaked:
                        self._flaked = True
                        writer.transport.abort()
                        return
                    await self._answer(writer, 200, {
                        "id": "chatcmpl-1", "object": "chat.completion", "model": body.get("model"),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
                else:
                    await self._answer(writer, 404, {"error": {"message": "no route"}})
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    @staticmethod
    async def _answer(writer: asyncio.StreamWriter, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (status, len(data), data))
        await writer.drain()


@pytest.fixture
async def model_server() -> AsyncIterator[ModelServer]:
    server = ModelServer()
    await server.start()
    yield server
    await server.close()


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # attempts enough to outlast a dead server's refusals: a refused connection is an ordinary retry
    return settings.replace(backend="openai", max_attempts=20, max_deliveries=5, retry_base_ms=10, retry_max_ms=50)


async def test_a_job_that_kills_the_model_server_is_dead_lettered_once_and_never_retried(
    settings: Settings, queue: Queue, model_server: ModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    backend = OpenAIBackend(model_server.base_url, window=2)
    job = await submit(queue, chat(POISON))
    with caplog.at_level(logging.DEBUG):
        worker = Worker(settings, queue, backend)
        await asyncio.wait_for(worker.run(), 30)  # it stops on its own: its model server is dead
        ended = await terminal(queue, job.id, timeout=1)
    await backend.aclose()

    assert worker.failure == "the model server died"  # python -m gpu_worker exits 1: the task is replaced
    assert ended.status.value == "failed" and ended.dead_lettered and ended.attempts == 1
    assert ended.error is not None and ended.error["type"] == "engine_died"
    assert model_server.prompts == [POISON]  # one delivery, one call: no other worker was handed it
    [(_, entry)] = await queue.redis.xrange(queue.keys.dlq)
    assert entry["job"] == job.id and entry["reason"] == "engine_died"
    assert await queue.redis.xlen(queue.keys.stream) == 0 and await queue.redis.zcard(queue.keys.delayed) == 0
    assert "poison-prompt-7f3a" not in caplog.text
    assert any(getattr(r, "error_digest", None) for r in caplog.records if "model server died" in r.message)


async def test_a_connection_dropped_while_the_server_stays_healthy_is_an_ordinary_retry(
    settings: Settings, queue: Queue, model_server: ModelServer
) -> None:
    backend = OpenAIBackend(model_server.base_url, window=2)
    job = await submit(queue, chat(FLAKY))
    async with running_worker(settings, queue, backend):
        ended = await terminal(queue, job.id, timeout=20)
    await backend.aclose()

    assert ended.status.value == "succeeded" and ended.attempts == 2 and not ended.dead_lettered
    assert model_server.prompts == [FLAKY, FLAKY] and model_server.health_checks >= 1
    assert await queue.redis.xlen(queue.keys.dlq) == 0


async def test_a_server_that_was_never_reached_is_an_ordinary_retry_not_poison(
    settings: Settings, queue: Queue, model_server: ModelServer
) -> None:
    await model_server.close()  # nothing listens: connection refused before any request was sent
    backend = OpenAIBackend(model_server.base_url, window=2)
    job = await submit(queue, chat("hello"))

    async def retried_twice() -> bool:
        return int(await queue.redis.hget(queue.keys.job(job.id), "attempts") or 0) >= 3

    async with running_worker(settings, queue, backend):
        await eventually_async(retried_twice, what="two retries", timeout=20)
    await backend.aclose()

    record = await queue.redis.hgetall(queue.keys.job(job.id))
    assert record.get("dead_lettered") != "1" and "strikes" not in record
    assert json.loads(record["last_error"])["type"] == "backend_error"
    assert await queue.redis.xlen(queue.keys.dlq) == 0


async def test_a_job_that_shared_the_dying_server_is_retried_and_the_one_that_kills_it_again_is_dead_lettered(
    settings: Settings, queue: Queue, model_server: ModelServer
) -> None:
    """Two jobs at the server when it dies: either may be the cause, so each gets a strike and is retried (after a
    backoff that outlasts the server's restart, as ECS replaces a task). The bystander then succeeds; the culprit
    kills the restarted server too, and its second strike dead-letters it."""
    backend = OpenAIBackend(model_server.base_url, window=2)
    bystander = await submit(queue, chat(SLOW))
    culprit = await submit(queue, chat(POISON))

    async def restart_after_each_death() -> None:
        seen = 0
        while True:
            if model_server.deaths > seen:
                seen = model_server.deaths
                await asyncio.sleep(1.5)  # past the worker's health probes: the server is dead to them
                await model_server.start()
            await asyncio.sleep(0.02)

    restarter = asyncio.create_task(restart_after_each_death())
    workers = 0
    try:
        while not (await queue.get(bystander.id)).status.terminal or not (await queue.get(culprit.id)).status.terminal:
            workers += 1  # each worker stops when its model server dies; the next one is its task's replacement
            worker = Worker(settings.replace(retry_base_ms=300, retry_max_ms=800), queue, backend, burst=True)
            await asyncio.wait_for(worker.run(), 30)
        first, second = await terminal(queue, bystander.id, 1), await terminal(queue, culprit.id, 1)
    finally:
        restarter.cancel()
        await backend.aclose()

    assert first.status.value == "succeeded" and not first.dead_lettered and first.attempts >= 2
    assert await queue.redis.hget(queue.keys.job(bystander.id), "strikes") == "1"
    assert second.dead_lettered and second.error is not None and second.error["type"] == "engine_died"
    assert model_server.prompts.count(POISON) == 2 and model_server.deaths == 2 and workers >= 2
    assert [fields["reason"] for _, fields in await queue.redis.xrange(queue.keys.dlq)] == ["engine_died"]
