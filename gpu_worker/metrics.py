"""Prometheus metrics of one worker, served on ``INFERQ_METRICS_PORT`` (0 = off).

Each :class:`WorkerMetrics` has its own registry, so several workers can live in one process (tests)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .backends.base import EngineLoad

_IDLE = EngineLoad(waiting=0.0, running=0.0)
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class WorkerMetrics:
    def __init__(self, queue: str, window: int) -> None:
        self.registry = CollectorRegistry()
        labels = {"queue": queue}
        r = self.registry
        self.in_flight = Gauge("inferq_worker_in_flight", "Jobs this worker holds now", ["queue"], registry=r).labels(
            **labels
        )
        # with INFERQ_WINDOW=auto the worker sets it again at each change (gpu_worker/window.py)
        self.window = Gauge("inferq_worker_window", "Most jobs this worker runs at the model server at once (it "
                            "holds up to twice that while outcomes are written)", ["queue"],
                            registry=r).labels(**labels)
        self.window.set(window)
        # with INFERQ_WINDOW=auto, what its law last read of the model server (read at each scrape: watch_engine)
        self.engine_waiting = Gauge(
            "inferq_worker_engine_waiting", "Requests waiting inside the model server, mean between the window's "
            "last two reads (INFERQ_WINDOW=auto)", ["queue"], registry=r).labels(**labels)
        self.engine_running = Gauge(
            "inferq_worker_engine_running", "Requests the model server runs, mean between the window's last two "
            "reads (INFERQ_WINDOW=auto)", ["queue"], registry=r).labels(**labels)
        self.engine_path = Gauge(
            "inferq_worker_engine_path", "This worker's requests on their way between it and the model server's "
            "engine, sent but not yet stamped by the server or answered but not yet back (INFERQ_WINDOW=auto, "
            "openai backend)", ["queue"], registry=r).labels(**labels)
        self._outcomes = Counter(
            "inferq_worker_jobs", "Attempts this worker ended, by outcome", ["queue", "outcome"], registry=r
        )
        self.queue_wait = Histogram(
            "inferq_worker_queue_wait_seconds", "From enqueue to the start of an attempt", ["queue"],
            buckets=_SECONDS, registry=r,
        ).labels(**labels)
        self.run_time = Histogram(
            "inferq_worker_run_seconds", "Backend time of one attempt", ["queue"], buckets=_SECONDS, registry=r
        ).labels(**labels)
        self.output_tokens = Counter(
            "inferq_worker_output_tokens", "Tokens the model server produced for this worker's jobs (the answers' "
            "usage.completion_tokens): with the run time, the fleet's throughput the scaler sizes by", ["queue"],
            registry=r,
        ).labels(**labels)
        self.reclaimed = Counter(
            "inferq_worker_reclaimed", "Entries taken over from a worker that stopped renewing", ["queue"], registry=r
        ).labels(**labels)
        self.duplicates = Counter(
            "inferq_worker_duplicate_results", "Results discarded because the job was already terminal", ["queue"],
            registry=r,
        ).labels(**labels)
        self._backend_errors = Counter(
            "inferq_worker_backend_errors", "Failed backend calls, by kind", ["queue", "kind"], registry=r
        )
        self._skipped = Counter(
            "inferq_worker_skipped", "Entries settled without calling the model, by reason", ["queue", "reason"],
            registry=r,
        )
        self.redis_errors = Counter(
            "inferq_worker_redis_errors", "Redis calls that failed (retried with backoff)", ["queue"], registry=r
        ).labels(**labels)
        self._webhooks = Counter(
            "inferq_worker_webhooks", "Webhook delivery attempts, by outcome", ["queue", "outcome"], registry=r
        )
        self._queue = queue
        self._outcome_children: dict[str, Counter] = {}

    def watch_engine(self, last_load: Callable[[], EngineLoad | None]) -> None:
        """Read the engine gauges from ``last_load`` at each scrape (the adaptive window's last reading; 0 before
        its first)."""
        def reader(field: str) -> Callable[[], float]:
            return lambda: float(getattr(last_load() or _IDLE, field))

        for gauge, field in ((self.engine_waiting, "waiting"), (self.engine_running, "running"),
                             (self.engine_path, "path")):
            gauge.set_function(reader(field))

    def outcome(self, name: str) -> None:
        child = self._outcome_children.get(name)
        if child is None:
            child = self._outcome_children[name] = self._outcomes.labels(queue=self._queue, outcome=name)
        child.inc()

    def answered(self, body: object) -> None:
        """Count the output tokens of a model server's answer (``usage.completion_tokens``; nothing without)."""
        usage = body.get("usage") if isinstance(body, dict) else None
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
            self.output_tokens.inc(tokens)

    def backend_error(self, kind: str) -> None:
        self._backend_errors.labels(queue=self._queue, kind=kind).inc()

    def skipped(self, reason: str) -> None:
        self._skipped.labels(queue=self._queue, reason=reason).inc()

    def webhook(self, outcome: str, count: int = 1) -> None:
        if count:
            self._webhooks.labels(queue=self._queue, outcome=outcome).inc(count)

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)
