"""Wake on enqueue: at zero, a submit wakes the scaler (a Lambda invoke seen by moto, or the emulator's HTTP hook),
at most once per guard period across gateways; the fleet being up costs the submit nothing; a failed or slow
wake never fails or stalls the submit."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from moto import mock_aws
from moto.awslambda_simple.models import LambdaSimpleBackend

from inferq.config.settings import Settings
from inferq.queue.protocol import Queue

from .conftest import AppFactory
from .support import CHAT, A, FakeWaker


async def submit_ok(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/jobs", json=CHAT, headers=A)
    assert response.status_code == 202, response.text


async def test_at_zero_the_first_submit_wakes_the_scaler_once_per_guard(
    client: httpx.AsyncClient, app: Any, waker: FakeWaker, queue: Queue
) -> None:
    app.state.gateway.wake.refresh_s = 0  # check on every submit: only the Redis guard limits the wakes
    await queue.record_decision(0, "scale_to_zero")
    for _ in range(5):
        await submit_ok(client)
    assert waker.calls == 1
    assert 0 < await queue.redis.ttl(queue.keys.wake) <= 5
    await queue.redis.delete(queue.keys.wake)  # the guard expires
    await submit_ok(client)
    assert waker.calls == 2


async def test_with_no_decision_yet_a_submit_wakes_the_scaler(client: httpx.AsyncClient, waker: FakeWaker) -> None:
    await submit_ok(client)
    assert waker.calls == 1


async def test_the_guard_is_shared_by_every_gateway_process(
    make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient], queue: Queue
) -> None:
    wakers = [FakeWaker() for _ in range(4)]
    clients = [open_client(make_app(waker=w)) for w in wakers]
    await queue.record_decision(0, "scale_to_zero")
    await asyncio.gather(*(submit_ok(c) for c in clients))
    assert sum(w.calls for w in wakers) == 1


async def test_no_wake_while_the_fleet_is_up(client: httpx.AsyncClient, waker: FakeWaker, queue: Queue) -> None:
    await queue.record_decision(2, "scale_up")
    for _ in range(3):
        await submit_ok(client)
    assert waker.calls == 0
    assert await queue.redis.get(queue.keys.wake) is None


async def test_while_the_fleet_is_up_a_submit_is_one_redis_command(
    make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient], waker: FakeWaker, queue: Queue,
    settings: Settings,
) -> None:
    counted = Queue.connect(settings)
    commands: list[str] = []
    execute = counted.redis.execute_command

    async def counting(*args: Any, **kwargs: Any) -> Any:
        commands.append(str(args[0]))
        return await execute(*args, **kwargs)

    counted.redis.execute_command = counting
    app = make_app(queue=counted, waker=waker)
    app.state.gateway.wake.refresh_s = 60  # however slow this machine, the cached count stays fresh here
    client = open_client(app)
    try:
        await queue.record_decision(2, "scale_up")
        await submit_ok(client)  # loads the script, reads "desired 2" (cached for a second)
        assert "HGETALL" in commands
        commands.clear()
        for _ in range(3):
            await submit_ok(client)
        assert commands == ["EVALSHA"] * 3
        assert waker.calls == 0
    finally:
        await counted.close()


async def test_a_failed_wake_does_not_fail_the_submit(
    make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    broken = FakeWaker(fail=True)
    app = make_app(waker=broken)
    client = open_client(app)
    await submit_ok(client)
    assert broken.calls == 1
    assert app.state.telemetry.totals["ScalerWakeFailures"] == 1


async def test_a_failed_wake_gives_its_guard_back_so_the_next_submit_wakes(
    make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient], queue: Queue
) -> None:
    broken = FakeWaker(fail=True)
    app = make_app(waker=broken)
    app.state.gateway.wake.refresh_s = 0  # check on every submit: only the Redis guard limits the wakes
    client = open_client(app)
    await queue.record_decision(0, "scale_to_zero")
    await submit_ok(client)
    assert broken.calls == 1 and await queue.redis.get(queue.keys.wake) is None
    broken.fail = False
    await submit_ok(client)  # within the guard's 5 s: woken all the same, since the first wake never happened
    assert broken.calls == 2 and await queue.redis.get(queue.keys.wake) is not None
    assert app.state.telemetry.totals["ScalerWakes"] == 1


async def test_a_hung_wake_is_cut_short_and_the_submit_still_answers(
    make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    events: list[str] = []

    async def hangs() -> None:
        events.append("wake started")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events.append("wake cut short")
            raise
        events.append("wake finished")

    app = make_app(waker=hangs)
    app.state.gateway.wake.timeout_s = 0.3
    client = open_client(app)
    await submit_ok(client)
    events.append("submit answered")
    # the submit waited for the wake only until its timeout cut it short, not for the 30 s it would have hung
    assert events == ["wake started", "wake cut short", "submit answered"]
    assert app.state.telemetry.totals["ScalerWakeFailures"] == 1


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """moto's Lambda (no Docker); yields the invocations it received."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "eu-west-1"}.items():
        monkeypatch.setenv(name, value)
    seen: list[dict[str, Any]] = []
    original = LambdaSimpleBackend.invoke

    def spy(self: Any, function_name: str, qualifier: Any, body: Any, headers: Any, response_headers: Any) -> Any:
        seen.append({"function": function_name, "type": headers.get("X-Amz-Invocation-Type"),
                     "payload": json.loads(body)})
        return original(self, function_name, qualifier, body, headers, response_headers)

    monkeypatch.setattr(LambdaSimpleBackend, "invoke", spy)
    with mock_aws(config={"lambda": {"use_docker": False}}):
        yield seen


