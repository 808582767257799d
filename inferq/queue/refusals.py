"""What the queue refuses, as exceptions: each names a refusal the scripts answer with a code (or the producer
decides), and the gateway maps each to its HTTP answer (functions/gateway/errors.py). A subclass of
:class:`QueueFull` is a refusal to take more now: the batch driver backs off on any of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inferq.queue.jobs import Job


class QueueError(Exception):
    """A request the queue refused; the gateway maps each subclass to its HTTP answer."""


class JobNotFound(QueueError):
    pass


class IdempotencyConflict(QueueError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"idempotency key already used with a different request (job {job_id})")
        self.job_id = job_id


class QueueFull(QueueError):
    def __init__(self, unfinished: int) -> None:
        super().__init__(f"{unfinished} unfinished jobs: the queue is full")
        self.unfinished = unfinished


class TenantQuotaFull(QueueFull):
    """The tenant has ``INFERQ_TENANT_MAX_DEPTH`` unfinished jobs: one tenant cannot fill the queue for all."""

    def __init__(self, unfinished: int) -> None:
        QueueError.__init__(self, f"{unfinished} unfinished jobs of this tenant: its quota is full")
        self.unfinished = unfinished


class RetainedQuotaFull(QueueFull):
    """The records the tenant's ended jobs left behind hold ``INFERQ_TENANT_MAX_RETAINED_BYTES``
    (:mod:`inferq.queue.holds`); some of them expire within ``retry_after_s``."""

    def __init__(self, retry_after_s: float) -> None:
        QueueError.__init__(self, "the records of this tenant's ended jobs hold its quota")
        self.unfinished = 0
        self.retry_after_s = retry_after_s


class EngineCoolOff(QueueFull):
    """The tenant's jobs killed the model server ``INFERQ_ENGINE_STRIKES`` times within the window: its submits to
    this queue are refused for ``retry_after_s`` more (:mod:`inferq.queue.holds`)."""

    def __init__(self, retry_after_s: float) -> None:
        QueueError.__init__(self, "this tenant's jobs killed the model server too often: cooling off")
        self.unfinished = 0
        self.retry_after_s = retry_after_s


class JobTerminal(QueueError):
    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.id} is already {job.status.value}")
        self.job = job


class NotDeadLettered(QueueError):
    pass


class OperatorOnly(QueueError):
    """A redrive of a job the model server died running (``engine_died``) by a tenant that is not an operator."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} killed the model server: only an operator may redrive it")
