"""A real headless Chromium (Debian's ``chromium`` package) driven by Playwright's Python package (its sync API).

Playwright drives the browser found on the PATH through ``executable_path``: no browser is downloaded (``playwright
install`` is never run). Just what the console's tests need: open a page, run JS in it, press keys, type, click,
take screenshots, and collect the page's own errors. ``chromium()`` finds the browser, installing the package with
apt-get when it is missing.

Playwright's sync API runs an event loop of its own on the calling thread while a browser is open: a test that
needs ``asyncio.run`` meanwhile runs it on another thread.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from playwright.sync_api import ConsoleMessage, Error, Response, sync_playwright

from tests.support.waiting import eventually

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
NETWORK_LOG = "Failed to load resource"
"""How Chromium words the console entry of an answer >= 400: the page's business (it shows "not found"), not an
error of its scripts."""


def chromium() -> str:
    """The browser's path; ``apt-get install chromium`` first when none is on the PATH."""
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True, timeout=600)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"], check=True,
                   capture_output=True, timeout=1200, env=env)
    found = shutil.which("chromium")
    if not found:
        raise RuntimeError("apt-get installed chromium, but it is not on the PATH")
    return found


class Browser:
    """One headless browser process with one page."""

    def __init__(self, executable: str, width: int = 1280, height: int = 900) -> None:
        self.errors: list[str] = []
        self.network: list[str] = []
        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(
                executable_path=executable, headless=True,
                args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-extensions",
                      "--disable-background-networking", "--hide-scrollbars"],
            )
            self.page = self._browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
        except Exception:
            self._playwright.stop()
            raise
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("console", self._console)
        self.page.on("response", self._response)
        self.page.set_default_timeout(30_000)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        text = f"{message.text} ({message.location.get('url', '')})"
        (self.network if message.text.startswith(NETWORK_LOG) else self.errors).append(text)

    def _response(self, response: Response) -> None:
        if response.status >= 400:
            self.network.append(f"{response.status} {response.url}")

    # ------------------------------------------------------------------ the page

    def open(self, url: str) -> None:
        self.page.goto(url, wait_until="load")
        self.wait("document.readyState === 'complete' && !!document.body", what=f"{url} to load")

    def js(self, expression: str) -> Any:
        """The value of a JS expression (awaited when it is a promise)."""
        try:
            return self.page.evaluate(expression)
        except Error as exc:
            raise RuntimeError(f"JS error in {expression!r}: {exc.message}") from None

    def wait(self, expression: str, timeout: float = 30.0, what: str | None = None) -> Any:
        """The first truthy value of a JS expression (:func:`tests.support.waiting.eventually`)."""
        return eventually(lambda: self.js(expression), what=what or expression, timeout=timeout, interval=0.1)

    def text(self, selector: str) -> str:
        found = self.page.query_selector(selector)
        return found.inner_text() if found is not None else ""

    def click(self, selector: str) -> None:
        """A real click (Playwright waits for the element to be visible, stable and enabled)."""
        self.page.locator(selector).first.click()

    def key(self, key: str, code: int, shift: bool = False) -> None:
        """One key press as the keyboard sends it (Tab, Enter, ...); ``code`` is the DOM key code, kept for the
        callers' tables (Playwright knows it from the key's name)."""
        self.page.keyboard.press(f"Shift+{key}" if shift else key)

    def type(self, text: str) -> None:
        """Type into whatever has the focus."""
        self.page.keyboard.insert_text(text)

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        try:
            self._browser.close()
        finally:
            self._playwright.stop()
