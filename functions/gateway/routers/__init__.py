"""The gateway's routers, one module per concern, each a module-level ``router`` (FastAPI's ``APIRouter``) with its
handlers as module-level functions; :func:`functions.gateway.api.create_app` includes them. Each is imported on the
first request that needs it (a Lambda sandbox that only submits and gets never imports one: the hot path serves
those), so nothing is imported here."""
