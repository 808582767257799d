"""What clients send to HTTP API v1: the submit request (:class:`JobCreate`, the one model that validates traffic),
the metadata every object may carry, and the bounds the routes share. The response shapes, which only the OpenAPI
document uses, are in :mod:`.response_schemas`, imported when the document is first built: a new Lambda sandbox
whose first request is a submit never builds them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from inferq.queue.jobs import ENDPOINTS
from inferq.webhooks.netguard import check_webhook_host, host_refusal, port_refusal

IDEMPOTENCY_KEY_MAX = 255
MAX_WAIT_S = 20.0
"""The longest ``wait`` of a long poll (``GET /v1/jobs/{id}``, ``GET /v1/events``)."""
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
"""``metadata`` as OpenAI bounds it (at most 16 pairs, keys up to 64 characters, values up to 512): what a job
record keeps for a day after its job ends, so what one tenant can leave behind stays bounded (G11)."""
MAX_TTL_S = 366 * 86400
"""The contract only says ``ttl_s >= 1``; a year keeps ``now + ttl`` far from float precision in Lua."""

WEBHOOK_PATTERN = r"^https://[^\s/?#@]+(?:[/?#][^\s]*)?$"
"""https, a host (no userinfo: credentials do not belong in a webhook address), then any path."""

ALLOW_PRIVATE = "webhook_allow_private"
"""The validation context key (``INFERQ_WEBHOOK_ALLOW_PRIVATE``): when true, internal webhook hosts are accepted."""
WEBHOOK_PORTS = "webhook_ports"
"""The validation context key (``INFERQ_WEBHOOK_PORTS``): the ports a webhook URL may name (absent: 443)."""
WEBHOOK_HOSTS = "webhook_hosts"
"""The validation context key (``INFERQ_WEBHOOK_HOSTS``): the hosts a webhook URL may name (absent or empty: any)."""
WEBHOOK_BLOCKED = "webhook_blocked_networks"
"""The validation context key (``INFERQ_WEBHOOK_BLOCKED_NETWORKS``, parsed): the deployment's own networks."""
NO_SURROGATES = "no_surrogates"
"""The validation context key that says the JSON text holds no escape a lone surrogate could come from
(:func:`surrogate_free`): its strings need no walk to be checked."""

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def surrogate_free(raw: bytes) -> bool:
    """Whether JSON text can hold no lone surrogate: one can only be spelled as a ``\\uD800``-``\\uDFFF`` escape
    (the bytes of one are not UTF-8, which the parser refuses). An escaped backslash before ``uD8..`` reads as one
    too: then the strings are walked, as without this."""
    return _SURROGATE_ESCAPE.search(raw) is None

Endpoint = Literal["/v1/chat/completions", "/v1/completions"]
assert set(Endpoint.__args__) == set(ENDPOINTS)  # type: ignore[attr-defined]



def _bounded_metadata(value: dict[str, str]) -> dict[str, str]:
    # one message per bound, naming it and never the offending text (a key may be long; a value may be anything)
    if len(value) > MAX_METADATA_PAIRS:
        raise PydanticCustomError("metadata_pairs", "at most {limit} pairs (OpenAI's limit); this has {count}",
                                  {"limit": MAX_METADATA_PAIRS, "count": len(value)})
    for key, item in value.items():
        if not 1 <= len(key) <= MAX_METADATA_KEY:
            raise PydanticCustomError("metadata_key", "keys are 1-{limit} characters (OpenAI's limit); one has "
                                      "{length}", {"limit": MAX_METADATA_KEY, "length": len(key)})
        if len(item) > MAX_METADATA_VALUE:
            raise PydanticCustomError("metadata_value", "values are at most {limit} characters (OpenAI's limit); "
                                      "the value of key {key} has {length}",
                                      {"limit": MAX_METADATA_VALUE, "key": repr(key), "length": len(item)})
    return value


Metadata = Annotated[
    dict[str, str],
    AfterValidator(_bounded_metadata),
    WithJsonSchema({
        "type": "object",
        "maxProperties": MAX_METADATA_PAIRS,
        "propertyNames": {"minLength": 1, "maxLength": MAX_METADATA_KEY},
        "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE},
    }),
]
"""A ``metadata`` object (a job's, a batch's): string keys and values within OpenAI's bounds, 422 beyond with a
message naming the bound."""

CHAT_BODY_EXAMPLE: dict[str, Any] = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "messages": [{"role": "user", "content": "Write a haiku about queues."}],
    "max_tokens": 64,
}

JOB_CREATE_EXAMPLE: dict[str, Any] = {
    "body": CHAT_BODY_EXAMPLE,
    "url": "/v1/chat/completions",
    "idempotency_key": "order-1234",
    "metadata": {"customer": "acme"},
    "timeout_s": 120,
    "ttl_s": 3600,
}

JOB_QUEUED_EXAMPLE: dict[str, Any] = {
    "id": "job_6f2bq3n7a4xk5zrc2m5d7e2yva",
    "object": "job",
    "status": "queued",
    "url": "/v1/chat/completions",
    "attempts": 1,
    "created_at": 1764400000.123,
    "started_at": None,
    "finished_at": None,
    "result": None,
    "error": None,
    "dead_lettered": False,
    "metadata": {"customer": "acme"},
    "priority": "normal",
}

