"""The HTTP API's Lambda authorizer: ``functions/authorizer/app.handler`` (template.yaml, AuthorizerFunction).

API Gateway calls it before every route but the public ones (``/healthz``, ``/readyz``, ``/openapi.json``, the
console's static files), with payload format 2.0, and reads a simple response: ``{"isAuthorized": true, "context":
{"tenant": ...}}`` lets the request on to the gateway, ``{"isAuthorized": false}`` refuses it there, so a request
without a valid key never runs the gateway function (docs/operations.md, "Security findings").

The key is read from the headers exactly as the gateway reads it (``Authorization: Bearer <key>``, else
``x-api-key``) and checked against the same key store (:func:`functions.gateway.auth.key_store`: the SHA-256
digests of ``INFERQ_API_KEYS_SECRET``, cached for ``INFERQ_API_KEYS_CACHE_S``, served stale for at most
``INFERQ_API_KEYS_MAX_STALE_S`` while Secrets Manager fails). Past that bound the store cannot answer and the
invocation fails, which API Gateway answers with a 500: fail closed, as the gateway's 503 is. The gateway checks the
key again itself (defence in depth; ``inferq up`` has no authorizer).

The authorizer has no identity sources, so API Gateway cannot cache its answers: an identity source must be present
for API Gateway to call the authorizer at all, and a client may send its key in either of two headers. The cache is
this module's: the key store lives as long as the sandbox. Every request runs the whole check, so no answer is ever
reused for a request that lacks what the first one carried (the edge's origin header included).

With an edge (``INFERQ_EDGE_ORIGIN_SECRET``, set by the stack with ``EdgeProtection: waf``) a request without the
secret header CloudFront adds is refused before its key is looked at (:mod:`.edge`): the API's ``execute-api``
address answers 403 to anyone who skipped the edge's web ACL.

Settings are read at import, so a bad variable (or no API keys at all) fails the init naming it. The import is
small on purpose: the standard library, ``inferq``'s settings and the key check; boto3 only at the first Secrets
Manager read; no FastAPI, no Redis (tests/unit/authorizer/test_app.py holds the line).
"""

from __future__ import annotations

import logging

from functions.gateway.auth import key_store
from inferq.config.settings import Settings

from .check import Authorizer
from .edge import OriginCheck

__all__ = ["handler"]

settings = Settings.from_env()
logging.getLogger("inferq").setLevel(settings.log_level)
handler = Authorizer(key_store(settings),
                     OriginCheck.of(settings.edge_origin_secret) if settings.edge_origin_secret else None)
