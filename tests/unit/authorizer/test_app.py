"""The HTTP API's Lambda authorizer (functions/authorizer/app.py) as API Gateway calls it: a payload 2.0 REQUEST
event, a simple response back. Keys come from a Secrets Manager secret (moto) holding SHA-256 digests, read through
the gateway's own key store: a key in either header is let through with its tenant, a missing, wrong or revoked key
is refused, and while the secret cannot be read the last good keys are served for a bounded time, then the
invocation fails (API Gateway: 500) instead of calling good keys bad."""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto import mock_aws

from functions.gateway.auth import KeysUnavailable
from inferq.config.settings import SettingsError
from tests.conftest import load_event
from tests.support.clock import FakeClock

ROOT = Path(__file__).resolve().parents[3]
MODULE = "functions.authorizer.app"
SECRET = "inferq/api-keys"
KEY_S = "prod-key-of-tenant-s"
KEY_T = "prod-key-of-tenant-t"
HEAVY = ("fastapi", "starlette", "pydantic", "mangum", "redis", "hiredis", "boto3", "botocore", "yaml", "httpx")
"""What the authorizer must not load at import: the gateway's framework, the queue's client, boto3 (the runtime
has it, but it costs a fifth of a second; it comes at the first Secrets Manager read)."""


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def event(**headers: str) -> dict[str, Any]:
    """The authorizer's event for POST /v1/jobs with exactly these headers (names as API Gateway gives them)."""
    payload = copy.deepcopy(load_event("apiGatewayV2AuthorizerRequest.json"))
    kept = {k: v for k, v in payload["headers"].items() if k not in ("authorization", "x-api-key")}
    payload["headers"] = {**kept, **{name.replace("_", "-"): value for name, value in headers.items()}}
    return payload


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "eu-west-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("secretsmanager")
        client.create_secret(Name=SECRET, SecretString=json.dumps({sha(KEY_S): "tenant-s", sha(KEY_T): "tenant-t"}))
        yield client


@pytest.fixture
def load_authorizer(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ModuleType]]:
    """Imports the handler module afresh, as a new sandbox does, with these INFERQ_ variables (and no others)."""
    loaded: list[ModuleType] = []

    def load(**variables: str) -> ModuleType:
        for name in [n for n in os.environ if n.startswith("INFERQ_")]:
            monkeypatch.delenv(name)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        sys.modules.pop(MODULE, None)
        module = importlib.import_module(MODULE)
        loaded.append(module)
        return module

    yield load
    for module in loaded:
        module.handler.close()
    sys.modules.pop(MODULE, None)


def test_a_key_in_either_header_is_let_through_with_its_tenant(
    secrets: Any, load_authorizer: Callable[..., ModuleType]
) -> None:
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET).handler
    allowed_s = {"isAuthorized": True, "context": {"tenant": "tenant-s"}}
    assert handler(event(authorization=f"Bearer {KEY_S}"), None) == allowed_s
    assert handler(event(authorization=f"bearer {KEY_S}"), None) == allowed_s  # the scheme in any case
    assert handler(event(x_api_key=KEY_S), None) == allowed_s
    assert handler(event(x_api_key=KEY_T), None) == {"isAuthorized": True, "context": {"tenant": "tenant-t"}}
    # as the gateway reads them: a Bearer key wins over x-api-key; another scheme leaves x-api-key to decide
    assert handler(event(authorization=f"Bearer {KEY_T}", x_api_key=KEY_S), None)["context"] == {"tenant": "tenant-t"}
    assert handler(event(authorization=f"Basic {KEY_T}", x_api_key=KEY_S), None)["context"] == {"tenant": "tenant-s"}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": ""},
        {"authorization": "Bearer"},
        {"authorization": "Bearer   "},
        {"x_api_key": ""},
        {"authorization": f"Basic {KEY_S}"},  # a key, but not as the API takes it
        {"authorization": f"Token {KEY_S}"},
    ],
    ids=["no headers", "empty authorization", "bearer without key", "bearer blank", "empty x-api-key", "basic",
         "other scheme"],
)
def test_a_request_without_a_key_is_refused(
    secrets: Any, load_authorizer: Callable[..., ModuleType], headers: dict[str, str]
) -> None:
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET).handler
    assert handler(event(**headers), None) == {"isAuthorized": False}


