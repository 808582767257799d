"""Fixtures for the gateway: the app built on the test's queue (real Valkey), an HTTP client speaking ASGI to it,
two tenants' credentials, and a fake waker that records wake-ups."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from functions.gateway.api import create_app
from inferq.config.settings import Settings

from .support import KEYS, FakeWaker

AppFactory = Callable[..., FastAPI]


@pytest.fixture
def make_app(settings: Settings) -> AppFactory:
    """``make_app(**setting_overrides, waker=..., queue=...)``: an app on this test's queue."""

    def make(*, waker: Any = None, queue: Any = None, keys: Any = None, **overrides: Any) -> FastAPI:
        return create_app(settings.replace(**overrides), queue=queue, waker=waker, keys=keys or KEYS)

    return make


@pytest.fixture
async def open_client() -> AsyncIterator[Callable[[FastAPI], httpx.AsyncClient]]:
    """Clients for any number of apps, closed (and their Redis clients with them) at the end of the test."""
    opened: list[tuple[FastAPI, httpx.AsyncClient]] = []

    def open_(app: FastAPI) -> httpx.AsyncClient:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway")
        opened.append((app, client))
        return client

    yield open_
    for app, client in opened:
        await client.aclose()
        await app.state.gateway.aclose()


@pytest.fixture
def waker() -> FakeWaker:
    return FakeWaker()


@pytest.fixture
def app(make_app: AppFactory, waker: FakeWaker) -> FastAPI:
    return make_app(waker=waker)


@pytest.fixture
def client(app: FastAPI, open_client: Callable[[FastAPI], httpx.AsyncClient]) -> httpx.AsyncClient:
    return open_client(app)
