"""The web console, served by the gateway itself at ``/console/``, and the history read it charts.

The console is static: plain HTML, CSS and JS shipped in the package (``functions/gateway/console/``), no build
step, no CDN, no external font. The page holds no data: the person types an API key, which stays in the browser's
``sessionStorage``, and the page calls the public API with it like any client (so a tenant sees only its own
jobs). Assets are read once per process, answered with a strong ``ETag`` (304 on ``If-None-Match``); the page
names them with their content hash (``app.js?v=<hash>``), so they are cached for a year and a new release is
fetched at once. A strict Content-Security-Policy keeps the key from leaving for any other origin.

``GET /v1/stats/history`` is the operators' read of ``inferq:{Q}:history`` (:mod:`inferq.queue.history`): queue-wide
counters and gauges, numbers only; a tenant that is not an operator (``INFERQ_ADMIN_TENANTS``) gets 403, as on
``GET /v1/scale``, and the console then shows the tenant's own views only.
"""

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from starlette.responses import RedirectResponse, Response

from inferq.queue.history import HISTORY_SAMPLES, read_history

from ..dependencies import GatewayDep, Tenant
from ..errors import ApiError

router = APIRouter()

ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "usage.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
INDEX = "index.html"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
"""The page itself: always revalidated (a 304 costs nothing), so a deployment's new asset hashes are seen at once."""

_SAMPLE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["at"],
    "properties": {
        "at": {"type": "number", "description": "Unix seconds"},
        **{name: {"type": "integer"} for name in ("enqueued", "succeeded", "failed", "cancelled", "expired")},
        "latency_ms_total": {"type": "integer", "description": "Sum of finished_at - created_at over terminal jobs"},
        **{name: {"type": "integer"} for name in ("lag", "pending", "delayed", "unfinished", "dlq", "workers")},
        "desired": {"type": ["integer", "null"]},
        "running": {"type": ["integer", "null"]},
    },
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str
    cache_control: str


def _etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def load_assets() -> dict[str, Asset]:
    """Every file of the console, the page with its assets' hashes written in."""
    folder = resources.files("functions.gateway").joinpath("console")
    assets: dict[str, Asset] = {}
    for name, media_type in ASSETS.items():
        body = folder.joinpath(name).read_bytes()
        assets[name] = Asset(body, media_type, _etag(body), IMMUTABLE)
    page = folder.joinpath(INDEX).read_text(encoding="utf-8")
    for name, asset in assets.items():
        page = page.replace(f'"{name}"', f'"{name}?v={asset.etag.strip(chr(34))[:12]}"')
    body = page.encode()
    assets[INDEX] = Asset(body, "text/html; charset=utf-8", _etag(body), REVALIDATE)
    return assets


def _answer(request: Request, asset: Asset) -> Response:
    headers = {"ETag": asset.etag, "Cache-Control": asset.cache_control, **SECURITY_HEADERS}
    if asset.etag in (tag.strip() for tag in request.headers.get("if-none-match", "").split(",")):
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


_assets: dict[str, Asset] = {}


def assets() -> dict[str, Asset]:
    """The console's files, read on first use: the Lambda's cold start does not pay for the console."""
    if not _assets:
        _assets.update(load_assets())
    return _assets


@router.get("/console", include_in_schema=False)
async def console_root() -> Response:
    # relative, so the console also works under an API Gateway stage prefix
    return RedirectResponse("console/", status_code=308)


@router.get("/console/", include_in_schema=False)
async def console_page(request: Request) -> Response:
    return _answer(request, assets()[INDEX])


@router.get("/console/{name}", include_in_schema=False)
async def console_asset(request: Request, name: str) -> Response:
    asset = assets().get(name) if name != INDEX else None
    if asset is None:
        raise ApiError(404, "no such console file")
    return _answer(request, asset)


_ERROR_REF = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "string"}}}


@router.get(
    "/v1/stats/history",
    summary="Recent samples of the queue's counters and gauges, oldest first (the console's charts)",
    response_model=None,
    responses={
        200: {"description": "Samples, at most one every 5 s, the newest last",
              "content": {"application/json": {"schema": {
                  "type": "object", "required": ["object", "data"],
                  "properties": {"object": {"const": "list"},
                                 "data": {"type": "array", "items": _SAMPLE_SCHEMA}}}}}},
        **{code: {"description": text, "content": _ERROR_REF}
           for code, text in ((400, "Malformed request"), (401, "Missing or unknown API key"),
                              (403, "Not an operator key (INFERQ_ADMIN_TENANTS)"),
                              (413, "Body above INFERQ_MAX_BODY_BYTES"), (422, "Invalid request"))},
        503: {"description": "Redis unreachable", "content": _ERROR_REF, "headers": _RETRY_AFTER},
    },
)
async def stats_history(
    gw: GatewayDep,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=HISTORY_SAMPLES, description="At most this many samples")]
    = HISTORY_SAMPLES,
) -> JSONResponse:
    gw.require_admin(tenant)  # queue-wide numbers: operators only
    samples = await gw.call(read_history(gw.queue, limit))
    return JSONResponse({"object": "list", "data": samples})
