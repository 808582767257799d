"""What the Lambda module's import and its first submit leave out, in a fresh interpreter (a new sandbox): the
routes other than submit and get, and their modules, come with the first request that needs them, and then answer
as before. Behaviour, not timing (the time is bench GL's: bench/lambda_gateway.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from inferq.config.settings import Settings

ROOT = Path(__file__).resolve().parents[3]

CHILD = r"""
import json, sys
from tests.conftest import load_event
ROUTERS = ["jobs", "dlq", "operations", "console", "files", "uploads", "batches", "events", "catalog", "webhooks",
           "usage"]
DEFERRED = ["functions.gateway.files", *(f"functions.gateway.routers.{name}" for name in ROUTERS)]
ON_DEMAND = ["functions.gateway.response_schemas", "functions.storage", "jsonschema", "urllib.request"]
seen = {}
import functions.gateway.app as m
class Context:
    aws_request_id = "cold-start-test"
seen["after_import"] = [name for name in DEFERRED if name in sys.modules]
routes_at_import = len(m.app.routes)
reply = m.handler(load_event("apiGatewayProxyV2SubmitJob.json"), Context())
seen["submit_status"] = reply["statusCode"]
job = json.loads(reply["body"])["id"]
event = load_event("apiGatewayProxyV2GetJob.json")
event["rawPath"] = event["requestContext"]["http"]["path"] = f"/v1/jobs/{job}"
seen["get_status"] = m.handler(event, Context())["statusCode"]
seen["after_submit_and_get"] = [name for name in DEFERRED if name in sys.modules]
seen["on_demand_after_submit_and_get"] = [name for name in ON_DEMAND if name in sys.modules]
seen["routes_grew_on_hot_requests"] = len(m.app.routes) != routes_at_import
from functions.gateway.hotpath import api_routes
seen["api_routes_after_hot"] = len(list(api_routes(m.app.routes)))
event = load_event("apiGatewayProxyV2GetJob.json")  # a get the hot path declines: its route is built and answers
event["rawPath"] = event["requestContext"]["http"]["path"] = f"/v1/jobs/{job}"
event["rawQueryString"] = "wait=abc"
event["queryStringParameters"] = {"wait": "abc"}
reply = m.handler(event, Context())
seen["declined_status"] = reply["statusCode"]
seen["declined_error"] = json.loads(reply["body"])["error"]["type"]
seen["api_routes_after_declined"] = len(list(api_routes(m.app.routes)))
event = load_event("apiGatewayProxyV2GetJob.json")
event["rawPath"] = event["requestContext"]["http"]["path"] = "/v1/models"
event["rawQueryString"] = ""
event.pop("queryStringParameters", None)
reply = m.handler(event, Context())
seen["models_status"] = reply["statusCode"]
seen["models"] = json.loads(reply["body"])
seen["after_models"] = [name for name in DEFERRED if name in sys.modules]
seen["routes_grew"] = len(m.app.routes) > routes_at_import
seen["openapi_paths"] = sorted(m.app.openapi()["paths"])
seen["schemas_after_openapi"] = "functions.gateway.response_schemas" in sys.modules
print(json.dumps(seen))
"""


def test_a_new_sandbox_builds_the_other_routes_only_when_a_request_needs_them(settings: Settings) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    env.update({"INFERQ_REDIS_URL": settings.redis_url, "INFERQ_QUEUE": settings.queue,
                "INFERQ_API_KEYS": "tenant-a:dev-key-tenant-a", "PYTHONPATH": str(ROOT)})
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["after_import"] == [] and seen["after_submit_and_get"] == []
    # nor what only the OpenAPI document, a large body, a schema-carrying body or an HTTP wake needs
    assert seen["on_demand_after_submit_and_get"] == []
    assert seen["submit_status"] == 202 and seen["get_status"] == 200
    assert not seen["routes_grew_on_hot_requests"] and seen["api_routes_after_hot"] == 0  # no FastAPI route built
    assert seen["declined_status"] == 422 and seen["api_routes_after_declined"] > 0
    assert seen["models_status"] == 200 and seen["models"]["object"] == "list"
    assert set(seen["after_models"]) == {"functions.gateway.files"} | {
        f"functions.gateway.routers.{name}" for name in ("jobs", "dlq", "operations", "console", "files", "uploads",
                                                         "batches", "events", "catalog", "webhooks", "usage")}
    assert seen["routes_grew"]
    assert {"/v1/jobs", "/v1/files", "/v1/batches", "/v1/models"} <= set(seen["openapi_paths"])
    assert seen["schemas_after_openapi"]