def test_the_console_page_alone_is_let_through_without_a_key(
    secrets: Any, load_authorizer: Callable[..., ModuleType]
) -> None:
    """``GET /console/`` cannot be a public route (a route may not end in "/"), so it reaches the authorizer."""
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET).handler

    def request(method: str, path: str) -> dict[str, Any]:
        payload = event()
        payload["rawPath"] = payload["requestContext"]["http"]["path"] = path
        payload["requestContext"]["http"]["method"] = method
        return payload

    assert handler(request("GET", "/console/"), None) == {"isAuthorized": True}
    for method, path in [("POST", "/console/"), ("GET", "/console"), ("GET", "/console//"), ("GET", "/v1/jobs/"),
                         ("GET", "/console/../v1/dlq"), ("DELETE", "/console/")]:
        assert handler(request(method, path), None) == {"isAuthorized": False}, (method, path)


def test_a_wrong_key_is_refused(secrets: Any, load_authorizer: Callable[..., ModuleType]) -> None:
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET).handler
    for wrong in ("unknown-key", sha(KEY_S), KEY_S.upper(), KEY_S[:-1], f"{KEY_S},{KEY_T}"):
        assert handler(event(authorization=f"Bearer {wrong}"), None) == {"isAuthorized": False}, wrong
        assert handler(event(x_api_key=wrong), None) == {"isAuthorized": False}, wrong


def test_a_revoked_key_is_refused_once_the_cache_expires(
    secrets: Any, load_authorizer: Callable[..., ModuleType]
) -> None:
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET, INFERQ_API_KEYS_CACHE_S="0").handler
    assert handler(event(x_api_key=KEY_S), None)["isAuthorized"] is True
    secrets.put_secret_value(SecretId=SECRET, SecretString=json.dumps({sha(KEY_T): "tenant-t"}))
    assert handler(event(x_api_key=KEY_S), None) == {"isAuthorized": False}
    assert handler(event(x_api_key=KEY_T), None)["isAuthorized"] is True


def test_an_unreadable_secret_serves_the_last_keys_for_a_bounded_time_then_fails_closed(
    secrets: Any, load_authorizer: Callable[..., ModuleType]
) -> None:
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET, INFERQ_API_KEYS_CACHE_S="0",
                              INFERQ_API_KEYS_MAX_STALE_S="2").handler
    clock = FakeClock()
    handler.keys.secret.clock = clock  # the store the module made, on a clock the test moves
    assert handler(event(x_api_key=KEY_S), None)["isAuthorized"] is True
    secrets.delete_secret(SecretId=SECRET, ForceDeleteWithoutRecovery=True)  # Secrets Manager cannot answer
    assert handler(event(x_api_key=KEY_S), None)["isAuthorized"] is True  # stale, within the bound
    assert handler(event(x_api_key="unknown-key"), None) == {"isAuthorized": False}
    clock.advance(2)  # 2 s past the last good read: the bound
    with pytest.raises(KeysUnavailable):
        handler(event(x_api_key=KEY_S), None)
    with pytest.raises(KeysUnavailable):  # and stays refused: no good key is called bad, no bad key let through
        handler(event(x_api_key="unknown-key"), None)


def test_an_unreadable_secret_at_the_first_request_fails_the_invocation(
    secrets: Any, load_authorizer: Callable[..., ModuleType]
) -> None:
    handler = load_authorizer(INFERQ_API_KEYS_SECRET="inferq/no-such-secret").handler
    with pytest.raises(KeysUnavailable):
        handler(event(x_api_key=KEY_S), None)
    assert handler(event(), None) == {"isAuthorized": False}  # no key: refused without asking the store


