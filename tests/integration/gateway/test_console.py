"""The console's files as the gateway serves them (cached, self-contained, locked to its own origin) and the history
read it charts."""

from __future__ import annotations

import base64
import copy
import re
from types import ModuleType
from typing import Any

import httpx

from inferq.queue.history import record_sample
from inferq.queue.protocol import Queue
from tests.conftest import load_event

from .support import A
from .test_handler import LambdaContext, gateway_module  # noqa: F401

ASSET_RE = re.compile(r'(?:src|href)="((?:app\.js|usage\.js|app\.css|icon\.svg)\?v=[0-9a-f]{12})"')


async def test_the_bare_path_redirects_relative_so_a_stage_prefix_keeps_working(client: httpx.AsyncClient) -> None:
    response = await client.get("/console")
    assert response.status_code == 308
    assert response.headers["location"] == "console/"


async def test_the_page_names_its_assets_by_content_hash_and_is_revalidated(client: httpx.AsyncClient) -> None:
    page = await client.get("/console/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.headers["cache-control"] == "no-cache"
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    assert "default-src 'none'" in page.headers["content-security-policy"]
    names = set(ASSET_RE.findall(page.text))
    assert {n.split("?")[0] for n in names} == {"app.js", "usage.js", "app.css", "icon.svg"}

    again = await client.get("/console/", headers={"If-None-Match": page.headers["etag"]})
    assert again.status_code == 304
    assert again.content == b""


async def test_assets_are_immutable_with_an_etag_and_answer_304_when_unchanged(client: httpx.AsyncClient) -> None:
    for name, media in (("app.js", "text/javascript"), ("app.css", "text/css"), ("icon.svg", "image/svg+xml")):
        response = await client.get(f"/console/{name}")
        assert response.status_code == 200, name
        assert response.headers["content-type"].startswith(media)
        assert "immutable" in response.headers["cache-control"]
        etag = response.headers["etag"]
        assert (await client.get(f"/console/{name}", headers={"If-None-Match": f'"x", {etag}'})).status_code == 304
        assert (await client.get(f"/console/{name}", headers={"If-None-Match": '"other"'})).status_code == 200


async def test_nothing_is_loaded_from_another_origin(client: httpx.AsyncClient) -> None:
    for name in ("", "app.js", "usage.js", "app.css", "icon.svg"):
        text = (await client.get(f"/console/{name}")).text
        foreign = [u for u in re.findall(r"(?:https?:)?//[A-Za-z0-9.-]+", text) if "www.w3.org" not in u]
        assert not foreign, (name, foreign)
        assert "@import" not in text and "fonts." not in text


async def test_an_unknown_console_file_is_a_404_in_the_envelope(client: httpx.AsyncClient) -> None:
    for name in ("nope.js", "index.html", "..%2Fapi.py"):
        response = await client.get(f"/console/{name}")
        assert response.status_code == 404, name
        assert response.json()["error"]["type"] == "not_found"


async def test_history_needs_a_key(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/stats/history")
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "unauthorized"


async def test_history_answers_the_sampled_numbers_oldest_first(client: httpx.AsyncClient, queue: Queue) -> None:
    assert (await client.get("/v1/stats/history", headers=A)).json() == {"object": "list", "data": []}
    await queue.redis.hset(queue.keys.stats, mapping={"succeeded": 3, "failed": 1, "latency_ms_total": 4200})
    observation = await queue.observe()
    assert await record_sample(queue, observation, desired=1, running=1, at=1000.0)
    await queue.redis.hincrby(queue.keys.stats, "succeeded", 2)
    assert await record_sample(queue, observation, desired=2, running=1, at=1010.0)

    data = (await client.get("/v1/stats/history", headers=A)).json()["data"]
    assert [s["at"] for s in data] == [1000.0, 1010.0]
    assert [s["succeeded"] for s in data] == [3, 5]
    assert data[0]["latency_ms_total"] == 4200 and data[1]["desired"] == 2
    assert set(data[0]) >= {"lag", "pending", "delayed", "dlq", "workers", "running", "failed", "expired"}
    assert not any("tenant" in key or "job" in key for key in data[0])

    newest = (await client.get("/v1/stats/history", headers=A, params={"limit": 1})).json()["data"]
    assert [s["at"] for s in newest] == [1010.0]
    bad = await client.get("/v1/stats/history", headers=A, params={"limit": 0})
    assert bad.status_code == 422


def test_the_console_is_served_through_the_lambda_handler_too(gateway_module: ModuleType) -> None:  # noqa: F811
    def get(path: str) -> dict[str, Any]:
        event = copy.deepcopy(load_event("apiGatewayProxyV2Healthz.json"))
        event["rawPath"] = event["requestContext"]["http"]["path"] = path
        reply: dict[str, Any] = gateway_module.handler(event, LambdaContext())
        return reply

    page = get("/console/")
    assert page["statusCode"] == 200 and "<title>inferq console</title>" in page["body"]
    script = get("/console/app.js")
    assert script["statusCode"] == 200 and not script.get("isBase64Encoded")
    assert "sessionStorage" in script["body"] and script["headers"]["etag"]
    icon = get("/console/icon.svg")
    body = base64.b64decode(icon["body"]) if icon.get("isBase64Encoded") else icon["body"].encode()
    assert icon["statusCode"] == 200 and body.startswith(b"<svg")
