"""Logs and metrics of the gateway.

Logs: Powertools Logger, JSON. The access line of a request (``request_id``: the Lambda request id, else
``X-Request-Id``, else a fresh one; ``job_id`` when there is one) is at INFO for every refused or failed request
(status >= 400) and at DEBUG for the rest: a Powertools line costs the gateway about as much CPU as answering a
long poll, and at INFO, the default, a line per request cost S3 about 20% of its throughput and one per submit
still about 10% (``make bench ARGS="--only L"``, docs/benchmarks.md). ``INFERQ_LOG_LEVEL=DEBUG`` logs every
request. Prompts, outputs and metadata are never logged. Our packages' own loggers (``inferq.*``, ``functions.*``)
write through the same handler once :meth:`Telemetry.adopt_package_loggers` has run (the Lambda module does it at
import), so every line of the process has the keys the worker's and the scaler's lines have.

Metrics: counted in process on the hot path (a dict increment) and written as CloudWatch EMF by Powertools
only when :meth:`Telemetry.flush` runs, which the Lambda handler does once per invocation. Outside Lambda
(uvicorn in the emulator) nothing is printed: an EMF line per request would flood stdout, and the emulator
does not ship logs to CloudWatch; :attr:`Telemetry.totals` keeps the counts for tests and benchmarks.
Names: ``JobsEnqueued``, ``IdempotentReplays``, ``JobsRejected`` (dimension ``reason``: unauthorized,
too_large, invalid, idempotency_conflict, queue_full, unavailable, error), ``ScalerWakes``, ``ScalerWakeFailures``.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from typing import Any

from aws_lambda_powertools import Logger

DEFAULT_NAMESPACE = "inferq"
SERVICE = "inferq-gateway"
PACKAGES = frozenset({"inferq", "functions", "uvicorn"})
"""Loggers that write through Powertools' handler: ours, and uvicorn's own (startup, server errors) where the
emulator or the bench serves the app with it."""


class Telemetry:
    def __init__(self, *, level: str = "INFO", namespace: str | None = None, service: str | None = None) -> None:
        self.service = service or os.environ.get("POWERTOOLS_SERVICE_NAME") or SERVICE
        self.namespace = namespace or os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or DEFAULT_NAMESPACE
        self.logger = Logger(service=self.service, level=level)
        self.logger.append_keys(name="%(name)s")  # the logger's name, as on the lines of our packages' loggers
        self.totals: Counter[str] = Counter()
        self._pending: Counter[tuple[str, str]] = Counter()

    def adopt_package_loggers(self) -> None:
        """Powertools' handler, level and keys for the loggers of our packages (they log through
        ``logging.getLogger(__name__)``), instead of the Lambda runtime's plain-text root handler."""
        from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

        for name in PACKAGES:
            logging.getLogger(name)  # registered, so that Powertools finds it; later modules propagate up to it
        copy_config_to_registered_loggers(source_logger=self.logger, include=set(PACKAGES))

    @property
    def logs_successes(self) -> bool:
        """Whether an answer below 400 gets an access line (at DEBUG)."""
        return self.logger.log_level <= logging.DEBUG

    def access(self, status: int, fields: dict[str, Any]) -> None:
        """The access line of one request: INFO for an answer >= 400, DEBUG otherwise (the level is checked before
        the record is built: a line not logged costs a comparison)."""
        if status >= 400:
            self.logger.info("request", extra=fields, stacklevel=3)  # stacklevel: the caller's location
        elif self.logger.log_level <= logging.DEBUG:
            self.logger.debug("request", extra=fields, stacklevel=3)

    def count(self, metric: str, reason: str = "") -> None:
        key = f"{metric}.{reason}" if reason else metric
        self.totals[key] += 1
        self._pending[(metric, reason)] += 1

    def flush(self) -> int:
        """Print the counts since the last flush as EMF (one line per dimension set); returns lines printed.
        Never raises: it runs after the response is built, and metrics must not cost an answer."""
        if not self._pending:
            return 0
        pending, self._pending = self._pending, Counter()
        try:
            return self._emit(pending)
        except Exception:
            self.logger.exception("metrics flush failed")
            return 0

    def _emit(self, pending: Counter[tuple[str, str]]) -> int:
        """The plain counts on one EMF line; each count by reason on its own (``single_metric``: one metric, its
        own dimension set)."""
        from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit, single_metric  # Lambda path only

        plain = {name: n for (name, reason), n in pending.items() if not reason}
        lines = 0
        if plain:
            metrics = EphemeralMetrics(namespace=self.namespace, service=self.service)
            for name, n in plain.items():
                metrics.add_metric(name=name, unit=MetricUnit.Count, value=n)
            metrics.flush_metrics()
            lines += 1
        for (name, reason), n in pending.items():
            if reason:
                with single_metric(name=name, unit=MetricUnit.Count, value=n, namespace=self.namespace,
                                   default_dimensions={"service": self.service}) as metric:
                    metric.add_dimension(name="reason", value=reason)
                lines += 1
        return lines
