"""A real headless Chromium (Debian's ``chromium`` package), driven over the Chrome DevTools Protocol on a websocket.

Just what the console's tests need: open a page, run JS in it, press keys, type, take screenshots, and collect
the page's own errors. ``chromium()`` finds the browser, installing the package with apt-get when it is missing.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
_DEVTOOLS_RE = re.compile(r"DevTools listening on (ws://\S+)")


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
        self.profile = tempfile.mkdtemp(prefix="inferq-chromium-")
        self.process = subprocess.Popen(
            [executable, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--hide-scrollbars", f"--window-size={width},{height}", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        browser_ws = self._devtools_url(timeout=60)
        # keep reading its stderr: a full pipe would stall the browser
        threading.Thread(target=self._drain, daemon=True).start()
        port = re.search(r":(\d+)/", browser_ws).group(1)  # type: ignore[union-attr]
        self._ids = itertools.count(1)
        self.errors: list[str] = []
        self.network: list[str] = []
        self._closing = contextlib.ExitStack()
        self.ws = self._closing.enter_context(self._page_socket(int(port)))
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Log.enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def _devtools_url(self, timeout: float) -> str:
        assert self.process.stderr is not None
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line and self.process.poll() is not None:
                break
            seen.append(line)
            found = _DEVTOOLS_RE.search(line)
            if found:
                return found.group(1)
        raise RuntimeError("chromium did not start:\n" + "".join(seen[-20:]))

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for _ in self.process.stderr:
            pass

    def _page_socket(self, port: int) -> ClientConnection:
        import httpx

        for _ in range(100):
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
            pages = [t for t in targets if t["type"] == "page"]
            if pages:
                return connect(pages[0]["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024, open_timeout=30)
            time.sleep(0.1)
        raise RuntimeError("chromium has no page")

    # ------------------------------------------------------------------ protocol

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
        message_id = next(self._ids)
        self.ws.send(json.dumps({"id": message_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self._event(message)

    def _event(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(str(details.get("exception", {}).get("description") or details.get("text")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            # an answered 4xx is the page's business (it shows "not found"); only script errors are errors
            found = self.network if entry.get("source") == "network" else self.errors
            found.append(f"{entry.get('text')} ({entry.get('url', '')})")

    # ------------------------------------------------------------------ the page

    def open(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})
        self.wait("document.readyState === 'complete' && !!document.body", what=f"{url} to load")

    def js(self, expression: str) -> Any:
        """The value of a JS expression (awaited when it is a promise)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True, "userGesture": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"JS error in {expression!r}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait(self, expression: str, timeout: float = 30.0, what: str | None = None) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what or expression}")
            time.sleep(0.1)

    def text(self, selector: str) -> str:
        return str(self.js(f"(document.querySelector({json.dumps(selector)}) || {{}}).innerText || ''"))

    def click(self, selector: str) -> None:
        self.wait(f"!!document.querySelector({json.dumps(selector)})", what=selector)
        self.js(f"document.querySelector({json.dumps(selector)}).click()")

    def key(self, key: str, code: int, shift: bool = False) -> None:
        """One key press as the keyboard sends it (Tab, Enter, ...)."""
        base = {"key": key, "code": key, "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code,
                "modifiers": 8 if shift else 0}
        text = {"text": "\r"} if key == "Enter" else {}
        self.send("Input.dispatchKeyEvent", {"type": "rawKeyDown", **base})
        if text:
            self.send("Input.dispatchKeyEvent", {"type": "char", **base, **text})
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", **base})

    def type(self, text: str) -> None:
        """Type into whatever has the focus."""
        self.send("Input.insertText", {"text": text})

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._closing.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            shutil.rmtree(self.profile, ignore_errors=True)
