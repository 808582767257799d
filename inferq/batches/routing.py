"""Which queue each line of a batch goes to (docs/models.md, "Batches"): under a model registry a line runs on the
fleet of the model its ``body.model`` names (a name or an alias; none: the registry's default), like a job
submitted on its own; without a registry every line goes to the one queue, whatever it names.

A line whose model no queue serves becomes no job: the driver records :data:`UNROUTED` for it in the batch's
lines, counts it failed, and writes :func:`unrouted_line` for it into the error file. The batch records stay in
the primary queue; a line's job is found in its own queue through its id (a registry's ids carry their queue).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from inferq.config.registry import Registry, queue_of_job
from inferq.queue.jobs import RECORD_FIELDS_BUT_BODY, record_of
from inferq.queue.protocol import Queue

NO_JOB = "!"
"""What the batch-lines value of a line that became no job starts with (no job id does), followed by the error
code its error file line carries (:data:`inferq.batches.records.NOT_RUN`)."""
UNROUTED = NO_JOB + "model_not_found"
"""The batch-lines value of a line whose model no queue serves."""


def is_job(value: str | None) -> bool:
    """Whether a batch-lines value names a job (not a line that became none, nor a line not reached)."""
    return bool(value) and not str(value).startswith(NO_JOB)
MODEL_NOT_FOUND = "model_not_found"
"""OpenAI's error code for a request naming an unknown model; the same type the gateway answers a job with."""


class LineRouter:
    """The queues of a batch's lines: the primary queue's client, one :class:`Queue` per model of the registry."""

    def __init__(self, primary: Queue, registry: Registry | None) -> None:
        self.primary = primary
        self.registry = registry
        self._queues: dict[str, Queue] = {primary.settings.queue: primary}
        if registry is not None:
            for model in registry.models:
                if model.queue not in self._queues:
                    self._queues[model.queue] = Queue(primary.redis, model.settings)

    def queues(self) -> list[Queue]:
        """Every queue a line may go to, the primary first."""
        return list(self._queues.values())

    def multimodal(self, model: Any) -> bool:
        """Whether the model a line's ``body.model`` names takes images (without a registry: none does)."""
        return self.registry is not None and self.registry.multimodal(model)

    def queue_for(self, body: dict[str, Any]) -> Queue | None:
        """The queue of the model ``body.model`` names; None when no queue serves it."""
        if self.registry is None:
            return self.primary
        requested = body.get("model")
        if requested is not None and not isinstance(requested, str):
            return None
        model = self.registry.resolve(requested)
        return self._queues[model.queue] if model is not None else None

    def queue_of(self, job_id: str) -> Queue:
        """The queue that holds a line's job (the primary one for an id without a queue, or a queue since removed
        from the registry: its record is then simply not found there)."""
        name = queue_of_job(job_id)
        return self._queues.get(name or "", self.primary)

    async def job_fields(self, ids: list[str | None], name: str | None) -> list[Any]:
        """Per line: its job's field ``name`` (None: the whole record but its request body, which no output line
        needs), each read in the job's own queue, in one round trip; None for a line without a job."""
        found: list[Any] = [None] * len(ids)
        asked = [(i, job_id) for i, job_id in enumerate(ids) if job_id is not None and is_job(job_id)]
        if not asked:
            return found
        pipe = self.primary.redis.pipeline(transaction=False)
        for _, job_id in asked:
            key = self.queue_of(job_id).keys.job(job_id)
            if name:
                pipe.hget(key, name)
            else:
                pipe.hmget(key, RECORD_FIELDS_BUT_BODY)
        for (i, _), value in zip(asked, await pipe.execute(), strict=True):
            found[i] = value if name else record_of(RECORD_FIELDS_BUT_BODY, value)
        return found


def unrouted_line(custom_id: str | None, raw: bytes | None) -> dict[str, Any]:
    """The error-file line of a request whose model no queue serves (OpenAI's per-line error shape)."""
    try:
        requested = json.loads(raw or b"").get("body", {}).get("model")
    except (ValueError, AttributeError, RecursionError):
        requested = None
    if requested is None:
        message = "body.model is required: this deployment serves several models and has no default"
    else:
        message = f"the model {str(requested)[:128]!r} does not exist; GET /v1/models lists them"
    return {"id": "batch_req_" + secrets.token_hex(12), "custom_id": custom_id, "response": None,
            "error": {"code": MODEL_NOT_FOUND, "message": message}, "job_id": None}