async def test_in_aws_the_wake_is_an_asynchronous_invoke_of_the_scaler(
    aws: list[dict[str, Any]], make_app: AppFactory, open_client: Callable[..., httpx.AsyncClient], queue: Queue
) -> None:
    app = make_app(scaler_function="inferq-scaler")  # no injected waker: built from the settings
    client = open_client(app)
    await queue.record_decision(0, "scale_to_zero")
    for _ in range(3):
        await submit_ok(client)
    assert len(aws) == 1
    assert aws[0]["function"] == "inferq-scaler"
    assert aws[0]["type"] == "Event"
    assert aws[0]["payload"]["source"] == "inferq.gateway"
    assert aws[0]["payload"]["detail"] == {"queue": queue.settings.queue, "reason": "enqueue"}
    assert app.state.telemetry.totals["ScalerWakes"] == 1


@pytest.fixture
def wake_hook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The emulator's side of the hook: an HTTP endpoint that records POSTs."""
    received: list[dict[str, Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["content-length"])
            received.append(json.loads(self.rfile.read(length)))
            self.send_response(202)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/scaler/wake", received
    server.shutdown()
    server.server_close()


async def test_in_the_emulator_the_wake_is_a_post_to_its_hook(
    wake_hook: tuple[str, list[dict[str, Any]]], make_app: AppFactory,
    open_client: Callable[..., httpx.AsyncClient], queue: Queue
) -> None:
    url, received = wake_hook
    client = open_client(make_app(scaler_wake_url=url))
    await submit_ok(client)
    await submit_ok(client)
    assert len(received) == 1
    assert received[0]["detail"]["queue"] == queue.settings.queue


async def test_a_redrive_at_zero_wakes_the_scaler_too(
    client: httpx.AsyncClient, app: Any, waker: FakeWaker, queue: Queue
) -> None:
    await queue.record_decision(2, "scale_up")
    job_id = (await client.post("/v1/jobs", json=CHAT, headers=A)).json()["id"]
    [delivery], _ = await queue.read("w", 1)
    queue.settings = queue.settings.replace(max_attempts=1)
    await queue.retry(delivery, delay_ms=0, error={"type": "x", "message": "y"})
    await queue.record_decision(0, "scale_to_zero")
    app.state.gateway.wake.refresh_s = 0
    assert (await client.post(f"/v1/dlq/{job_id}/redrive", headers=A)).status_code == 202
    assert waker.calls == 1
