"""The emulator's scaler role hands the real handler what AWS would: EventBridge's scheduled event, a Lambda
context, and the gateway's wake event as it was posted."""

from __future__ import annotations

import json
import urllib.request

from emulator.scaler import LambdaContext, Wake, scheduled_event, serve_wake
from emulator.valkey import free_port
from functions.scaler.app import trigger
from tests.conftest import load_event
from tests.support.clock import FakeClock


def test_the_scheduled_event_has_the_shape_eventbridge_sends() -> None:
    real = load_event("eventBridgeScheduledEvent.json")
    ours = scheduled_event()
    assert ours.keys() == real.keys()
    assert {k: type(v) for k, v in ours.items()} == {k: type(v) for k, v in real.items()}
    assert (ours["source"], ours["detail-type"], ours["detail"]) == ("aws.events", "Scheduled Event", {})
    assert trigger(ours) == "schedule"


def test_the_context_budget_runs_down_and_allows_one_evaluation() -> None:
    clock = FakeClock()
    context = LambdaContext(budget_ms=1000, clock=clock)
    assert context.get_remaining_time_in_millis() == 1000
    clock.advance(0.05)
    assert context.get_remaining_time_in_millis() == 950
    clock.advance(1)
    assert context.get_remaining_time_in_millis() == 0
    assert context.aws_request_id != LambdaContext().aws_request_id


def test_a_wake_post_is_kept_with_its_payload_for_the_next_invocation() -> None:
    wake, port = Wake(), free_port()
    server = serve_wake("127.0.0.1", port, wake)
    try:
        body = json.dumps({"source": "inferq.gateway", "detail-type": "Scaler Wake", "detail": {}}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/wake", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=5) as reply:
            assert reply.status == 202
        assert wake.event.wait(1)
        payload = wake.take()
        assert payload is not None and trigger(payload) == "wake"
        assert wake.take() is None
    finally:
        server.shutdown()
        server.server_close()