def test_secrets_manager_unreachable_at_the_first_request_fails_the_invocation(
    load_authorizer: Callable[..., ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No answer at all (a closed port: the connection is refused), not an error answer: the same, fail closed."""
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:1"}.items():
        monkeypatch.setenv(name, value)
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET).handler
    with pytest.raises(KeysUnavailable):
        handler(event(x_api_key=KEY_S), None)
    with pytest.raises(KeysUnavailable):  # within the back-off: refused at once, no pile-up of reads
        handler(event(authorization=f"Bearer {KEY_T}"), None)


def test_development_keys_work_as_in_the_gateway(load_authorizer: Callable[..., ModuleType]) -> None:
    handler = load_authorizer(INFERQ_API_KEYS="dev:dev-key-0000001").handler
    assert handler(load_event("apiGatewayV2AuthorizerRequest.json") | {"headers": {"x-api-key": "dev-key-0000001"}},
                   None) == {"isAuthorized": True, "context": {"tenant": "dev"}}


def test_no_keys_at_all_fail_the_init_naming_the_variable(load_authorizer: Callable[..., ModuleType]) -> None:
    with pytest.raises(SettingsError) as excinfo:
        load_authorizer()
    assert excinfo.value.variable == "INFERQ_API_KEYS"
    with pytest.raises(SettingsError) as excinfo:
        load_authorizer(INFERQ_API_KEYS="dev:k", INFERQ_API_KEYS_MAX_STALE_S="soon")
    assert excinfo.value.variable == "INFERQ_API_KEYS_MAX_STALE_S"


def test_no_key_reaches_the_log(
    secrets: Any, load_authorizer: Callable[..., ModuleType], caplog: pytest.LogCaptureFixture
) -> None:
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET, INFERQ_API_KEYS_CACHE_S="0",
                              INFERQ_API_KEYS_MAX_STALE_S="0", INFERQ_LOG_LEVEL="DEBUG").handler
    caplog.set_level("DEBUG", logger="inferq")
    caplog.set_level("DEBUG", logger="functions")
    handler(event(x_api_key=KEY_S), None)
    handler(event(x_api_key="a-wrong-key-0001"), None)
    secrets.delete_secret(SecretId=SECRET, ForceDeleteWithoutRecovery=True)
    with pytest.raises(KeysUnavailable):
        handler(event(authorization=f"Bearer {KEY_T}"), None)
    ours = [r for r in caplog.records if r.name.startswith(("inferq", "functions"))]
    assert any(r.name == "inferq.authorizer" for r in ours)  # the refusal is logged ...
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in ours)
    for secret in (KEY_S, KEY_T, "a-wrong-key-0001", sha(KEY_S)):
        assert secret not in logged  # ... and no key, nor its digest


def test_the_cold_import_loads_no_framework_no_redis_and_no_boto3() -> None:
    probe = (
        "import sys\n"
        f"import {MODULE}\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env["INFERQ_API_KEYS_SECRET"] = SECRET  # the deployed shape: boto3 only at the first read
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


PARITY_CASES = [
    {},
    {"authorization": "Bearer key-0000000001"},
    {"authorization": "bearer key-0000000001"},
    {"authorization": "BEARER key-0000000001"},
    {"authorization": "Bearer  key-0000000001"},
    {"authorization": "Bearer key-0000000001 extra"},
    {"authorization": "Bearer"},
    {"authorization": "Basic key-0000000001"},
    {"authorization": "key-0000000001"},
    {"x-api-key": "key-0000000001"},
    {"x-api-key": "key-000000000"},
    {"authorization": "Bearer wrong-key-01", "x-api-key": "key-0000000001"},
    {"authorization": "Basic wrong-key-01", "x-api-key": "key-0000000001"},
    {"authorization": "Bearer key-0000000001", "x-api-key": "wrong-key-01"},
]


@pytest.mark.parametrize("headers", PARITY_CASES, ids=[" & ".join(f"{k}: {v}" for k, v in c.items()) or "none"
                                                        for c in PARITY_CASES])
def test_the_authorizer_lets_through_exactly_what_the_gateway_accepts(
    load_authorizer: Callable[..., ModuleType], headers: dict[str, str]
) -> None:
    """The same headers, the same keys: the authorizer and the gateway app (its Redis a closed port, so a request it
    accepts answers 503, one it refuses 401) decide alike."""
    from starlette.testclient import TestClient

    from functions.gateway.api import create_app
    from inferq.config.settings import Settings

    handler = load_authorizer(INFERQ_API_KEYS="tenant:key-0000000001").handler
    let_through = handler(event(**{k.replace("-", "_"): v for k, v in headers.items()}), None)["isAuthorized"]
    settings = Settings.from_env({"INFERQ_API_KEYS": "tenant:key-0000000001",
                                  "INFERQ_REDIS_URL": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        status = client.get("/v1/dlq", headers=headers).status_code
    assert status in (401, 503)
    assert let_through is (status != 401)


# ---------------------------------------------------------------------- the edge's origin header (issue 47, M4)

EDGE_SECRET = "inferq/edge-origin"
ORIGIN = "origin-value-of-the-edge-0123456789abcdef"
NEXT_ORIGIN = "origin-value-after-rotation-fedcba987654"


def through_edge(value: str = ORIGIN, **headers: str) -> dict[str, Any]:
    """The event of a request CloudFront forwarded: its origin header added."""
    return event(x_inferq_origin_verify=value, **headers)


@pytest.fixture
def edge(secrets: Any) -> Any:
    secrets.create_secret(Name=EDGE_SECRET, SecretString=json.dumps({"current": ORIGIN}))
    return secrets


def test_with_an_edge_only_a_request_through_it_is_let_through(
    edge: Any, load_authorizer: Callable[..., ModuleType]
) -> None:
    """The API's execute-api address called directly (no header, or a wrong one) is refused whatever the key:
    ``isAuthorized: false``, which API Gateway answers 403; through the edge the key decides as before."""
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET, INFERQ_EDGE_ORIGIN_SECRET=EDGE_SECRET).handler
    assert handler(through_edge(x_api_key=KEY_S), None) == {"isAuthorized": True, "context": {"tenant": "tenant-s"}}
    assert handler(through_edge(x_api_key="unknown-key"), None) == {"isAuthorized": False}
    for wrong in ("", ORIGIN[:-1], ORIGIN.upper(), f"{ORIGIN},{ORIGIN}", ORIGIN + " ", json.dumps({"current": ORIGIN})):
        assert handler(through_edge(wrong, x_api_key=KEY_S), None) == {"isAuthorized": False}, wrong
    assert handler(event(x_api_key=KEY_S), None) == {"isAuthorized": False}
    assert handler(event(authorization=f"Bearer {KEY_T}"), None) == {"isAuthorized": False}
    # the keyless console page too: nothing answers a direct caller but the public routes (no authorizer at all)
    direct = event()
    direct["rawPath"] = direct["requestContext"]["http"]["path"] = "/console/"
    direct["requestContext"]["http"]["method"] = "GET"
    assert handler(direct, None) == {"isAuthorized": False}
    direct["headers"]["x-inferq-origin-verify"] = ORIGIN
    assert handler(direct, None) == {"isAuthorized": True}


def test_a_direct_caller_costs_no_secret_read(edge: Any, load_authorizer: Callable[..., ModuleType]) -> None:
    """A flood of direct requests without the header reads nothing: it is refused before the secret is looked at."""
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET, INFERQ_EDGE_ORIGIN_SECRET=EDGE_SECRET).handler
    for _ in range(5):
        assert handler(event(x_api_key=KEY_S), None) == {"isAuthorized": False}
    assert handler.origin.secret.reads == 0 and handler.keys.secret.reads == 0


def test_during_a_rotation_both_values_pass_and_after_it_the_old_one_stops(
    edge: Any, load_authorizer: Callable[..., ModuleType]
) -> None:
    """DEPLOY.md, "Rotating the origin secret": the new value is put beside the old (``previous``), CloudFront is
    moved to it, then ``previous`` goes; each step reaches the authorizer when its copy expires (five minutes)."""
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET, INFERQ_EDGE_ORIGIN_SECRET=EDGE_SECRET).handler
    clock = FakeClock()
    handler.origin.secret.clock = clock
    assert handler(through_edge(x_api_key=KEY_S), None)["isAuthorized"] is True
    edge.put_secret_value(SecretId=EDGE_SECRET, SecretString=json.dumps({"current": NEXT_ORIGIN, "previous": ORIGIN}))
    assert handler(through_edge(NEXT_ORIGIN, x_api_key=KEY_S), None)["isAuthorized"] is False  # the copy in hand
    clock.advance(300)
    for value in (ORIGIN, NEXT_ORIGIN):
        assert handler(through_edge(value, x_api_key=KEY_S), None)["isAuthorized"] is True, value
    edge.put_secret_value(SecretId=EDGE_SECRET, SecretString=json.dumps({"current": NEXT_ORIGIN}))
    clock.advance(300)
    assert handler(through_edge(ORIGIN, x_api_key=KEY_S), None) == {"isAuthorized": False}
    assert handler(through_edge(NEXT_ORIGIN, x_api_key=KEY_S), None)["isAuthorized"] is True


@pytest.mark.parametrize("stored", [None, "not json", json.dumps({"current": ""}), json.dumps(["x"])],
                         ids=["no secret", "not json", "empty", "not an object"])
def test_an_origin_secret_that_cannot_be_read_fails_the_invocation(
    secrets: Any, load_authorizer: Callable[..., ModuleType], stored: str | None
) -> None:
    """Fail closed: no request with a header is let through on a secret the authorizer cannot read (API Gateway
    answers 500), and one without the header is still refused."""
    from inferq.aws import SecretUnavailable

    if stored is not None:
        secrets.create_secret(Name=EDGE_SECRET, SecretString=stored)
    handler = load_authorizer(INFERQ_API_KEYS_SECRET=SECRET, INFERQ_EDGE_ORIGIN_SECRET=EDGE_SECRET).handler
    with pytest.raises(SecretUnavailable):
        handler(through_edge(x_api_key=KEY_S), None)
    assert handler(event(x_api_key=KEY_S), None) == {"isAuthorized": False}
