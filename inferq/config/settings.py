"""Settings: every ``INFERQ_*`` variable of docs/configuration.md, read once and validated.

A bad value raises :class:`SettingsError` naming the variable; entry points turn it into a one-line message and
exit status 2, so a misconfigured process stops at start instead of misbehaving later.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from inferq.config.parsers import (
    AUTO,
    Budget,
    SettingsError,
    _api_keys,
    _backend,
    _bool,
    _float,
    _hosts,
    _http_url,
    _int,
    _log_level,
    _networks,
    _optional_str,
    _ports,
    _priority,
    _queue,
    _redis_url,
    _secrets_key,
    _tenant_budgets,
    _tenant_priorities,
    _tenant_weights,
    _tenants,
    _window,
    _windows,
    window_seconds,
)
from inferq.queue.jobs import LANES, Priority

PREFIX = "INFERQ_"

__all__ = ["PREFIX", "Settings", "SettingsError", "load_or_exit", "window_seconds"]


def _setting(default: Any, parse: Callable[[str, str], Any], *, secret: bool = False) -> Any:
    """A field read from its variable by ``parse``; ``secret``: never in the settings' repr (logs, tracebacks)."""
    return field(default=default, repr=not secret, metadata={"parse": parse})


@dataclass(frozen=True)
class Settings:
    """All of inferq's configuration. Field ``x`` is read from ``INFERQ_X``."""

    redis_url: str = _setting("redis://127.0.0.1:6379/0", _redis_url)
    redis_timeout_s: float = _setting(2.0, _float(0.05))
    redis_auth_secret: str | None = _setting(None, _optional_str)
    # the credentials themselves (ECS injects them into the worker container alone): never in a repr or a log
    redis_auth: str | None = field(default=None, repr=False, metadata={"parse": _optional_str})
    redis_max_connections: int = _setting(1000, _int(1))
    queue: str = _setting("default", _queue)
    api_keys: dict[str, str] | None = _setting(None, _api_keys, secret=True)
    api_keys_secret: str | None = _setting(None, _optional_str)
    api_keys_cache_s: int = _setting(300, _int(0))
    claim_idle_ms: int = _setting(30000, _int(1))
    max_attempts: int = _setting(3, _int(1, 100))
    max_deliveries: int = _setting(5, _int(1, 1000))
    job_timeout_s: int = _setting(600, _int(1, 3600))
    max_queue_depth: int = _setting(10000, _int(0))
    tenant_max_depth: int = _setting(0, _int(0))
    tenant_priorities: dict[str, Priority] | None = field(
        default=None,
        metadata={
            "parse": _tenant_priorities,
            "doc": "Each tenant's default `priority` (lane) for jobs that name none; a job's own `priority` wins. "
            "Unset, or a tenant not listed: `normal`.",
        },
    )
    fair_share: bool = _setting(True, _bool)  # G10, inferq/queue/fairshare.py
    tenant_weights: dict[str, float] | None = _setting(None, _tenant_weights)
    max_priority: Priority = field(
        default=Priority.HIGH,
        metadata={
            "parse": _priority,
            "doc": "The highest `priority` (lane) a tenant not listed in `INFERQ_TENANT_MAX_PRIORITY` may ask for; "
            "above it a submit is 403 `priority_not_allowed`. `high` (the default) lets every tenant pick its lane; "
            "a shared deployment sets `normal` and lists the tenants allowed `high`.",
        },
    )
    tenant_max_priority: dict[str, Priority] | None = field(
        default=None,
        metadata={
            "parse": _tenant_priorities,
            "doc": "Each tenant's highest allowed `priority` (`tenant:lane,...`), overriding `INFERQ_MAX_PRIORITY`. "
            "A tenant's default lane (`INFERQ_TENANT_PRIORITIES`) above its ceiling is capped to it.",
        },
    )
    admin_tenants: frozenset[str] | None = field(
        default=None,
        metadata={
            "parse": _tenants,
            "doc": "The operator tenants (comma-separated): only they see queue-wide numbers (`GET /v1/scale`, "
            "`GET /v1/stats/history`, the counts of `GET /v1/models`, the console's gauges); any other tenant gets "
            "403 on the first two and its own counts elsewhere. Unset: every tenant is an operator (one team, the "
            "emulator); a deployment shared by tenants sets it.",
        },
    )
    rate_limit_per_s: float = field(
        default=0.0,
        metadata={
            "parse": _float(0.0),
            "doc": "Requests per second each tenant may make on average (authenticated routes, all gateway "
            "instances together: counted in Redis); past it 429 `rate_limited` with `Retry-After`. 0: no limit.",
        },
    )
    rate_limit_burst: int = field(
        default=0,
        metadata={
            "parse": _int(0, 1_000_000),
            "doc": "How many requests a tenant may make at once above `INFERQ_RATE_LIMIT_PER_S` (the bucket's "
            "size). 0: one second's worth of the rate (at least 1).",
        },
    )
    tenant_max_waits: int = field(
        default=10,
        metadata={
            "parse": _int(0, 10_000),
            "doc": "Long polls one tenant may hold at once, all gateway instances together (`GET /v1/jobs/{id}?wait=`, "
            "`GET /v1/events?wait=`, a job's stream with `wait`, a synchronous completion): each holds a gateway "
            "execution for its length, so past it a wait is 429 `rate_limited` with `Retry-After` at once. A wait "
            "of 0 takes none. Size the gateway's reserved concurrency against it (docs/operations.md). 0: no limit.",
        },
    )
    tenant_max_retained_bytes: int = field(
        default=128 * 1024 * 1024,
        metadata={
            "parse": _int(0),
            "doc": "Bytes of job records one tenant's ended jobs may leave behind in one queue (kept for "
            "`INFERQ_RESULT_TTL_S` after each ends): each record is charged when its job ends (its metadata, "
            "result, errors, webhook URL and a fixed overhead) until it expires; while the charge is at this, the "
            "tenant's submits are 429 `quota_exceeded` with `Retry-After`, so no tenant can fill the cache "
            "(docs/operations.md, \"What one tenant can hold\"). 0: no limit.",
        },
    )
    engine_strikes: int = field(
        default=3,
        metadata={
            "parse": _int(0, 1000),
            "doc": "Jobs of one tenant that killed the model server (dead-lettered `engine_died`) within "
            "`INFERQ_ENGINE_STRIKE_WINDOW_S` before the tenant's submits to that model are refused for "
            "`INFERQ_ENGINE_COOLOFF_S` (429 `engine_cooloff` with `Retry-After`). 0: never.",
        },
    )
    engine_strike_window_s: int = field(
        default=3600,
        metadata={"parse": _int(1), "doc": "The window of `INFERQ_ENGINE_STRIKES`, in seconds."},
    )
    engine_cooloff_s: int = field(
        default=3600,
        metadata={
            "parse": _int(1),
            "doc": "How long a tenant whose jobs killed the model server `INFERQ_ENGINE_STRIKES` times is refused "
            "submits to that model, in seconds.",
        },
    )
    api_keys_max_stale_s: int = field(
        default=900,
        metadata={
            "parse": _int(0),
            "doc": "While Secrets Manager cannot be read, how long the gateway keeps serving the API keys it last "
            "read; past it every request is 503 until the secret can be read again (fail closed). 0: never serve a "
            "stale copy.",
        },
    )
    redis_wait_replicas: int = _setting(0, _int(0, 16))
    max_body_bytes: int = _setting(262144, _int(1))
    result_ttl_s: int = _setting(86400, _int(1))
    window: int | Literal["auto"] = _setting(8, _window)
    window_max: int = _setting(64, _int(1, 4096))
    drain_s: int = _setting(25, _int(0, 3600))
    backend: str = _setting("mock", _backend)
    openai_base_url: str = _setting("http://127.0.0.1:8000", _http_url)
    openai_api_key: str | None = _setting(None, _optional_str, secret=True)
    vllm_model: str | None = _setting(None, _optional_str)
    metrics_port: int = _setting(9100, _int(0, 65535))
    retry_base_ms: int = _setting(1000, _int(0))
    retry_max_ms: int = _setting(60000, _int(0))
    scale_min: int = _setting(0, _int(0, 10000))
    scale_max: int = _setting(4, _int(0, 10000))
    scale_target_per_worker: int | None = _setting(None, _int(1))
    scale_down_cooldown_s: int = _setting(120, _int(0))
    scale_to_zero_after_s: int = _setting(300, _int(0))
    scale_boot_s: float = _setting(120.0, _float(0.0))
    scale_gather_s: float = _setting(0.0, _float(0.0))
    scale_tokens_per_s: float = _setting(0.0, _float(0.0))
    scale_drain: bool = _setting(True, _bool)
    scale_spot_fallback_s: float = _setting(0.0, _float(0.0))
    emulator_boot_s: float = _setting(0.0, _float(0.0))
    emulator_interrupt_every_s: float = _setting(0.0, _float(0.0))
    scaler_interval_s: float = _setting(60.0, _float(0.1))
    scaler_function: str | None = _setting(None, _optional_str)
    scaler_wake_url: str | None = _setting(None, _optional_str)
    ecs_cluster: str | None = _setting(None, _optional_str)
    ecs_service: str | None = _setting(None, _optional_str)
    webhook_secret_id: str | None = field(
        default=None,
        metadata={
            "parse": _optional_str,
            "doc": "Secrets Manager id of the webhook signing key, for a process that is not handed the key itself "
            "(the scaler Lambda reads it at first use, again every 5 minutes); `INFERQ_WEBHOOK_SECRET` wins when set.",
        },
    )
    webhook_secret: str | None = _setting(None, _optional_str, secret=True)
    webhook_max_age_s: int = _setting(3600, _int(1))
    webhook_allow_private: bool = _setting(False, _bool)
    webhook_ports: tuple[int, ...] = _setting((443,), _ports)
    webhook_hosts: tuple[str, ...] = _setting((), _hosts)
    webhook_blocked_networks: tuple[str, ...] = _setting((), _networks)
    webhook_secrets_key: str | None = _setting(None, _secrets_key)
    worker_webhooks: bool = _setting(True, _bool)
    events_maxlen: int = _setting(100000, _int(100))
    files_bucket: str | None = _setting(None, _optional_str)
    inline_max_bytes: int = field(
        default=64 * 1024,
        metadata={
            "parse": _int(1024, 64 * 1024 * 1024),
            "doc": "A request body or result larger than this (bytes of compact JSON) is kept in S3 under `claims/` "
            "in `INFERQ_FILES_BUCKET` and the job record holds a reference (the claim check, docs/api.md); "
            "without a bucket every payload stays inline, bounded by `INFERQ_MAX_BODY_BYTES`.",
        },
    )
    max_upload_bytes: int = _setting(4 * 1024 * 1024, _int(1024, 6 * 1024 * 1024))
    max_file_bytes: int = _setting(200 * 1024 * 1024, _int(1024))
    batch_completion_windows: tuple[str, ...] = _setting(("24h",), _windows)
    batch_max_lines: int = _setting(50000, _int(1))
    tenant_max_files: int = _setting(0, _int(0))
    tenant_max_file_bytes: int = _setting(0, _int(0))
    tenant_max_batches: int = _setting(0, _int(0))
    file_recount_s: int = _setting(3600, _int(60, 7 * 24 * 3600))
    edge_origin_secret: str | None = _setting(None, _optional_str)
    worker_id: str | None = _setting(None, _optional_str)
    models: str | None = field(
        default=None,
        metadata={
            "parse": _optional_str,
            "doc": "Path of the model registry (`.yaml`, `.yml` or `.json`; docs/models.md): several models, each "
            "with its own queue, fleet and limits. Unset: one queue, `INFERQ_QUEUE`.",
        },
    )
    model: str | None = field(
        default=None,
        metadata={
            "parse": _optional_str,
            "doc": "The registry model a worker serves (required when `INFERQ_MODELS` names more than one).",
        },
    )
    output_max_bytes: int = field(
        default=256 * 1024,
        metadata={
            "parse": _int(1024, 64 * 1024 * 1024),
            "doc": "Most bytes of a job's output kept in its output stream while it runs (`GET /v1/jobs/{id}/stream`, "
            "`stream: true`); past it the worker stops streaming and readers get the rest when the job ends, from "
            "its result. The stream's text goes when the job ends.",
        },
    )
    # a watched job's output: the first piece at once, then intervals doubling from the first to the longest
    output_flush_ms: int = _setting(500, _int(0, 60_000))
    output_flush_max_ms: int = _setting(2500, _int(0, 600_000))
    output_flush_tokens: int = _setting(0, _int(0, 1_000_000))
    sync_wait_s: float = field(
        default=25.0,
        metadata={
            "parse": _float(1.0),
            "doc": "How long `POST /v1/chat/completions` and `POST /v1/completions` wait for the job (with `stream: "
            "true`, for its first output) before answering 504 `timeout` naming the job, which goes on. At most 25 "
            "on Lambda (API Gateway's HTTP API ends a request at 30 s): the gateway function refuses to start above.",
        },
    )
    usage_retention_days: int = field(
        default=400,
        metadata={
            "parse": _int(0, 3660),
            "doc": "Days each hourly usage bucket is kept in Redis (`GET /v1/usage`, docs/operations.md): 400, as AWS "
            "Cost Explorer keeps 13 months and a year-on-year month can be compared. About 80 bytes a row (tenant, "
            "lane, model) an hour. The daily export to S3 (`usage/`) keeps them for good. 0: metering off (nothing "
            "counted, no budgets).",
        },
    )
    gpu_hour_usd: float = field(
        default=1.006,
        metadata={
            "parse": _float(0.0),
            "doc": "Price of one GPU-hour in US dollars, what usage turns GPU-seconds into an estimated cost with; a "
            "model of the registry may set its own (`gpu_hour_usd`). Default: the on-demand price of the stack's "
            "`g5.xlarge` (one A10G) in us-east-1, Linux (aws.amazon.com/ec2/pricing/on-demand).",
        },
    )
    tenant_budgets: dict[str, Budget] | None = field(
        default=None,
        metadata={
            "parse": _tenant_budgets,
            "doc": "Monthly budgets per tenant (UTC calendar month, all models together): `tenant:<N>tokens` "
            "(prompt and completion) and/or `tenant:<N>usd` (estimated, from `INFERQ_GPU_HOUR_USD`). Past one, the "
            "tenant's submits answer 429 `quota_exceeded` naming it until the month ends; the scaler emits "
            "`BudgetUsedPercent` per budgeted tenant (alarm at 80). Unset, or a tenant not listed: no budget.",
        },
    )
    usage_tenant_metrics: bool = field(
        default=False,
        metadata={
            "parse": _bool,
            "doc": "The scaler's hourly usage metrics (EMF) also per tenant (dimensions `model`, `tenant`), besides "
            "per model. Off by default: each tenant's metrics are custom metrics CloudWatch bills for.",
        },
    )
    log_level: str = _setting("INFO", _log_level)
    log_payloads: bool = _setting(False, _bool)

    def __post_init__(self) -> None:
        if self.scale_min > self.scale_max:
            raise SettingsError("INFERQ_SCALE_MIN", f"{self.scale_min} must be <= INFERQ_SCALE_MAX {self.scale_max}")
        if self.retry_max_ms < self.retry_base_ms:
            raise SettingsError("INFERQ_RETRY_MAX_MS", "must be >= INFERQ_RETRY_BASE_MS")

    def priority_of(self, tenant: str) -> Priority:
        """The lane of a tenant's jobs that name none (``INFERQ_TENANT_PRIORITIES``; else ``normal``), capped to
        the tenant's ceiling."""
        lane = (self.tenant_priorities or {}).get(tenant, Priority.NORMAL)
        ceiling = self.max_priority_of(tenant)
        return lane if LANES.index(lane) >= LANES.index(ceiling) else ceiling

    def weight_of(self, tenant: str) -> float:
        """A tenant's weight in fair share (``INFERQ_TENANT_WEIGHTS``; else 1)."""
        return (self.tenant_weights or {}).get(tenant, 1.0)

    def max_priority_of(self, tenant: str) -> Priority:
        """The highest lane a tenant may ask for (``INFERQ_TENANT_MAX_PRIORITY``; else ``INFERQ_MAX_PRIORITY``)."""
        return (self.tenant_max_priority or {}).get(tenant, self.max_priority)

    def priority_allowed(self, tenant: str, priority: Priority) -> bool:
        return LANES.index(priority) >= LANES.index(self.max_priority_of(tenant))

    def reads_usage_of_others(self, tenant: str) -> bool:
        """Whether a tenant may read other tenants' usage (``GET /v1/usage?tenant=``): only an operator named in
        ``INFERQ_ADMIN_TENANTS``; unset, no one (one team's bill is not another's to read)."""
        return self.admin_tenants is not None and tenant in self.admin_tenants

    def is_admin(self, tenant: str) -> bool:
        """Whether a tenant may see queue-wide numbers (``INFERQ_ADMIN_TENANTS``; unset: every tenant)."""
        return self.admin_tenants is None or tenant in self.admin_tenants

    def is_named_admin(self, tenant: str) -> bool:
        """Whether ``INFERQ_ADMIN_TENANTS`` names the tenant: an operator that may act on other tenants' jobs (a
        redrive). Unset, every tenant is an operator of its own jobs, none of another's."""
        return self.admin_tenants is not None and tenant in self.admin_tenants

    @property
    def adaptive_window(self) -> bool:
        """``INFERQ_WINDOW=auto``: the window follows the model server's load."""
        return self.window == AUTO

    @property
    def window_limit(self) -> int:
        """Most jobs one worker ever holds at once: the static window, or ``INFERQ_WINDOW_MAX`` with ``auto``."""
        return self.window if isinstance(self.window, int) else self.window_max

    @property
    def target_per_worker(self) -> int:
        """Jobs one worker should carry; defaults to the window, with ``auto`` to ``INFERQ_WINDOW_MAX`` (the scaler
        cannot see how far a worker's adaptive window has grown; docs/configuration.md)."""
        return self.scale_target_per_worker or self.window_limit

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = PREFIX + f.name.upper()
            raw = env.get(name)
            if raw is not None:
                values[f.name] = f.metadata["parse"](name, raw)
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        current = {f.name: getattr(self, f.name) for f in fields(self)}
        current.update(changes)
        return Settings(**current)

    @staticmethod
    def variable(field_name: str) -> str:
        return PREFIX + field_name.upper()


def load_or_exit(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read the settings for a process's ``main``; a bad value prints one line naming the variable and exits 2."""
    try:
        return Settings.from_env(environ, **overrides)
    except SettingsError as exc:
        import sys

        print(f"inferq: invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
