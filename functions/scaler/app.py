"""The scaler Lambda: ``functions/scaler/app.handler``.

Two kinds of event reach it. The EventBridge schedule (``source`` ``aws.events``) starts an invocation that
evaluates every few seconds until its time is nearly over, so the fleet follows the queue faster than the
one-minute schedule. Anything else (the gateway's wake-up, ``{"source": "inferq.gateway", ...}``, or a manual
invoke) evaluates once, at once. The work itself is in :mod:`functions.scaler.scaler`.

Settings are read on the first invocation; a bad or missing variable fails it with a message naming the variable
(``INFERQ_ECS_CLUSTER`` and ``INFERQ_ECS_SERVICE`` are required here). Clients are created on first use: boto3's
ECS client once per sandbox (``AWS_ENDPOINT_URL_ECS`` or ``AWS_ENDPOINT_URL`` point it elsewhere, e.g. at the
emulator's moto server), the Redis client once per invocation, because an asyncio client belongs to the event
loop it was opened on and every invocation runs its own loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics

from inferq.config.registry import load as load_registry
from inferq.config.settings import Settings, SettingsError
from inferq.queue.protocol import Queue
from inferq.redis.connection import connect
from inferq.scaling.capacity import Fallback, fallback_service
from inferq.scaling.policy import ScalePolicy

from .scaler import Cadence, EcsService, Scaler, Tick, WebhookPass
from .standins import StandIns
from .usage import usage_pass

logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME") or "inferq-scaler")
logger.append_keys(name="%(name)s")  # the logger's name on every line, as on the lines of our packages' loggers
# service="": no automatic ``service`` dimension, so each queue metric is identified by ``queue`` alone and
# plain CloudWatch alarms can select it (Metrics Insights queries match either way).
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or "inferq", service="")

PACKAGES = frozenset({"inferq", "functions"})

CADENCE = Cadence()
SCHEDULE_PERIOD_S = 60.0
"""EventBridge's ``rate(1 minute)``: one scheduled invocation never runs into the next one."""

_settings: Settings | None = None
_fleets: list[tuple[str | None, Settings]] = []
"""(model name, its settings) per fleet: every model of the registry, or the one queue (name None)."""
_ecs_client: Any = None
_T = TypeVar("_T")


def load_settings() -> Settings:
    global _settings, _fleets
    if _settings is None:
        settings = Settings.from_env()
        registry = load_registry(settings)  # a bad file fails the invocation naming INFERQ_MODELS
        # with a registry each model names its own service; without one INFERQ_ECS_SERVICE is the one fleet's
        for name in ("ecs_cluster",) if registry else ("ecs_cluster", "ecs_service"):
            if not getattr(settings, name):
                raise SettingsError(Settings.variable(name), "must be set: the scaler sizes that ECS service")
        logger.setLevel(settings.log_level)
        # the primary model first: its queue holds the batches (the gateway's primary queue too)
        models = [registry.primary, *(m for m in registry.models if m is not registry.primary)] if registry else []
        _fleets = [(m.name, m.settings) for m in models] or [(None, settings)]
        adopt_package_loggers()
        _settings = settings
    return _settings


def fleets() -> list[tuple[str | None, Settings]]:
    """Every fleet this scaler sizes (after :func:`load_settings`)."""
    load_settings()
    return _fleets


def adopt_package_loggers() -> None:
    """Powertools' handler, level and keys for our packages' loggers (``inferq.*``, the webhook sender's
    ``inferq.webhooks`` among them), instead of the Lambda runtime's plain-text root handler: the same keys as
    the gateway's and the workers' lines."""
    from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

    for name in PACKAGES:
        logging.getLogger(name)  # registered, so that Powertools finds it; later modules propagate up to it
    copy_config_to_registered_loggers(source_logger=logger, include=set(PACKAGES))


def ecs_client() -> Any:
    global _ecs_client
    if _ecs_client is None:
        import boto3
        from botocore.config import Config

        endpoint = os.environ.get("AWS_ENDPOINT_URL_ECS") or os.environ.get("AWS_ENDPOINT_URL") or None
        _ecs_client = boto3.client(
            "ecs",
            endpoint_url=endpoint,
            # short timeouts: a tick must end inside the invocation even when ECS does not answer
            config=Config(connect_timeout=2, read_timeout=3, retries={"mode": "standard", "total_max_attempts": 2}),
        )
    return _ecs_client


