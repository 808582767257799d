"""G8: Redis frozen (SIGSTOP), gone, failing over (READONLY), busy (BUSY) or full (OOM) is a prompt 503 with
Retry-After — never a hang, never a 500 — and the gateway recovers by itself once the server answers again. Only
a Redis error that is our own bug is a 500, logged."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from emulator.valkey import ValkeyProcess, free_port
from functions.gateway.api import create_app
from inferq.config.settings import Settings
from tests.support.waiting import eventually

from .support import CHAT, KEYS, A
from .test_submit import assert_envelope

PROMPT_S = 6.0
"""Generous bound for "prompt": the app's own bound is INFERQ_REDIS_TIMEOUT_S + 1 s (here 1.5 s)."""


@pytest.fixture
def own_valkey(tmp_path: Path) -> Iterator[ValkeyProcess]:
    """A server of this test's own: freezing the session's one would stall everyone else's tests."""
    server = ValkeyProcess(tmp_path / "valkey", appendfsync=None)
    server.start()
    yield server
    server.stop()


def assert_unavailable(response: httpx.Response) -> None:
    assert_envelope(response, 503, "unavailable")
    assert int(response.headers["retry-after"]) > 0


async def timed(call: object) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await call  # type: ignore[misc]
    return response, time.monotonic() - started


async def test_frozen_redis_is_a_prompt_503_then_recovery_after_sigcont(
    own_valkey: ValkeyProcess, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    settings = Settings(redis_url=own_valkey.url, queue="frozen", redis_timeout_s=0.5)
    client = open_client(create_app(settings, keys=KEYS))
    submitted = await client.post("/v1/jobs", json=CHAT, headers=A)
    assert submitted.status_code == 202
    job_id = submitted.json()["id"]

    own_valkey.freeze()
    try:
        for call in (
            client.post("/v1/jobs", json=CHAT, headers=A),
            client.get(f"/v1/jobs/{job_id}", headers=A),
            client.get(f"/v1/jobs/{job_id}", params={"wait": 1}, headers=A),
            client.get("/v1/scale", headers=A),
            client.get("/readyz"),
        ):
            response, elapsed = await timed(call)
            assert_unavailable(response)
            assert elapsed < PROMPT_S, elapsed
        assert (await client.get("/healthz")).status_code == 200  # liveness does not depend on Redis
    finally:
        own_valkey.thaw()

    response, elapsed = await timed(client.get(f"/v1/jobs/{job_id}", headers=A))
    assert response.status_code == 200, response.text
    assert elapsed < PROMPT_S
    assert (await client.post("/v1/jobs", json=CHAT, headers=A)).status_code == 202
    assert (await client.get("/readyz")).status_code == 200


async def test_unreachable_redis_is_503_on_every_route_and_ready_says_so(
    open_client: Callable[..., httpx.AsyncClient],
) -> None:
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", queue="gone", redis_timeout_s=0.5)
    client = open_client(create_app(settings, keys=KEYS))
    job = "job_aaaaaaaaaaaaaaaaaaaaaaaaaa"
    for method, path in [("POST", "/v1/jobs"), ("GET", f"/v1/jobs/{job}"), ("POST", f"/v1/jobs/{job}/cancel"),
                         ("GET", "/v1/dlq"), ("POST", f"/v1/dlq/{job}/redrive"), ("GET", "/v1/scale"),
                         ("GET", "/readyz")]:
        response, elapsed = await timed(client.request(method, path, json=CHAT, headers=A))
        assert_unavailable(response)
        assert elapsed < PROMPT_S, (path, elapsed)


async def test_a_restarted_redis_is_picked_up_without_restarting_the_gateway(
    own_valkey: ValkeyProcess, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    settings = Settings(redis_url=own_valkey.url, queue="restart", redis_timeout_s=0.5)
    client = open_client(create_app(settings, keys=KEYS))
    assert (await client.post("/v1/jobs", json=CHAT, headers=A)).status_code == 202
    own_valkey.restart()  # pooled connections are now dead; scripts must be loaded again
    # The dead pooled connection fails once; the client's single retry reconnects and reloads the script.
    response = await client.post("/v1/jobs", json=CHAT, headers=A)
    assert response.status_code == 202, response.text


async def test_a_full_redis_is_a_503_with_retry_after_not_a_500(
    own_valkey: ValkeyProcess, open_client: Callable[..., httpx.AsyncClient]
) -> None:
    settings = Settings(redis_url=own_valkey.url, queue="full", redis_timeout_s=0.5)
    client = open_client(create_app(settings, keys=KEYS))
    submitted = await client.post("/v1/jobs", json=CHAT, headers=A)
    assert submitted.status_code == 202
    job_id = submitted.json()["id"]
    own_valkey.set_maxmemory("1mb")  # noeviction: every write is refused with OOM
    try:
        response = await client.post("/v1/jobs", json=CHAT, headers=A)
        assert_unavailable(response)
        assert "full" in response.json()["error"]["message"]
        assert (await client.get(f"/v1/jobs/{job_id}", headers=A)).status_code == 200  # reads still answer
    finally:
        own_valkey.set_maxmemory("0")
    assert (await client.post("/v1/jobs", json=CHAT, headers=A)).status_code == 202


async def test_a_demoted_primary_and_a_busy_script_are_503(
    own_valkey: ValkeyProcess, open_client: Callable[..., httpx.AsyncClient], tmp_path: Path
) -> None:
    settings = Settings(redis_url=own_valkey.url, queue="failover", redis_timeout_s=2.0)
    client = open_client(create_app(settings, keys=KEYS))
    assert (await client.post("/v1/jobs", json=CHAT, headers=A)).status_code == 202
    with ValkeyProcess(tmp_path / "other", appendfsync=None) as other:
        own_valkey.replicate(other)  # READONLY for every write, even after redis-py's reconnect-and-resend
        try:
            assert_unavailable(await client.post("/v1/jobs", json=CHAT, headers=A))
        finally:
            own_valkey.promote()
    own_valkey.config_set("busy-reply-threshold", "50")
    spinner = redis.Redis(host=own_valkey.host, port=own_valkey.port, socket_timeout=10)
    spin = threading.Thread(target=_spin, args=(spinner,), daemon=True)
    spin.start()
    try:
        eventually(lambda: own_valkey.call("PING").startswith(b"-BUSY"), what="the script running past the threshold")
        assert_unavailable(await client.post("/v1/jobs", json=CHAT, headers=A))  # BUSY
    finally:
        own_valkey.call("SCRIPT", "KILL")
        spin.join(5)
        spinner.close()
    assert (await client.post("/v1/jobs", json=CHAT, headers=A)).status_code == 202


def _spin(client: redis.Redis) -> None:
    """A script that runs until SCRIPT KILL: the server answers BUSY to everyone else meanwhile."""
    with contextlib.suppress(redis.ResponseError):
        client.eval("while true do end", 0)


async def test_an_unexpected_redis_error_is_a_logged_500_in_the_envelope(
    own_valkey: ValkeyProcess, open_client: Callable[..., httpx.AsyncClient], caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(redis_url=own_valkey.url, queue="broken", redis_timeout_s=0.5)
    client = open_client(create_app(settings, keys=KEYS))
    assert (await client.post("/v1/jobs", json=CHAT, headers=A)).status_code == 202
    own_valkey.call("SET", "inferq:{broken}:stats", "not a hash")  # WRONGTYPE for the enqueue script: our bug
    response = await client.post("/v1/jobs", json=CHAT, headers=A)
    assert_envelope(response, 500, "internal_error")
    assert any("unexpected error from the queue store" in r.getMessage() for r in caplog.records)
