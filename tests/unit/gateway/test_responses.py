"""The gateway's JSON response renders the bytes Starlette's does (inferq.fastjson's two exceptions aside)."""

from __future__ import annotations

import json
import math

import pytest
from starlette.responses import JSONResponse as StarletteJSONResponse

from functions.gateway.responses import JSONResponse


def test_the_bytes_are_starlettes() -> None:
    job = {"id": "job_x", "object": "job", "status": "succeeded", "created_at": 1764400000.123, "started_at": None,
           "result": {"status_code": 200, "body": {"text": "é ☃ \u2028 \U0001f600", "n": [1, -2.5, True, None, 0.1]}},
           "metadata": {}, "big": 2**70}
    for content in (job, [], "s", None, 3, {"k": {1: "an int key"}}):
        ours, theirs = JSONResponse(content, 202, headers={"Location": "/x"}), StarletteJSONResponse(
            content, 202, headers={"Location": "/x"})
        assert ours.body == theirs.body
        assert ours.raw_headers == theirs.raw_headers and ours.status_code == 202


def test_a_nan_is_null_where_starlette_refused_it_and_the_unencodable_is_refused_alike() -> None:
    """A model server's NaN (Python's json reads it) made Starlette's response raise: a 500 for a GET."""
    assert json.loads(JSONResponse({"x": math.nan, "y": [math.inf]}).body) == {"x": None, "y": [None]}
    with pytest.raises(TypeError):
        StarletteJSONResponse({"x": object()})
    with pytest.raises(TypeError):
        JSONResponse({"x": object()})