def reset() -> None:
    """Forget the settings and the ECS client (tests, or a process that changed its environment)."""
    global _settings, _ecs_client, _fleets
    _settings, _ecs_client, _fleets = None, None, []
    _webhook_secrets.clear()


def trigger(event: Any) -> str:
    """``schedule`` for EventBridge's scheduled event, ``wake`` for anything else."""
    if isinstance(event, Mapping) and event.get("source") == "aws.events":
        return "schedule"
    return "wake"


def remaining_s(context: Any) -> float:
    get = getattr(context, "get_remaining_time_in_millis", None)
    return get() / 1000.0 if callable(get) else 0.0  # no context: time for one evaluation only


def handler(event: Any, context: Any) -> dict[str, Any]:
    # the Lambda's deadline, fixed as the invocation begins: the settings, the clients and the Redis connection
    # made before the first tick come out of the same time
    deadline = time.monotonic() + remaining_s(context)
    settings = load_settings()
    kind = trigger(event)
    logger.append_keys(request_id=getattr(context, "aws_request_id", None), trigger=kind, queue=settings.queue)
    by_fleet = _run(invoke(settings, once=kind != "schedule", deadline=deadline))
    answer: dict[str, Any] = {"trigger": kind, **_summary(by_fleet[0][1])}
    if by_fleet[0][0] is not None:  # a registry: each model's own summary too
        answer["models"] = {name: _summary(ticks) for name, ticks in by_fleet}
        answer["changes"] = sum(m["changes"] for m in answer["models"].values())
        answer["errors"] = sorted({e for m in answer["models"].values() for e in m["errors"]})
    return answer


def _summary(ticks: list[Tick]) -> dict[str, Any]:
    last = ticks[-1]
    return {
        "evaluations": len(ticks),
        "desired": last.desired,
        "reason": last.decision.reason if last.decision else None,
        "changes": sum(1 for t in ticks if t.applied),
        "errors": sorted({e for t in ticks for e in t.errors}),
    }


async def invoke(settings: Settings, *, once: bool, deadline: float) -> list[tuple[str | None, list[Tick]]]:
    """Evaluate every fleet (each model of the registry with its own policy and service, or the one queue) side by
    side on one Redis client, and drive the batches, until ``deadline`` (``time.monotonic()``: the invocation's
    end) less the cadence's reserve; each fleet's ticks, in the registry's order."""
    client = connect(settings)
    try:
        scalers: list[tuple[str | None, Scaler]] = []
        for model, fleet in fleets() or [(None, settings)]:
            assert settings.ecs_cluster and fleet.ecs_service  # load_settings checked them
            service = EcsService(ecs_client(), settings.ecs_cluster, fleet.ecs_service)
            scalers.append((model, Scaler(
                Queue(client, fleet),
                service,
                ScalePolicy.from_settings(fleet),
                metrics=metrics,
                logger=logger,
                webhooks=webhook_pass(fleet),
                cadence=CADENCE,
                model=model,
                stand_ins=stand_ins(service, fleet),
            )))
        budget_s = max(0.0, deadline - time.monotonic())  # what the clients' setup left
        primary = scalers[0][1].queue
        runs, *_ = await asyncio.gather(  # batches advance at every size of fleet, zero included
            asyncio.gather(*(s.run(budget_s=budget_s, span_s=SCHEDULE_PERIOD_S, once=once) for _, s in scalers)),
            drive_batches(primary.settings, primary, budget_s),
            usage_pass(settings, fleets() or [(None, settings)], client, logger),  # the export, usage metrics
            recount_files(primary.settings, primary, budget_s),
        )
        return [(model, ticks) for (model, _), ticks in zip(scalers, runs, strict=True)]
    finally:
        await client.aclose()


def stand_ins(service: EcsService, fleet: Settings) -> StandIns | None:
    """With Spot (``INFERQ_SCALE_SPOT_FALLBACK_S`` > 0): the on-demand fallback service beside ``service``."""
    if fleet.scale_spot_fallback_s <= 0:
        return None
    fallback = EcsService(service.client, service.cluster, fallback_service(service.service))
    return StandIns(service, fallback, Fallback(fleet.scale_spot_fallback_s))


