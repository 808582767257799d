"""The OpenAI front door through the Lambda entry point (``functions/gateway/app.handler``, Mangum), driven by a real
API Gateway HTTP API (v2) event: behind API Gateway a response is buffered whole, so ``stream: true`` answers the
same events together once the job ends (and the job is not watched: no output is written while it runs); a job not
ended within ``INFERQ_SYNC_WAIT_S`` is the 504; the gateway refuses to start with a wait API Gateway would cut."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from inferq.config.settings import Settings, SettingsError
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Queue
from tests.conftest import load_event

from .test_handler import EVENT_KEY, LambdaContext, _clean_env, _fresh_import
from .test_streams import chat_result


@pytest.fixture
def lambda_app(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Iterator[ModuleType]:
    """``functions.gateway.app`` imported as Lambda imports it (tests/integration/gateway/test_handler.py)."""
    _clean_env(monkeypatch)
    monkeypatch.setenv("INFERQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("INFERQ_QUEUE", settings.queue)
    monkeypatch.setenv("INFERQ_API_KEYS", f"tenant-a:{EVENT_KEY}")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield _fresh_import()
    finally:
        sys.modules.pop("functions.gateway.app", None)
        loop.close()
        asyncio.set_event_loop(None)


def completion_event(stream: bool) -> dict[str, Any]:
    event = copy.deepcopy(load_event("apiGatewayProxyV2SubmitJob.json"))
    path = "/v1/chat/completions"
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream,
                       "stream_options": {"include_usage": True}})
    event["body"] = body
    event["headers"]["content-length"] = str(len(body))
    return event


def serve_one_job(settings: Settings, seen: dict[str, Any]) -> threading.Thread:
    """A worker in a thread of its own: takes the job, notes whether it is watched, ends it."""

    async def work() -> None:
        queue = Queue.connect(settings)
        try:
            while True:
                deliveries, _ = await queue.read("test-worker", 1)
                if deliveries:
                    break
                await asyncio.sleep(0.01)
            seen["watched"] = deliveries[0].job.watched
            await queue.finish(deliveries[0], JobStatus.SUCCEEDED, result=chat_result("Hello world"))
        finally:
            await queue.close()

    thread = threading.Thread(target=lambda: asyncio.run(work()))
    thread.start()
    return thread


def test_stream_true_behind_api_gateway_answers_the_events_together(lambda_app: ModuleType,
                                                                     settings: Settings) -> None:
    seen: dict[str, Any] = {}
    worker = serve_one_job(settings, seen)
    reply = lambda_app.handler(completion_event(stream=True), LambdaContext())
    worker.join(30)
    assert reply["statusCode"] == 200
    assert reply["headers"]["content-type"].startswith("text/event-stream")
    assert reply["headers"]["inferq-job-id"].startswith("job_")
    lines = [line for line in reply["body"].split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "Hello world"
    assert chunks[-1]["usage"]["total_tokens"] == 3
    assert seen["watched"] is False  # nobody reads it as it comes: its worker writes no output meanwhile


def test_behind_api_gateway_a_job_not_ended_in_time_is_504(lambda_app: ModuleType, settings: Settings,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    lambda_app.app.state.gateway.settings = settings.replace(sync_wait_s=1.0)
    reply = lambda_app.handler(completion_event(stream=False), LambdaContext())
    assert reply["statusCode"] == 504
    body = json.loads(reply["body"])
    assert body["error"]["type"] == "timeout" and body["job_id"] == reply["headers"]["inferq-job-id"]


@pytest.fixture
def long_wait(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Iterator[None]:
    _clean_env(monkeypatch)
    monkeypatch.setenv("INFERQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("INFERQ_API_KEYS", f"tenant-a:{EVENT_KEY}")
    monkeypatch.setenv("INFERQ_SYNC_WAIT_S", "26")
    yield


def test_a_wait_longer_than_api_gateway_allows_stops_the_lambda_at_init(long_wait: None) -> None:
    with pytest.raises(SettingsError, match="INFERQ_SYNC_WAIT_S"):
        _fresh_import()
