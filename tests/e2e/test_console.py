"""The web console in a real headless Chromium (Debian's, driven by Playwright) against ``inferq up`` with two
tenants (alice, bob) and a third that only loads the queue: alice types her key, sees the queue, watches her job go
from queued to succeeded, redrives a dead-lettered job and sees it run again, finds bob's jobs nowhere, and the page
stays usable with 10,000 jobs queued. Every page is reachable and usable from the keyboard, and every input has a
label. A screenshot of each page goes to the test's output; with INFERQ_README_SCREENSHOT=1 the overview's also goes
to docs/img/console.png for the README (a test run leaves the checkout as it was).

The tests share one stack and one browser and run in file order (the last one fills the queue)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferq.client import AsyncClient, Client, JobStatus
from tests.support.browser import Browser, chromium
from tests.support.waiting import eventually

from .conftest import FAST, ROOT, Emulator

ALICE, BOB, LOADER = "key-alice-console-0001", "key-bob-console-0002", "key-load-console-0003"
README_SHOT = ROOT / "docs" / "img" / "console.png"
TAB, ENTER = ("Tab", 9), ("Enter", 13)
QUEUED_JOBS = 10_000

pytestmark = pytest.mark.timeout(600)


def chat(text: str, **mock: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "mock", "messages": [{"role": "user", "content": text}]}
    if mock:
        body["mock"] = mock
    return body


def console_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    data_dir = tmp_path_factory.mktemp("console") / "data"
    data_dir.mkdir()
    (data_dir / "dev-api-key").write_text(ALICE)  # what the Emulator helper reads as its own key
    emulator = Emulator(data_dir, {
        **FAST,
        "INFERQ_API_KEYS": f"alice:{ALICE},bob:{BOB},load:{LOADER}",
        "INFERQ_MAX_QUEUE_DEPTH": str(QUEUED_JOBS * 2),
    })
    try:
        yield emulator.start()
    finally:
        emulator.cleanup()  # stopped with nothing left running, as running_emulator does


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The stack the console's tests share: none of them leaves it unable to serve the next."""
    yield from console_stack(tmp_path_factory)


@pytest.fixture
def loaded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """A stack of its own for the test that fills it with ten thousand ten-minute jobs (they would hold the shared
    one's fleet for the rest of the module)."""
    yield from console_stack(tmp_path_factory)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    opened = Browser(chromium())
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def alice(stack: Emulator) -> Iterator[Client]:
    with Client(stack.url, ALICE) as client:
        yield client


@pytest.fixture(scope="module")
def bob(stack: Emulator) -> Iterator[Client]:
    with Client(stack.url, BOB) as client:
        yield client


def sign_in(browser: Browser, stack: Emulator) -> None:
    """The console of ``stack`` open, with no key kept from before, then alice's typed in."""
    browser.open(stack.url + "/console")  # the redirect to console/ included
    browser.js("sessionStorage.clear()")  # a key another test typed in stays in the tab's session
    browser.open(stack.url + "/console/")
    browser.wait("document.getElementById('notice').innerText.includes('Enter an API key')", what="the key prompt")
    browser.js("document.getElementById('api-key').focus()")
    browser.type(ALICE)
    browser.key(*ENTER)
    browser.wait("document.body.dataset.connected === 'yes'", what="connected")


@pytest.fixture
def console(stack: Emulator, browser: Browser) -> Browser:
    """The shared browser on the console, connected with alice's key, whichever test ran before (or none)."""
    if not browser.js(f"location.href.startsWith({json.dumps(stack.url + '/console/')}) && "
                      "document.body.dataset.connected === 'yes'"):
        sign_in(browser, stack)
    return browser


def show(browser: Browser, view: str) -> None:
    browser.js(f"location.hash = '#{view}'")
    browser.wait(f"!document.getElementById('view-{view}').hidden", what=f"the {view} view")


def look_up(browser: Browser, job_id: str) -> None:
    show(browser, "jobs")
    browser.js("document.getElementById('job-id').value = ''; document.getElementById('job-id').focus()")
    browser.type(job_id)
    browser.key(*ENTER)  # the form submits from the keyboard
    browser.wait(f"document.querySelector('#job h2') && document.querySelector('#job h2').innerText === '{job_id}'",
                 what=f"{job_id} shown")


