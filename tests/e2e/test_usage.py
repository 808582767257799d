"""Usage metering through ``inferq up`` (docs/api.md, ``GET /v1/usage``): two tenants' jobs, some succeeding (one
after a retry) and some failing, each counted exactly in its own tenant's usage, with token sums equal to the sums
of the results' ``usage``; another tenant's usage refused (403 ``operator_only``) but to the operator; the same
figures from the Python client (blocking and asyncio) and from ``inferq usage`` (its table and ``--csv``); and the
console's usage view in a real headless Chromium: the operator's chart and table of every tenant with the cost, a
tenant's own rows only. With INFERQ_README_SCREENSHOT=1 the operator's view also goes to docs/img/usage.png."""

from __future__ import annotations

import asyncio
import csv
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferq.client import AsyncClient, Client, Forbidden
from tests.support.browser import Browser, chromium

from .conftest import FAST, ROOT, Emulator

ALPHA, BETA, OPS = "key-alpha-usage-0001", "key-beta-usage-0002", "key-ops-usage-0003"
README_SHOT = ROOT / "docs" / "img" / "usage.png"


def chat(text: str, **mock: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "mock", "messages": [{"role": "user", "content": text}]}
    if mock:
        body["mock"] = mock
    return body


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    data_dir = tmp_path_factory.mktemp("usage") / "data"
    data_dir.mkdir()
    (data_dir / "dev-api-key").write_text(ALPHA)  # what the Emulator helper reads as its own key
    emulator = Emulator(data_dir, {**FAST, "INFERQ_API_KEYS": f"alpha:{ALPHA},beta:{BETA},ops:{OPS}",
                                   "INFERQ_ADMIN_TENANTS": "ops"})
    try:
        yield emulator.start()
    finally:
        emulator.cleanup()


@pytest.fixture(scope="module")
def ended(stack: Emulator) -> dict[str, list[dict[str, Any]]]:
    """Each tenant's jobs, submitted and run to their end: alpha 3 successes and a failure, beta 2 successes, one
    success after a retried attempt, and a failure."""
    plan = {ALPHA: [chat("one", latency_ms=400), chat("two words", latency_ms=300),
                    chat("three words here", latency_ms=200), chat("no", fatal=True)],
            BETA: [chat("uno", latency_ms=100), chat("dos palabras", latency_ms=100),
                   chat("again", fail_attempts=1, latency_ms=100), chat("nope", fatal=True)]}
    jobs: dict[str, list[dict[str, Any]]] = {}
    for key, bodies in plan.items():
        with Client(stack.url, key) as client:
            submitted = [client.submit(body) for body in bodies]
            jobs[key] = [client.wait(job.id, timeout=120).raw for job in submitted]
    return jobs


def totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    out = {status: sum(r["jobs"][status] for r in rows) for status in ("succeeded", "failed", "cancelled", "expired")}
    out["prompt_tokens"] = sum(r["prompt_tokens"] for r in rows)
    out["completion_tokens"] = sum(r["completion_tokens"] for r in rows)
    return out


def expected(jobs: list[dict[str, Any]]) -> dict[str, int]:
    usages = [j["result"]["body"]["usage"] for j in jobs if j["status"] == "succeeded"]
    return {"succeeded": sum(j["status"] == "succeeded" for j in jobs),
            "failed": sum(j["status"] == "failed" for j in jobs), "cancelled": 0, "expired": 0,
            "prompt_tokens": sum(u["prompt_tokens"] for u in usages),
            "completion_tokens": sum(u["completion_tokens"] for u in usages)}


def get(stack: Emulator, key: str, **params: str) -> httpx.Response:
    return httpx.get(f"{stack.url}/v1/usage", params=params, headers={"Authorization": f"Bearer {key}"},
                     timeout=30)


def test_each_tenant_s_jobs_are_counted_exactly_with_its_results_tokens(
    stack: Emulator, ended: dict[str, list[dict[str, Any]]]
) -> None:
    assert [j["status"] for j in ended[ALPHA]] == ["succeeded"] * 3 + ["failed"]
    assert [j["status"] for j in ended[BETA]] == ["succeeded"] * 3 + ["failed"]
    for key, tenant in ((ALPHA, "alpha"), (BETA, "beta")):
        answer = get(stack, key).json()
        assert answer["object"] == "usage" and answer["tenant"] == tenant
        assert totals(answer["data"]) == expected(ended[key])
        assert all(r["model"] == "mock" and r["lane"] == "normal" for r in answer["data"])
        assert sum(r["run_seconds"] for r in answer["data"]) > 0
        assert all(0 < r["gpu_seconds"] <= r["run_seconds"] for r in answer["data"])
        assert all("estimated_cost_usd" not in r for r in answer["data"])


