"""emulator/httpd.py, the emulator's own small HTTP server: an endpoint that fails answers 500 and is logged with
its traceback (the supervisor keeps running; the bug is not silent)."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
from typing import Any

import pytest

from emulator.httpd import HttpServer, Request


async def test_an_endpoint_that_raises_answers_500_and_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(request: Request) -> tuple[int, Any]:
        if request.path == "/broken":
            raise KeyError("a bug in the endpoint")
        return 200, {"ok": True}

    server = await HttpServer(handler).start()

    def get(path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as reply:
                return reply.status, json.load(reply)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)

    try:
        with caplog.at_level(logging.ERROR, logger="inferq.emulator.httpd"):
            status, body = await asyncio.to_thread(get, "/broken")
            assert (status, body["error"]["Code"]) == (500, "ServerException")
            assert await asyncio.to_thread(get, "/fine") == (200, {"ok": True})  # and it serves on
    finally:
        await server.close()
    [record] = caplog.records
    assert "GET /broken: the endpoint failed" in record.getMessage()
    assert record.exc_info is not None and "a bug in the endpoint" in str(record.exc_info[1])