JOB_SUCCEEDED_EXAMPLE: dict[str, Any] = {
    **JOB_QUEUED_EXAMPLE,
    "status": "succeeded",
    "started_at": 1764400001.5,
    "finished_at": 1764400003.25,
    "result": {
        "status_code": 200,
        "body": {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "..."}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 14, "completion_tokens": 17, "total_tokens": 31},
        },
    },
}


class JobCreate(BaseModel):
    """POST /v1/jobs: one line of the OpenAI Batch API, plus what the queue needs."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [JOB_CREATE_EXAMPLE]}
    )

    body: dict[str, Any] = Field(
        description="The OpenAI-compatible request the model server receives (model, messages or prompt, ...).",
        examples=[CHAT_BODY_EXAMPLE],
    )
    url: Endpoint = Field(default="/v1/chat/completions", description="The model server endpoint.")
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=IDEMPOTENCY_KEY_MAX)] | None = Field(
        default=None,
        description="Same tenant and key return the same job (header `Idempotency-Key` does the same).",
    )
    metadata: Metadata = Field(
        default_factory=dict,
        description=f"Echoed back: at most {MAX_METADATA_PAIRS} pairs, keys 1-{MAX_METADATA_KEY} characters, "
        f"values at most {MAX_METADATA_VALUE}.",
    )
    timeout_s: Annotated[int, Field(ge=1, le=3600)] | None = Field(
        default=None, description="Max processing time of one attempt (default `INFERQ_JOB_TIMEOUT_S`)."
    )
    ttl_s: Annotated[int, Field(ge=1, le=MAX_TTL_S)] | None = Field(
        default=None, description="The job expires if no attempt has started within this many seconds."
    )
    webhook_url: Annotated[str, StringConstraints(max_length=2048, pattern=WEBHOOK_PATTERN)] | None = Field(
        default=None, description="An https URL POSTed the final job object once, on the terminal state."
    )
    priority: Literal["high", "normal", "low"] | None = Field(
        default=None,
        description="The job's lane within its queue: higher lanes are taken first, with a starvation bound (a "
        "waiting lower lane still gets at least one take in ten). Default: the tenant's "
        "(`INFERQ_TENANT_PRIORITIES`), else `normal`.",
    )
    continuation: bool = Field(
        default=True,
        description="When an attempt is handed back (a worker stopped or interrupted) or retried after it had made "
        "output, the next attempt continues after that output (default), or, `false`, starts over from the first "
        "token, as an uninterrupted run with the same `seed` would; its stream then gets the text when the job ends.",
    )
    custom_id: Annotated[str, StringConstraints(max_length=512)] | None = Field(
        default=None, description="Accepted so a line of an OpenAI Batch input file can be sent as it is; not stored "
        "(use `metadata` for what should come back).",
    )
    method: Literal["POST"] | None = Field(default=None, description="Batch API compatibility: only `POST`.")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        # {"url": null} or {"metadata": null} asks for the default, as leaving the field out does
        if isinstance(data, dict) and any(data.get(name, 0) is None for name in ("url", "metadata")):
            return {k: v for k, v in data.items() if not (k in ("url", "metadata") and v is None)}
        return data

    @field_validator("body", "metadata")
    @classmethod
    def _encodable(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # JSON may carry lone surrogates ("\ud800"); they cannot be stored as UTF-8, so refuse them here
        # instead of failing (500) when the request is hashed and written.
        if not (info.context or {}).get(NO_SURROGATES):
            _check_utf8(value)
        return value

    @field_validator("idempotency_key", "webhook_url")
    @classmethod
    def _encodable_str(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not (info.context or {}).get(NO_SURROGATES):
            _check_utf8(value)
        return value

    @field_validator("webhook_url")
    @classmethod
    def _public_webhook_host(cls, value: str | None, info: ValidationInfo) -> str | None:
        # the address guard's literal half (inferq.webhooks.netguard): the sender checks again, after resolving the name
        if value is None:
            return value
        try:
            host = urlsplit(value).hostname
        except ValueError:  # e.g. an unclosed "[" around an IPv6 host
            raise PydanticCustomError("webhook_host", "the host is not a valid address") from None
        context = info.context or {}
        listed = host_refusal(host or "", context.get(WEBHOOK_HOSTS, ()))
        if listed:
            raise PydanticCustomError("webhook_host", "webhooks go to the allowed hosts only: {problem}",
                                      {"problem": listed})
        if context.get(ALLOW_PRIVATE):
            return value
        problem = check_webhook_host(host, context.get(WEBHOOK_BLOCKED, ())) if host else "the URL has no host"
        if problem:
            # a custom error: its message reaches the client as it is, without pydantic's "Value error, "
            raise PydanticCustomError("webhook_host", "webhooks go to public addresses only: {problem}",
                                      {"problem": problem})
        try:
            port = urlsplit(value).port
            port = 443 if port is None else port
        except ValueError:
            raise PydanticCustomError("webhook_port", "the port is not a number 1-65535") from None
        refusal = port_refusal(port, context.get(WEBHOOK_PORTS, (443,)))
        if refusal:
            raise PydanticCustomError("webhook_port", "webhooks go to the allowed ports only: {problem}",
                                      {"problem": refusal})
        return value


def _check_utf8(value: Any) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("strings must be valid Unicode (no lone surrogates)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_utf8(key)
            _check_utf8(item)
    elif isinstance(value, list):
        for item in value:
            _check_utf8(item)
