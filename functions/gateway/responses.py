"""The gateway's JSON response: Starlette's, with one encoder made once.

Starlette's ``JSONResponse.render`` calls ``json.dumps`` with options, which builds a new ``JSONEncoder`` for every
response: a third of the encoding of a job object here. This one renders the same bytes (the same options) with an
encoder made at import.
"""

import json
from typing import Any

from starlette.responses import JSONResponse as _StarletteJSONResponse

__all__ = ["JSONResponse"]

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))


class JSONResponse(_StarletteJSONResponse):
    def render(self, content: Any) -> bytes:
        return _ENCODER.encode(content).encode("utf-8")