def job_status(browser: Browser) -> str:
    return str(browser.js("(document.getElementById('job') || {}).dataset.status || ''"))


def keyboard_reaches_everything(browser: Browser) -> None:
    """Tab from the top of the page: every visible control gets the focus, in a finite number of presses."""
    total = browser.js("""(() => {
        // marks left by an earlier walk (on controls of a view now hidden) would count as unreachable
        document.querySelectorAll('[data-kb]').forEach((e) => { delete e.dataset.kb; });
        const all = [...document.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')]
            .filter((e) => !e.disabled && e.tabIndex >= 0 && e.getClientRects().length > 0);
        all.forEach((e, i) => e.dataset.kb = String(i));
        document.activeElement && document.activeElement.blur();
        window.scrollTo(0, 0);
        return all.length;
    })()""")
    assert total >= 5
    reached: set[int] = set()
    # a live page may add focusable rows (the dead letters refresh) between presses: allow for more tab stops than
    # were counted, and stop as soon as every counted control has had the focus
    for _ in range(3 * total + 10):
        browser.key(*TAB)
        mark = browser.js("document.activeElement && document.activeElement.dataset.kb")
        if mark is not None:
            reached.add(int(mark))
        if len(reached) == total:
            break
    missing = browser.js(f"""[...document.querySelectorAll('[data-kb]')]
        .filter((e) => !{json.dumps(sorted(reached))}.includes(Number(e.dataset.kb)))
        .map((e) => e.outerHTML.slice(0, 80))""")
    assert not missing, f"not reachable by keyboard: {missing}"
    browser.js("document.activeElement && document.activeElement.blur()")  # no focus ring in the screenshots


def labels_and_landmarks(browser: Browser) -> None:
    unlabelled = browser.js("""[...document.querySelectorAll('input, select, textarea')]
        .filter((e) => e.type !== 'hidden' && !(e.labels && e.labels.length) && !e.getAttribute('aria-label')
                       && !e.getAttribute('aria-labelledby'))
        .map((e) => e.outerHTML)""")
    assert unlabelled == []
    nameless_buttons = browser.js("""[...document.querySelectorAll('button')]
        .filter((b) => !(b.innerText.trim() || b.getAttribute('aria-label'))).map((b) => b.outerHTML)""")
    assert nameless_buttons == []
    assert browser.js("!!document.querySelector('header') && !!document.querySelector('nav[aria-label]') && "
                      "document.querySelectorAll('main').length === 1 && document.documentElement.lang === 'en'")
    assert browser.js("[...document.querySelectorAll('section.view:not([hidden]) h1')].length") == 1


def test_the_key_is_typed_in_and_the_overview_shows_the_queue(stack: Emulator, browser: Browser, shots: Path) -> None:
    browser.open(stack.url + "/console")  # the redirect to console/ included
    assert browser.js("location.pathname") == "/console/"
    if browser.js("sessionStorage.length"):  # a key another test typed in: start without it
        browser.js("sessionStorage.clear()")
        browser.open(stack.url + "/console/")
    assert "Enter an API key" in browser.text("#notice")
    labels_and_landmarks(browser)
    browser.screenshot(shots / "key.png")

    browser.js("document.getElementById('api-key').focus()")
    browser.type(ALICE)
    browser.key(*ENTER)
    browser.wait("document.body.dataset.connected === 'yes'", what="connected")
    assert browser.js("sessionStorage.getItem('inferq.apiKey')") == ALICE
    assert browser.js("localStorage.length") == 0  # the key stays in this tab's session
    assert browser.js("document.getElementById('api-key').value") == ""
    browser.wait("/^[0-9,]+$/.test(document.getElementById('g-lag').innerText)", what="the lag gauge")
    browser.wait("/^[0-9,]+$/.test(document.getElementById('g-workers').innerText)", what="the workers gauge")
    keyboard_reaches_everything(browser)
    assert browser.errors == []


