"""The scaler role of ``inferq up``: the real Lambda handler, called with an EventBridge scheduled event every
``INFERQ_SCALER_INTERVAL_S`` and at once when the gateway POSTs to the wake URL this process serves.

Run as ``python -m emulator.scaler --wake-port PORT``. One evaluation per call: the Lambda context says only a
second is left, so the handler does not loop inside an invocation the way it does in AWS.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .ecs import ACCOUNT, REGION

FUNCTION_NAME = "inferq-scaler"
BUDGET_MS = 1000


def scheduled_event(rule: str = "inferq-scaler-schedule") -> dict[str, Any]:
    """The payload EventBridge sends a rule's target on a schedule."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": [f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{rule}"],
        "detail": {},
    }


class LambdaContext:
    """The attributes of the Lambda context object that handlers and Powertools read."""

    function_name = FUNCTION_NAME
    function_version = "$LATEST"
    invoked_function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{FUNCTION_NAME}"
    memory_limit_in_mb = 256
    log_group_name = f"/aws/lambda/{FUNCTION_NAME}"
    log_stream_name = "emulator"

    def __init__(self, budget_ms: int = BUDGET_MS, clock: Callable[[], float] = time.monotonic) -> None:
        self.aws_request_id = str(uuid.uuid4())
        self._clock = clock
        self._deadline = clock() + budget_ms / 1000

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - self._clock()) * 1000))


class Wake:
    """The latest wake payload (what an asynchronous Lambda invoke would deliver) and the event that ends the wait."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._payload: dict[str, Any] | None = None

    def post(self, payload: dict[str, Any] | None) -> None:
        with self._lock:
            self._payload = payload
        self.event.set()

    def take(self) -> dict[str, Any] | None:
        with self._lock:
            payload, self._payload = self._payload, None
        return payload


class _WakeHandler(BaseHTTPRequestHandler):
    wake: Wake

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path.split("?", 1)[0].rstrip("/") not in ("", "/wake"):
            self._answer(404, {"error": {"type": "not_found", "message": self.path}})
            return
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = None
        self.wake.post(payload if isinstance(payload, dict) else None)
        self._answer(202, {"woken": True})

    def _answer(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # the handler logs each invocation and its trigger
        pass


def serve_wake(host: str, port: int, wake: Wake) -> ThreadingHTTPServer:
    handler = type("WakeHandler", (_WakeHandler,), {"wake": wake})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="wake", daemon=True).start()
    return server


def run(interval_s: float, wake: Wake) -> None:
    """Invoke the handler on the schedule; a wake cuts the wait short and is delivered as its own event, the way
    the gateway's asynchronous invoke reaches the function in AWS. A wake that lands during an invocation is kept
    and runs right after it."""
    from functions.scaler.app import handler, logger

    event = scheduled_event()
    while True:  # until SIGTERM: the scaler holds no state worth a graceful stop
        wake.event.clear()
        try:
            handler(event, LambdaContext())
        except Exception:  # logged as the Lambda runtime would report it; the next tick tries again
            logger.exception("scaler invocation failed")
        woken = wake.event.wait(interval_s)
        payload = wake.take() if woken else None
        event = payload if payload is not None else scheduled_event()


def main(argv: list[str] | None = None) -> int:
    from inferq.config.settings import load_or_exit

    parser = argparse.ArgumentParser(prog="python -m emulator.scaler")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--wake-port", type=int, required=True)
    args = parser.parse_args(argv)
    settings = load_or_exit()
    wake = Wake()
    serve_wake(args.host, args.wake_port, wake)
    from functions.scaler.app import logger

    logger.info(f"invoking {FUNCTION_NAME} every {settings.scaler_interval_s:g}s, and at once on POST "
                f"http://{args.host}:{args.wake_port}/wake")
    run(settings.scaler_interval_s, wake)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