def test_another_tenant_s_usage_is_refused_but_to_the_operator(
    stack: Emulator, ended: dict[str, list[dict[str, Any]]]
) -> None:
    for asked in ("beta", "*"):
        refused = get(stack, ALPHA, tenant=asked)
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "operator_only"
    every = get(stack, OPS, tenant="*").json()
    by_tenant = {t: [r for r in every["data"] if r["tenant"] == t] for t in ("alpha", "beta")}
    assert totals(by_tenant["alpha"]) == expected(ended[ALPHA])
    assert totals(by_tenant["beta"]) == expected(ended[BETA])
    assert all(r["estimated_cost_usd"] > 0 for r in every["data"])


def test_the_clients_and_the_command_read_the_same(stack: Emulator, ended: dict[str, list[dict[str, Any]]]) -> None:
    with Client(stack.url, BETA) as client:
        assert totals(client.usage()["data"]) == expected(ended[BETA])
        with pytest.raises(Forbidden):
            client.usage(tenant="alpha")

    async def read() -> dict[str, Any]:
        async with AsyncClient(stack.url, BETA) as client:
            return await client.usage(bucket="hour")

    hourly = asyncio.run(read())["data"]
    assert totals(hourly) == expected(ended[BETA]) and all("start" in r for r in hourly)

    command = [sys.executable, "-m", "inferq.cli", "usage", "--since", "2h", "--url", stack.url, "--api-key", ALPHA]
    printed = subprocess.run([*command, "--csv"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    rows = list(csv.DictReader(io.StringIO(printed.stdout)))
    assert sum(int(r["succeeded"]) for r in rows) == 3 and sum(int(r["failed"]) for r in rows) == 1
    assert sum(int(r["prompt_tokens"]) for r in rows) == expected(ended[ALPHA])["prompt_tokens"]
    table = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
                           env={"COLUMNS": "200", "PATH": ""})
    assert "usage of alpha" in table.stdout and "GPU hours" in table.stdout and "mock" in table.stdout


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    opened = Browser(chromium())
    yield opened
    opened.close()


def connect(browser: Browser, stack: Emulator, key: str) -> None:
    browser.open(stack.url + "/console/#usage")
    browser.js("sessionStorage.clear(); document.getElementById('api-key').focus()")
    browser.type(key)
    browser.key("Enter", 13)
    browser.wait("document.body.dataset.connected === 'yes'", what="connected")
    browser.wait("!document.getElementById('view-usage').hidden", what="the usage view")


def table(browser: Browser) -> dict[str, list[str]]:
    rows = browser.js("""[...document.querySelectorAll('#usage-table tbody tr')].map((tr) => [tr.dataset.row,
        ...[...tr.querySelectorAll('td')].filter((td) => !td.hidden).map((td) => td.innerText)])""")
    return {row[0]: row[1:] for row in rows}


def test_the_console_shows_an_operator_every_tenant_s_usage_and_a_tenant_its_own(
    stack: Emulator, ended: dict[str, list[dict[str, Any]]], browser: Browser, tmp_path: Path
) -> None:
    connect(browser, stack, OPS)
    browser.wait("document.querySelectorAll('#usage-table tbody tr').length === 2", what="a row per tenant")
    rows = table(browser)
    assert set(rows) == {"alpha", "beta"}
    for key, tenant in ((ALPHA, "alpha"), (BETA, "beta")):
        want = expected(ended[key])
        ok, not_ok, prompt, completion, gpu_time, cost, _ = rows[tenant]
        assert (int(ok), int(not_ok)) == (want["succeeded"], want["failed"])
        assert (int(prompt.replace(",", "")), int(completion.replace(",", ""))) == (
            want["prompt_tokens"], want["completion_tokens"])
        assert gpu_time.endswith((" s", " min", " h")) and cost.startswith("$")
    assert int(browser.js("Number(document.getElementById('chart-usage').dataset.bars)")) >= 1
    assert browser.js("[...document.querySelectorAll('#usage-legend li')].map((li) => li.innerText).sort()") == [
        "alpha", "beta"]
    assert "operator" in browser.text("#usage-scope")
    browser.js("document.getElementById('usage-range').value = '7d'; "
               "document.getElementById('usage-range').dispatchEvent(new Event('change'))")
    browser.wait("document.querySelectorAll('#usage-table tbody tr').length === 2", what="the 7-day view")
    browser.js("document.activeElement && document.activeElement.blur()")  # no focus ring in the screenshot
    browser.screenshot(tmp_path / "usage-operator.png")
    if os.environ.get("INFERQ_README_SCREENSHOT") == "1":
        browser.screenshot(README_SHOT)

    connect(browser, stack, ALPHA)
    browser.wait("document.getElementById('usage-scope').innerText.includes('alpha')", what="alpha's own view")
    rows = table(browser)
    assert list(rows) == ["mock"] and len(rows["mock"]) == 5  # per model and lane, no cost columns
    assert browser.js("[...document.querySelectorAll('#usage-table .cost')].every((c) => c.hidden)")
    assert "beta" not in browser.text("#view-usage")
    browser.screenshot(tmp_path / "usage-tenant.png")
    assert browser.errors == []
