"""The response shapes of HTTP API v1, for the OpenAPI document only: the job object, the error envelope, the DLQ
list, the scale view and health. They document what ``inferq.queue.jobs.Job.to_api`` and the route handlers return;
handlers build plain dicts, so no response is validated twice. Imported when the document is first built
(:func:`.openapi.install`), never by a request.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .request_schemas import JOB_QUEUED_EXAMPLE, JOB_SUCCEEDED_EXAMPLE


class DocModel(BaseModel):
    """A response shape for the OpenAPI document only: compiled when the document is built, not at import."""

    model_config = ConfigDict(defer_build=True)


class ErrorDetail(DocModel):
    type: str = Field(description="snake_case error type", examples=["invalid_request"])
    message: str = Field(description="Human-readable text", examples=["body.timeout_s: must be <= 3600"])


class ErrorEnvelope(DocModel):
    """Every error answer."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"error": {"type": "not_found", "message": "no such job"}}]}
    )

    error: ErrorDetail


class JobResult(DocModel):
    """Inline (`body`), or for a large result kept in S3 too large for one response, by URL (`body_url`,
    `body_bytes`): see "Large payloads" in the API docs."""

    status_code: int = Field(description="The model server's HTTP status")
    body: Any = Field(None, description="The model server's response (absent when given by `body_url`)")
    body_url: str | None = Field(None, description="A presigned GET of the response body, valid 15 minutes "
                                                   "(1 hour in a webhook); no API key with it")
    body_bytes: int | None = Field(None, description="With `body_url`: the body's size in bytes")


class JobObject(DocModel):
    """The job object of HTTP API v1."""

    model_config = ConfigDict(json_schema_extra={"examples": [JOB_QUEUED_EXAMPLE, JOB_SUCCEEDED_EXAMPLE]})

    id: str = Field(examples=["job_6f2bq3n7a4xk5zrc2m5d7e2yva"])
    object: Literal["job"]
    status: Literal["queued", "running", "succeeded", "failed", "cancelled", "expired"]
    url: str
    attempts: int
    created_at: float = Field(description="Unix seconds")
    started_at: float | None
    finished_at: float | None
    result: JobResult | None = Field(description="On `succeeded`")
    error: ErrorDetail | None = Field(description="On `failed`, `expired`, `cancelled`")
    dead_lettered: bool
    metadata: dict[str, str]
    priority: Literal["high", "normal", "low"] = Field(description="The job's lane within its queue")


class JobConflict(ErrorEnvelope):
    """409 of cancel: the job is already terminal; its current state comes with the error."""

    job: JobObject | None = None


class JobList(DocModel):
    object: Literal["list"]
    data: list[JobObject]


class ScaleDecision(DocModel):
    reason: str | None = Field(description="Why the scaler chose `desired`", examples=["backlog"])
    at: float | None = Field(description="Unix seconds of the decision")


class ScaleView(DocModel):
    """The scaler's view of the queue."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"lag": 3, "pending": 8, "unfinished": 11, "dlq": 0, "workers": 1, "desired": 2,
                 "decision": {"reason": "scale_up", "at": 1764400000.5}}
            ]
        }
    )

    lag: int = Field(description="Entries never delivered to a worker")
    pending: int = Field(description="Entries delivered and not yet acknowledged")
    unfinished: int = Field(description="Jobs accepted and not yet terminal")
    dlq: int = Field(description="Entries in the dead-letter stream")
    workers: int = Field(description="Workers with a recent heartbeat")
    desired: int | None = Field(description="The scaler's last desired count (null before its first decision)")
    decision: ScaleDecision
    waiting: dict[str, dict[str, int]] | None = Field(default=None, description=(
        "With `?by_tenant=true` only: fair share (G10), each tenant's jobs waiting for their turn in each lane "
        "(`high`, `normal`, `low`; among the next 10,000 of the lane), counted in `lag` too"),
        examples=[{"team-a": {"normal": 2}}])


class Health(DocModel):
    status: str = Field(examples=["ok"])