def test_a_submitted_job_goes_from_queued_to_succeeded(stack: Emulator, console: Browser, alice: Client,
                                                       shots: Path) -> None:
    browser = console
    # With no worker up (the fleet scales from zero) the page sees the job wait; the mock takes 3 s: it sees it run.
    cold = stack.scale()["workers"] == 0
    browser.js("""window.seenStatuses = [];
        new MutationObserver(() => {
            const now = document.getElementById('job').dataset.status;
            if (now && seenStatuses[seenStatuses.length - 1] !== now) seenStatuses.push(now);
        }).observe(document.getElementById('job'), {attributes: true, attributeFilter: ['data-status']});""")
    job = alice.submit(chat("hello from the console", latency_ms=3000), metadata={"from": "e2e"})
    look_up(browser, job.id)
    browser.screenshot(shots / "job-waiting.png")
    browser.wait("document.getElementById('job').dataset.status === 'succeeded'", timeout=90,
                 what="the job to succeed on the page")  # the page's own long-poll brought the change
    seen = browser.js("seenStatuses")
    order = ["queued", "running", "succeeded"]
    assert seen[-1] == "succeeded" and seen == sorted(seen, key=order.index), seen  # every state it showed, in order
    assert seen[0] == "queued" or not cold, seen  # a cold fleet: the page saw the job wait
    text = browser.text("#job")
    assert "hello from the console" in text and '"from":"e2e"' in text and "Queue to done" in text
    assert browser.js("!document.getElementById('cancel-job')")  # nothing to cancel any more
    labels_and_landmarks(browser)
    keyboard_reaches_everything(browser)
    browser.screenshot(shots / "job.png")
    assert job.id in browser.text("#recent")


def test_cancel_from_the_page(console: Browser, alice: Client) -> None:
    browser = console
    job = alice.submit(chat("cancel me", hang=True))
    look_up(browser, job.id)
    browser.click("#cancel-job")
    browser.wait("document.getElementById('job').dataset.status === 'cancelled'", timeout=60, what="cancelled")
    assert alice.get(job.id).status is JobStatus.CANCELLED


def test_a_dead_lettered_job_is_redriven_and_runs_again(console: Browser, alice: Client, shots: Path) -> None:
    browser = console
    job = alice.submit(chat("fails every attempt", fail_attempts=99))
    dead = alice.wait(job.id, timeout=60)
    assert dead.dead_lettered and dead.attempts == 3
    show(browser, "dlq")
    browser.click("#dlq-refresh")
    row = f"#dlq-table tr[data-job='{job.id}']"
    browser.wait(f"!!document.querySelector(\"{row}\")", what="the job in the DLQ table")
    assert "retryable" in browser.text(row) or "mock" in browser.text(row)
    labels_and_landmarks(browser)
    keyboard_reaches_everything(browser)
    browser.screenshot(shots / "dlq.png")

    redriven_at = time.time()
    browser.click(f"{row} button[aria-label^='Redrive']")
    browser.wait(f"document.getElementById('notice').innerText.includes('Queued again: {job.id}')", what="redriven")
    browser.wait("!document.getElementById('view-jobs').hidden", what="the job view")
    # It runs again from attempt 1 (every attempt fails again, by the mock's control): the page follows it to the end.
    browser.wait("['failed'].includes(document.getElementById('job').dataset.status)", timeout=90,
                 what="the redriven job to run and end")
    rerun = alice.get(job.id)
    assert rerun.started_at is not None and rerun.started_at >= redriven_at - 1
    assert rerun.attempts == 3 and "Attempts\n3" in browser.text("#job").replace("\t", "\n")
    browser.screenshot(shots / "job-redriven.png")