async def drive_batches(settings: Settings, queue: Queue, budget_s: float) -> None:
    """The batch driver (``inferq.batches.driver``) for the invocation's time, when a files bucket is configured."""
    if not settings.files_bucket:
        return
    from functions.storage import FileStore
    from inferq.batches.driver import BatchDriver

    try:
        # each line to its model's queue
        driver = BatchDriver(queue, FileStore(settings.files_bucket), settings, load_registry(settings))
        await driver.run(budget_s=max(0.0, budget_s - 5.0))
    except Exception:  # a batch that cannot move now must not stop the scaling; the next tick tries again
        logger.exception("batch driver pass failed")


async def recount_files(settings: Settings, queue: Queue, budget_s: float) -> None:
    """The file quotas' counts recounted from S3 where due (``inferq.queue.storage``), when a files bucket is
    configured: at most once per ``INFERQ_FILE_RECOUNT_S`` a tenant, off the request path."""
    if not settings.files_bucket:
        return
    from functions.storage import FileStore
    from inferq.queue.storage import Storage

    try:
        await Storage(queue).recount_due(FileStore(settings.files_bucket), settings.file_recount_s,
                                         max(0.0, budget_s - 5.0))
    except Exception:  # S3 or the cache failing now: the counts stay as they are; the next tick tries again
        logger.exception("file recount pass failed")


_webhooks_missing_logged = False


def webhook_pass(settings: Settings) -> WebhookPass | None:
    """One webhook delivery pass per tick, when this artifact has the sender's HTTP client (httpx)."""
    global _webhooks_missing_logged
    try:
        from inferq.webhooks.sender import deliver_webhooks
    except ImportError as exc:
        if not _webhooks_missing_logged:
            _webhooks_missing_logged = True
            logger.warning("scaler: webhook delivery unavailable here; workers deliver them", extra={"error": str(exc)})
        return None
    try:
        settings = with_webhook_secret(settings)
    except Exception as exc:  # Secrets Manager unreachable: send nothing unsigned this time; workers deliver too
        logger.warning("scaler: webhook secret unreadable; no webhook pass", extra={"error": type(exc).__name__})
        return None

    async def deliver(queue: Queue, budget_s: float, http_timeout_s: float) -> dict[str, int]:
        report = await deliver_webhooks(
            queue, settings, consumer="scaler", budget_s=budget_s, http_timeout_s=http_timeout_s
        )
        return {"delivered": report.delivered, "failed": report.failed, "abandoned": report.abandoned}

    return deliver


WEBHOOK_SECRET_MAX_AGE_S = 300
webhook_secret_clock: Callable[[], float] = time.monotonic
"""The clock the signing secret's cache runs on (a test moves one by hand, then :func:`reset`)."""

_webhook_secrets: dict[str, Any] = {}
"""Secret id -> its :class:`inferq.aws.CachedSecret`."""


def with_webhook_secret(settings: Settings) -> Settings:
    """``INFERQ_WEBHOOK_SECRET_ID``: the signing secret read from Secrets Manager at first use and kept for five
    minutes (:class:`inferq.aws.CachedSecret`: short timeouts inside a tick), so a
    rotated secret reaches the scaler without a redeploy. An expired copy is never used to sign: a failed read
    raises (:class:`inferq.aws.SecretUnavailable`), and the tick sends no webhooks (the workers deliver them)."""
    if settings.webhook_secret or not settings.webhook_secret_id:
        return settings
    from inferq.aws import CachedSecret

    secret = _webhook_secrets.get(settings.webhook_secret_id)
    if secret is None:
        secret = CachedSecret(settings.webhook_secret_id, WEBHOOK_SECRET_MAX_AGE_S, clock=webhook_secret_clock)
        _webhook_secrets[settings.webhook_secret_id] = secret
    return settings.replace(webhook_secret=secret.get())


def _run(coro: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run``, also from a thread whose event loop is running (then on a helper thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1, thread_name_prefix="scaler") as pool:
        return pool.submit(asyncio.run, coro).result()
