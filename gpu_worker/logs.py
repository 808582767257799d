"""The worker's logs: Powertools Logger, JSON on stderr, with the keys every inferq process writes (``level``,
``location``, ``message``, ``timestamp``, ``service``, ``name``), plus ``worker_id`` and, inside a job's task,
``job_id`` and ``trace_id``.

Powertools works outside Lambda too; what it adds there (cold start, request id, X-Ray id) is simply absent here.
Prompts and outputs never reach a log line unless ``INFERQ_LOG_PAYLOADS`` is on: log lines name jobs, not text.
"""

from __future__ import annotations

import logging
import os
import sys

from aws_lambda_powertools import Logger

SERVICE = "inferq-worker"

logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME") or SERVICE, stream=sys.stderr)


def bind_job(job_id: str, trace_id: str | None) -> None:
    """Tag every log line of the current task with this job. Powertools keeps these keys in a context variable,
    and a task copies the context it was created in, so they never leak between jobs."""
    logger.thread_safe_append_keys(job_id=job_id, trace_id=trace_id)


def configure(level: str, worker_id: str | None = None) -> None:
    """Every logger of the process (ours log through ``logging.getLogger(__name__)``; httpx, vLLM) writes through
    Powertools' handler, on stderr (the container's log driver ships stderr to CloudWatch). The worker owns its
    process, so the handler goes on the root logger; in Lambda the runtime owns the root, and the handlers copy
    Powertools' configuration onto our packages' loggers instead (same keys)."""
    logger.setLevel(level)
    logger.append_keys(name="%(name)s", worker_id=worker_id)  # ``name`` as copy_config_to_registered_loggers adds
    root = logging.getLogger()
    root.handlers[:] = [logger.registered_handler]
    root.setLevel(level)
    logging.getLogger(logger.name).propagate = False  # its own handler has written the line already
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