def test_a_second_tenants_jobs_are_nowhere(console: Browser, alice: Client, bob: Client) -> None:
    browser = console
    mine = alice.submit(chat("alice's dead job", fail_attempts=99))  # alice's own dead letter for the table
    assert alice.wait(mine.id, timeout=60).dead_lettered
    secret = bob.submit(chat("bob's private words"))
    assert bob.wait(secret.id, timeout=60).status is JobStatus.SUCCEEDED
    dead = bob.submit(chat("bob's dead job", fail_attempts=99))
    assert bob.wait(dead.id, timeout=60).dead_lettered

    look_up(browser, secret.id)
    assert job_status(browser) == "missing"
    assert "No such job for this API key" in browser.text("#job")
    show(browser, "dlq")
    browser.click("#dlq-refresh")
    browser.wait("document.querySelectorAll('#dlq-table tbody tr').length > 0", what="alice's dead letters")
    shown = browser.js("[...document.querySelectorAll('#dlq-table tbody tr')].map((r) => r.dataset.job)")
    assert dead.id not in shown and secret.id not in shown
    for view in ("overview", "jobs", "dlq"):
        show(browser, view)
        page = browser.text("body")
        assert "bob's private words" not in page and dead.id not in page and "bob's dead job" not in page


def test_the_overview_charts_throughput_and_latency(console: Browser, alice: Client, shots: Path) -> None:
    browser = console
    for batch in range(3):  # jobs ending across several samples (one every 5 s) give a line, not a dot
        jobs = [alice.submit(chat(f"chart {batch}.{i}", latency_ms=200)) for i in range(8)]
        for job in jobs:
            alice.wait(job.id, timeout=60)
        sampled = alice.history()[-1:]
        eventually(lambda last=sampled: alice.history()[-1:] != last, what="the scaler's next sample", timeout=30,
                   interval=0.5)
    show(browser, "overview")
    browser.wait("refreshHistory().then(() => Number(document.getElementById('chart-throughput').dataset.points) "
                 ">= 2)", timeout=60, what="throughput points")
    newest = alice.history()[-1]
    latency_points = int(browser.js("Number(document.getElementById('chart-latency').dataset.points)"))
    assert newest["latency_ms_total"] > 0  # jobs ended: the chart draws their queue-to-done time
    assert latency_points >= 1
    assert browser.js("document.querySelector('#chart-throughput svg polyline') !== null")
    assert browser.text("#g-delayed") != "\u2013"  # a number, not the placeholder dash
    browser.screenshot(shots / "overview.png")
    if os.environ.get("INFERQ_README_SCREENSHOT") == "1":
        browser.screenshot(README_SHOT)
    assert browser.errors == []


