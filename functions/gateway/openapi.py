"""The OpenAPI plumbing of the gateway: responses named by schema reference (so no response model is compiled at
import), the error statuses each route documents, and the document itself, built on first request."""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

DOC_MODELS = ("JobCreate", "JobObject", "ErrorEnvelope", "JobConflict", "JobList", "ScaleView", "Health")
"""Models no route names as its own (bodies parsed by hand, responses by reference): their schemas are added. The
response shapes live in :mod:`.response_schemas`, imported only here, when the document is first built."""

def doc(model: str, description: str, **headers: str) -> dict[str, Any]:
    """A documented response by schema name; the schemas are added when the OpenAPI document is first built, so
    no response model is compiled at import (FastAPI's ``responses={..: {"model": ..}}`` would)."""
    response: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model}"}}},
    }
    if headers:
        response["headers"] = {
            name: {"description": text, "schema": {"type": "string"}} for name, text in headers.items()
        }
    return response


JOB_ERRORS = {
    400: "Malformed request (e.g. an invalid Content-Length, a body that cannot be decoded)",
    401: "Missing or unknown API key",
    403: "Not allowed for this key: a priority above the tenant's ceiling, or an operator-only view",
    404: "Unknown job, or another tenant's",
    409: "Conflict",
    413: "Body above INFERQ_MAX_BODY_BYTES",
    422: "Invalid request",
    429: "Unfinished jobs reached INFERQ_MAX_QUEUE_DEPTH, the key's rate limit (INFERQ_RATE_LIMIT_PER_S), or (a "
         "submit) its tenant's monthly budget (INFERQ_TENANT_BUDGETS: quota_exceeded)",
    503: "Redis unreachable (on submit the outcome is unknown: retry with the same Idempotency-Key)",
}


FILE_ERRORS = {
    400: "Malformed request (e.g. a body that is not multipart/form-data)",
    401: "Missing or unknown API key",
    404: "Unknown id, or another tenant's",
    409: "Conflict with the object's state",
    413: "Body above its bound",
    422: "Invalid request",
    429: "A tenant quota reached (INFERQ_TENANT_MAX_FILES, INFERQ_TENANT_MAX_BATCHES), or its monthly budget "
         "(INFERQ_TENANT_BUDGETS) on a new batch",
    503: "Redis unreachable, or no files bucket configured",
}


def errors(
    *codes: int, texts: dict[int, str] = JOB_ERRORS, retry_after: tuple[int, ...] = (429, 503)
) -> dict[int | str, dict[str, Any]]:
    """The error statuses of a route, each the envelope; those in ``retry_after`` with that header."""
    return {
        code: doc("ErrorEnvelope", texts[code], **({"Retry-After": "Seconds to wait"} if code in retry_after else {}))
        for code in codes
    }


def documented(ok: str, *codes: int, content_type: str = "application/json") -> dict[int | str, Any]:
    """For the Files, Uploads, Batches and events routes, whose answers are plain dicts in OpenAI's shapes: a 200
    described as ``ok`` (any JSON object unless ``content_type`` says otherwise) and the error statuses."""
    schema: dict[str, Any] = {"type": "object"} if content_type == "application/json" else {"type": "string"}
    ok_doc = {"description": ok, "content": {content_type: {"schema": schema}}}
    return {200: ok_doc, **errors(*codes, texts=FILE_ERRORS, retry_after=(503,))}  # a quota's 429: no Retry-After


def install(app: FastAPI) -> None:
    """``app.openapi``: the document, built once on first request."""

    def openapi() -> dict[str, Any]:
        # Built on first request, not at import: the schema costs more than the app does to start.
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes,
                description="Every error is `{\"error\": {\"type\", \"message\"}}`. Auth: `Authorization: Bearer "
                            "<key>` or `x-api-key: <key>`.",
            )
            # FastAPI sees no model (the submit body is parsed by hand, after auth; responses are named by
            # reference): add their schemas here.
            from . import request_schemas, response_schemas

            components = schema.setdefault("components", {}).setdefault("schemas", {})
            models = (getattr(request_schemas, name, None) or getattr(response_schemas, name) for name in DOC_MODELS)
            for model in models:
                model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                for name, sub in model_schema.pop("$defs", {}).items():
                    components.setdefault(name, sub)
                components[model.__name__] = model_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
