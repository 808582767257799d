"""OpenAPI ``responses`` for the Files, Uploads, Batches and events routes: their answers are built by hand (plain
dicts in OpenAI's shapes), so the document names each status with the envelope's schema for the errors."""

from typing import Any

_ERRORS = {
    400: "Malformed request (e.g. a body that is not multipart/form-data)",
    401: "Missing or unknown API key",
    404: "Unknown id, or another tenant's",
    409: "Conflict with the object's state",
    413: "Body above its bound",
    422: "Invalid request",
    503: "Redis unreachable, or no files bucket configured",
}


def documented(ok: str, *codes: int, content_type: str = "application/json") -> dict[int | str, Any]:
    """A 200 described as ``ok`` (any JSON object unless ``content_type`` says otherwise) and the error statuses."""
    schema: dict[str, Any] = {"type": "object"} if content_type == "application/json" else {"type": "string"}
    responses: dict[int | str, Any] = {200: {"description": ok, "content": {content_type: {"schema": schema}}}}
    for code in codes:
        responses[code] = {
            "description": _ERRORS[code],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}},
        }
        if code == 503:
            retry_after = {"description": "Seconds to wait", "schema": {"type": "string"}}
            responses[code]["headers"] = {"Retry-After": retry_after}
    return responses