def batch_file(stack: Emulator, key: str, lines: int, **mock: Any) -> str:
    """A batch input file uploaded with ``key`` over HTTP (what the ``openai`` client's ``files.create`` sends)."""
    body = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": chat(f"batch line {i}", **mock)}) + "\n" for i in range(lines))
    with httpx.Client(base_url=stack.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        uploaded = http.post("/v1/files", files={"file": ("lines.jsonl", body.encode())}, data={"purpose": "batch"})
        assert uploaded.status_code == 200, uploaded.text
        created = http.post("/v1/batches", json={"input_file_id": uploaded.json()["id"], "completion_window": "24h",
                                                 "endpoint": "/v1/chat/completions"})
        assert created.status_code == 200, created.text
        return str(created.json()["id"])


def batch_row(batch_id: str, what: str = "", inside: str = "") -> str:
    """A JS expression: ``what`` of the batch's table row (or of ``inside``, a selector within the row)."""
    return f"document.querySelector(\"#batches-table tr[data-batch='{batch_id}']{inside}\"){what}"


def test_a_batch_shows_its_progress_until_completed_and_one_is_cancelled(
    stack: Emulator, console: Browser, shots: Path
) -> None:
    browser = console
    lines = 24
    batch_id = batch_file(stack, ALICE, lines, latency_ms=400)
    theirs = batch_file(stack, BOB, 2)
    show(browser, "batches")
    browser.wait(f"!!{batch_row(batch_id)}", what="the batch in the table")
    browser.js("""window.batchProgress = [];
        new MutationObserver(() => {
            const bar = document.querySelector("#batches-table tr[data-batch='BATCH'] progress");
            if (bar && bar.hasAttribute('value')) batchProgress.push(Number(bar.getAttribute('value')));
        }).observe(document.getElementById('batches-table'), {childList: true, subtree: true});""".replace(
        "BATCH", batch_id))
    # the page refreshes itself while the batch runs: nothing here clicks Refresh
    browser.wait(f"{batch_row(batch_id, '.dataset.status')} === 'completed'", timeout=180,
                 what="the batch to complete on the page")
    assert browser.js("Number(" + batch_row(batch_id, ".getAttribute('max')", " progress") + ")") == lines
    assert browser.js("Number(" + batch_row(batch_id, ".getAttribute('value')", " progress") + ")") == lines
    assert f"{lines} / {lines}" in browser.text(f"#batches-table tr[data-batch='{batch_id}']")
    seen = browser.js("batchProgress")
    assert seen == sorted(seen) and seen[-1] == lines, seen  # the bar only ever moved forward
    assert theirs not in browser.text("#batches-table")  # bob's batch is nowhere in alice's page
    labels_and_landmarks(browser)
    browser.screenshot(shots / "batches.png")

    hanging = batch_file(stack, ALICE, 4, hang=True)
    browser.click("#batches-refresh")
    browser.wait(f"!!{batch_row(hanging, inside=' button')}", what="a cancel button on the running batch")
    assert browser.js(batch_row(hanging, ".getAttribute('aria-label')", " button")) == f"Cancel {hanging}"
    assert browser.js(batch_row(batch_id, inside=" button")) is None  # a completed batch has nothing to cancel
    keyboard_reaches_everything(browser)
    browser.click(f"#batches-table tr[data-batch='{hanging}'] button")
    browser.wait(f"document.getElementById('notice').innerText.includes('Cancel requested: {hanging}')",
                 what="cancel requested")
    browser.wait(f"{batch_row(hanging, '.dataset.status')} === 'cancelled'", timeout=120,
                 what="the batch to end cancelled")
    browser.screenshot(shots / "batches-cancelled.png")
    assert browser.errors == []


@pytest.fixture
def loaded_alice(loaded_stack: Emulator) -> Iterator[Client]:
    with Client(loaded_stack.url, ALICE) as client:
        yield client


def test_the_page_stays_responsive_with_ten_thousand_jobs_queued(loaded_stack: Emulator, browser: Browser,
                                                                 loaded_alice: Client) -> None:
    stack, alice = loaded_stack, loaded_alice
    dead = alice.submit(chat("a dead letter for the DLQ page", fail_attempts=99))
    assert alice.wait(dead.id, timeout=60).dead_lettered

    async def fill() -> None:
        async with AsyncClient(stack.url, LOADER, max_connections=32) as loader:
            gate = asyncio.Semaphore(32)

            async def one(i: int) -> None:
                async with gate:
                    await loader.submit(chat(f"load {i}", latency_ms=600_000))

            await asyncio.gather(*(one(i) for i in range(QUEUED_JOBS)))

    started = time.monotonic()
    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds this thread's event loop
        pool.submit(asyncio.run, fill()).result()
    print(f"queued {QUEUED_JOBS} jobs in {time.monotonic() - started:.1f}s")
    eventually(lambda: alice.scale()["unfinished"] >= QUEUED_JOBS, what="the backlog", timeout=30, interval=0.5)

    sign_in(browser, stack)
    show(browser, "overview")
    took_ms = browser.js("(async () => { const t = performance.now(); await refreshScale(); await refreshHistory(); "
                         "return performance.now() - t; })()")
    lag = int(browser.text("#g-lag").replace(",", ""))
    unfinished = int(browser.text("#g-unfinished").replace(",", ""))
    assert unfinished >= QUEUED_JOBS and lag + int(browser.text("#g-pending").replace(",", "")) > 0
    # fair share: the loader's backlog waits for its turn, shown by tenant
    assert browser.js("document.querySelector('#waiting-rows tr td').innerText") == "load"
    show(browser, "dlq")
    dlq_ms = browser.js("(async () => { const t = performance.now(); await refreshDlq(); "
                        "return performance.now() - t; })()")
    assert browser.js("document.querySelectorAll('#dlq-table tbody tr').length") >= 1
    mine = alice.submit(chat("still answered"))
    look_up(browser, mine.id)
    assert job_status(browser) == "queued"  # behind ten thousand: looked up at once all the same
    print(f"with {unfinished} unfinished: overview refresh {took_ms:.0f} ms, DLQ page {dlq_ms:.0f} ms")
    assert browser.errors == []
