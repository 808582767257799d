"""The gateway's JSON response: Starlette's, rendered by :func:`inferq.fastjson.dumps` (orjson).

Encoding the job object was a tenth of the gateway's instructions per job; Starlette's ``JSONResponse`` also builds a
new ``JSONEncoder`` for every response. The bytes are Starlette's (compact, UTF-8), but for what
:mod:`inferq.fastjson` says: a float may be spelled shorter, and a NaN a model server sent is ``null`` where Starlette
raised (a 500).
"""

from typing import Any

from starlette.responses import JSONResponse as _StarletteJSONResponse

from inferq import fastjson

__all__ = ["JSONResponse"]


class JSONResponse(_StarletteJSONResponse):
    def render(self, content: Any) -> bytes:
        return fastjson.dumps(content, allow_nan=False)
