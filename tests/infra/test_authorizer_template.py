"""The HTTP API's Lambda authorizer in template.yaml, read back after the SAM transform: every route runs it but the
public ones, and the public ones are exactly what the gateway itself serves without a key; it is a REQUEST
authorizer with simple responses, payload 2.0 and no identity source (a key may come in either of two headers); a
small function outside the VPC, with its own reserved concurrency, allowed to read the API keys secret and nothing
else."""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi.routing import iter_route_contexts
from starlette.routing import Route
from starlette.testclient import TestClient

from functions.authorizer.check import KEYLESS_PAGES
from functions.gateway.api import create_app
from inferq.config.settings import Settings

from .cfn import Resolver, as_list, role_statements
from .test_template import environment, function, role_of

AUTHORIZER = "ApiKeyAuthorizer"


def routes(translated: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(METHOD, path) -> the operation, for every route of the HTTP API (``("ANY", "$default")`` the catch-all)."""
    paths = translated["Resources"]["HttpApi"]["Properties"]["Body"]["paths"]
    found = {}
    for path, methods in paths.items():
        for method, operation in methods.items():
            verb = "ANY" if method == "x-amazon-apigateway-any-method" else method.upper()
            found[(verb, path.removeprefix("/") if path == "/$default" else path)] = operation
    return found


def authorizers_of(operation: dict[str, Any]) -> list[str]:
    return [name for requirement in operation.get("security", []) for name in requirement]


def keyless_routes_of_the_gateway() -> set[tuple[str, str]]:
    """Every (method, path) the gateway app answers without a key, found by asking it: a route that needs a key
    answers 401 before anything else (its Redis here is a closed port, so a route that goes further answers 503)."""
    settings = Settings.from_env({"INFERQ_API_KEYS": "tenant:key-0000000001", "INFERQ_REDIS_URL": "redis://127.0.0.1:1/0"})
    app = create_app(settings)
    keyless = set()
    with TestClient(app, raise_server_exceptions=False) as client:
        for route in (context.original_route for context in iter_route_contexts(app.routes)):
            assert isinstance(route, Route)
            for method in sorted((route.methods or set()) - {"HEAD"}):
                url = re.sub(r"\{[^}]+\}", "x", route.path)
                if client.request(method, url, follow_redirects=False).status_code != 401:
                    keyless.add((method, route.path))
    return keyless


def test_every_route_but_the_public_ones_runs_the_authorizer(translated: dict[str, Any]) -> None:
    api = routes(translated)
    assert authorizers_of(api[("ANY", "$default")]) == [AUTHORIZER]
    public = {route for route, operation in api.items() if authorizers_of(operation) == ["NONE"]}
    assert {route for route, operation in api.items() if authorizers_of(operation) != [AUTHORIZER]} == public
    # public is exactly what the gateway serves without a key: health, the API description, the console's files;
    # the console's page (a route may not end in "/") reaches the catch-all, whose authorizer lets that page alone
    # through without a key
    assert public | set(KEYLESS_PAGES) == keyless_routes_of_the_gateway()
    assert public == {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/openapi.json"), ("GET", "/console"),
                      ("GET", "/console/{name}")}
    assert all(not path.endswith("/") for _, path in public)


def test_the_authorizer_takes_either_header_so_requires_none_and_cannot_be_cached(translated: dict[str, Any]) -> None:
    schemes = translated["Resources"]["HttpApi"]["Properties"]["Body"]["components"]["securitySchemes"]
    authorizer = schemes[AUTHORIZER]["x-amazon-apigateway-authorizer"]
    assert authorizer["type"] == "request"
    assert authorizer["authorizerPayloadFormatVersion"] == "2.0"
    assert authorizer["enableSimpleResponses"] is True
    # an identity source missing from a request is a 401 without invoking the authorizer, so any identity source
    # would refuse the other header's keys; caching needs one, so there is none
    assert authorizer["identitySource"] == []
    assert authorizer["authorizerResultTtlInSeconds"] == 0
    uri = authorizer["authorizerUri"]["Fn::Sub"]
    assert uri[1]["__FunctionArn__"] == {"Fn::GetAtt": ["AuthorizerFunction", "Arn"]}
    # API Gateway may invoke it as an authorizer of this API, and nothing else may
    permissions = [r["Properties"] for r in translated["Resources"].values() if r["Type"] == "AWS::Lambda::Permission"
                   and r["Properties"]["FunctionName"] == {"Fn::GetAtt": ["AuthorizerFunction", "Arn"]}]
    assert len(permissions) == 1
    assert permissions[0]["Principal"] == "apigateway.amazonaws.com"
    source_arn = permissions[0]["SourceArn"]["Fn::Sub"]
    assert source_arn[0].endswith(":${__ApiId__}/authorizers/*") and source_arn[1] == {"__ApiId__": {"Ref": "HttpApi"}}


def test_the_authorizer_is_small_outside_the_vpc_with_its_own_reserved_concurrency(
    translated: dict[str, Any]
) -> None:
    props = function(translated, "AuthorizerFunction")
    assert props["MemorySize"] == 128
    assert props["Architectures"] == ["arm64"]
    assert props["Timeout"] <= 10
    assert "VpcConfig" not in props  # it reads Secrets Manager only: no ENI, no cache
    assert Resolver(translated).value(props["ReservedConcurrentExecutions"]) == "10"
    assert Resolver(translated, overrides={"AuthorizerReservedConcurrency": "25"}).value(
        props["ReservedConcurrentExecutions"]) == "25"
    assert "ReservedConcurrentExecutions" not in Resolver(
        translated, overrides={"AuthorizerReservedConcurrency": "0"}).value(props)
    group = translated["Resources"][props["LoggingConfig"]["LogGroup"]["Ref"]]["Properties"]
    assert group["KmsKeyId"] == {"Fn::GetAtt": ["LogsKey", "Arn"]}


def test_the_authorizer_reads_the_gateway_s_key_secret_and_nothing_else(translated: dict[str, Any]) -> None:
    env = environment(translated, "AuthorizerFunction")
    assert env["INFERQ_API_KEYS_SECRET"] == environment(translated, "GatewayFunction")["INFERQ_API_KEYS_SECRET"]
    assert env["INFERQ_API_KEYS_SECRET"] == {"Ref": "ApiKeysSecret"}
    assert env.get("INFERQ_API_KEYS", "") == ""  # development only: declared empty so sam local can set it
    assert not {name for name in env if name.startswith("INFERQ_REDIS")}  # no cache URL, no cache token
    role = role_of(translated, "AuthorizerFunction")
    statements = [s for owner, s in role_statements(translated) if owner == role]
    # and, with an edge (EdgeProtection waf), the origin secret CloudFront's header carries (test_security.py)
    assert [(as_list(s["Action"]), Resolver(translated).value(s["Resource"])) for s in statements] == [
        (["secretsmanager:GetSecretValue"], "ApiKeysSecret")
    ]
    assert Resolver(translated).value(env["INFERQ_EDGE_ORIGIN_SECRET"]) == ""
    managed = translated["Resources"][role]["Properties"]["ManagedPolicyArns"]
    assert not [arn for arn in managed if "VPCAccess" in str(arn)]


def test_the_access_log_names_the_tenant_the_authorizer_found_and_its_errors(translated: dict[str, Any]) -> None:
    stages = [r["Properties"] for r in translated["Resources"].values() if r["Type"] == "AWS::ApiGatewayV2::Stage"]
    log_format = json.loads(stages[0]["AccessLogSettings"]["Format"])
    assert log_format["tenant"] == "$context.authorizer.tenant"  # the context key the authorizer returns
    assert log_format["authorizerError"] == "$context.authorizer.error"
    assert not [v for v in log_format.values() if "header" in v.lower()]  # no key, no Authorization header
