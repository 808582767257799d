"""The client's promise: one exception class per error ``type`` of the envelope. The types are read from the table in
docs/api.md, so a type added there without its class (or a class shared by two types) fails here, and each is
raised by both the blocking and the asyncio client from a real HTTP answer."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from inferq.client import (
    ERRORS,
    AsyncClient,
    Client,
    Conflict,
    Forbidden,
    InferqError,
    InternalError,
    InvalidRequest,
    NotFound,
    RateLimited,
    ServerError,
    TooManyRequests,
)
from inferq.client.answers import BY_STATUS

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"
JOB_ID = "job_" + "a" * 26


def documented() -> dict[str, int]:
    """``type`` -> HTTP status, from the rows of the error table in docs/api.md (``| 429 | `rate_limited` | ...``)."""
    text = API_MD.read_text()
    table = text[text.index("| status | `type` | when |"):]
    table = table[: table.index("\n\n")]
    rows = re.findall(r"^\| (\d{3}) \| `([a-z_]+)` \|", table, re.MULTILINE)
    assert len(rows) >= 20, f"docs/api.md's error table not found or reshaped ({len(rows)} rows read)"
    return {type_: int(status) for status, type_ in rows}


DOCUMENTED = documented()


def test_every_documented_type_has_a_class_of_its_own_and_every_class_is_documented() -> None:
    missing = sorted(set(DOCUMENTED) - set(ERRORS))
    assert not missing, f"error types of docs/api.md without a class in inferq.client.ERRORS: {missing}"
    undocumented = sorted(set(ERRORS) - set(DOCUMENTED))
    assert not undocumented, f"inferq.client.ERRORS has types docs/api.md's table lacks: {undocumented}"
    shared = {cls.__name__: [t for t, c in ERRORS.items() if c is cls] for cls in ERRORS.values()}
    assert all(len(types) == 1 for types in shared.values()), {n: t for n, t in shared.items() if len(t) > 1}


@pytest.mark.parametrize("type_", sorted(DOCUMENTED))
def test_each_class_sits_under_the_class_of_its_status(type_: str) -> None:
    cls, status = ERRORS[type_], DOCUMENTED[type_]
    assert status in BY_STATUS, f"no class for {status}: set status_default on one"
    assert issubclass(cls, BY_STATUS[status]), f"{cls.__name__} ({type_}, {status}) is not a {BY_STATUS[status]}"


def answering(status: int, type_: str) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": {"type": type_, "message": f"a {type_}"}},
                              headers={"Retry-After": "7"})

    return httpx.MockTransport(handler)


@pytest.mark.parametrize("type_", sorted(DOCUMENTED))
def test_the_blocking_client_raises_the_class_of_each_type(type_: str) -> None:
    status = DOCUMENTED[type_]
    with Client("http://gateway", "k", transport=answering(status, type_)) as client, \
            pytest.raises(InferqError) as raised:
        client.get(JOB_ID)
    assert type(raised.value) is ERRORS[type_]
    assert (raised.value.status, raised.value.type, raised.value.message) == (status, type_, f"a {type_}")
    assert raised.value.retry_after_s == 7


@pytest.mark.parametrize("type_", sorted(DOCUMENTED))
async def test_the_async_client_raises_the_class_of_each_type(type_: str) -> None:
    status = DOCUMENTED[type_]
    async with AsyncClient("http://gateway", "k", transport=answering(status, type_)) as client:
        with pytest.raises(InferqError) as raised:
            await client.get(JOB_ID)
    assert type(raised.value) is ERRORS[type_]
    assert (raised.value.status, raised.value.type) == (status, type_)


@pytest.mark.parametrize(("status", "cls"), [(403, Forbidden), (404, NotFound), (409, Conflict), (422, InvalidRequest),
                                             (429, TooManyRequests), (500, InternalError), (502, ServerError)])
def test_a_type_this_client_does_not_know_yet_gets_the_class_of_its_status(status: int, cls: type) -> None:
    with Client("http://gateway", "k", transport=answering(status, "added_later")) as client, \
            pytest.raises(InferqError) as raised:
        client.get(JOB_ID)
    assert type(raised.value) is cls and raised.value.type == "added_later"


def test_a_rate_limit_is_not_a_full_queue_but_both_are_too_many_requests() -> None:
    from inferq.client import QueueFull

    assert issubclass(RateLimited, TooManyRequests) and issubclass(QueueFull, TooManyRequests)
    assert not issubclass(RateLimited, QueueFull)
