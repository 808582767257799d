"""The job record's fields a submit writes from its request (``enqueue.lua`` writes them as they come), and the
job's work in fair share."""

from __future__ import annotations

from typing import Any

from inferq import fastjson
from inferq.queue.fairshare import estimated_work
from inferq.queue.jobs import JobRequest, expected_tokens

MODEL_MAX = 128
"""Characters of ``body.model`` a single queue's job record keeps (its usage row names it)."""


def record_fields(request: JobRequest, count_tokens: bool = False, model: bool = False, *, work: int | None = None,
                  weight: float = 1.0) -> list[Any]:
    """The job record's fields that come from the request, as name/value pairs (enqueue.lua writes them). The body
    and metadata are stored as :func:`inferq.fastjson.dumps` writes them (what is read back is the same value; the
    request digest has its own canonical form). ``count_tokens`` (sizing by work is on,
    ``INFERQ_SCALE_TOKENS_PER_S`` > 0): the job's expected tokens too, which the queue's ``backlog_tokens`` counts;
    off, the record and the scripts do no work for a figure nobody reads. ``model`` (a single queue, no registry,
    metering on): ``body.model`` as field ``model``, the model its usage is counted under (a registry's queue is one
    model's, which the reader of usage names). ``work`` and ``weight``: the job's work and its tenant's weight in
    fair share (the weight is written only when it is not 1). Field ``hold``: the bytes of what the tenant chose that
    the record keeps after the job ends (its metadata, webhook URL, model), part of what the tenant is charged for it
    then (:mod:`inferq.queue.holds`)."""
    fields: list[Any] = []
    hold = 0
    if count_tokens:  # first: enqueue.lua adds it to the queue's backlog_tokens from that place
        fields += ["tokens", expected_tokens(request.body)]
    fields += ["url", request.url, "body", fastjson.dumps(request.body), "lane", request.priority.value,
               "work", work if work is not None else job_work(request)]
    if weight != 1:
        fields += ["weight", format(weight, ".17g")]
    named = request.body.get("model") if model else None
    if isinstance(named, str) and named:
        fields += ["model", named[:MODEL_MAX]]
        hold += len(named[:MODEL_MAX].encode())
    if request.metadata:
        metadata = fastjson.dumps(request.metadata)
        fields += ["metadata", metadata]
        hold += len(metadata)
    if request.timeout_s is not None:
        fields += ["timeout_s", request.timeout_s]
    if request.ttl_s is not None:
        fields += ["ttl_s", request.ttl_s]
    if request.webhook_url:
        fields += ["webhook_url", request.webhook_url]
        hold += len(request.webhook_url.encode())
    if not request.continuation:  # absent: the default, every attempt continues after the output kept
        fields += ["continuation", "0"]
    if request.traceparent:
        fields += ["trace", request.traceparent]
    if request.watch:
        fields += ["watch", "1"]  # its worker writes its output as it is made (inferq.queue.output)
    if hold:
        fields += ["hold", hold]
    return fields


def job_work(request: JobRequest) -> int:
    """The job's work in fair share: what the caller estimated (a claimed body's), else its body's."""
    return request.work if request.work is not None else estimated_work(request.body)
