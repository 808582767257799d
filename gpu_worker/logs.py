"""JSON logs, one object per line, carrying the worker id and, inside a job's task, its job id and trace id.

Prompts and outputs never reach a log line unless ``INFERQ_LOG_PAYLOADS`` is on: log lines name jobs, not text.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar

# set inside each job's task (a task copies the context it was created in, so values never leak between jobs)
_job_id: ContextVar[str | None] = ContextVar("inferq_job_id", default=None)
_trace_id: ContextVar[str | None] = ContextVar("inferq_trace_id", default=None)

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def bind_job(job_id: str, trace_id: str | None) -> None:
    """Tag every log line of the current task with this job."""
    _job_id.set(job_id)
    _trace_id.set(trace_id)


class JsonFormatter(logging.Formatter):
    def __init__(self, worker_id: str | None = None) -> None:
        super().__init__()
        self.worker_id = worker_id

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.worker_id:
            line["worker_id"] = self.worker_id
        job_id, trace = _job_id.get(), _trace_id.get()
        if job_id:
            line["job_id"] = job_id
        if trace:
            line["trace_id"] = trace
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def configure(level: str, worker_id: str | None = None) -> None:
    """Route every logger to stderr as JSON (the container's log driver ships stderr to CloudWatch)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(worker_id))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
