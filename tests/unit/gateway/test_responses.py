"""The gateway's JSON response renders the bytes Starlette's does, with one encoder made once."""

from __future__ import annotations

import math

import pytest
from starlette.responses import JSONResponse as StarletteJSONResponse

from functions.gateway.responses import JSONResponse


def test_the_bytes_are_starlettes() -> None:
    job = {"id": "job_x", "object": "job", "status": "succeeded", "created_at": 1764400000.123, "started_at": None,
           "result": {"status_code": 200, "body": {"text": "é ☃ \u2028", "n": [1, 2.5, True, None]}}, "metadata": {}}
    for content in (job, [], "s", None, 3):
        ours, theirs = JSONResponse(content, 202, headers={"Location": "/x"}), StarletteJSONResponse(
            content, 202, headers={"Location": "/x"})
        assert ours.body == theirs.body
        assert ours.raw_headers == theirs.raw_headers and ours.status_code == 202


def test_what_starlette_refuses_is_refused() -> None:
    for content in ({"x": math.nan}, {"x": object()}):
        with pytest.raises((ValueError, TypeError)) as theirs:
            StarletteJSONResponse(content)
        with pytest.raises(theirs.type):
            JSONResponse(content)
