"""One scaler invocation, outside the Lambda plumbing: observe, decide, apply, record, report.

Each evaluation (a *tick*) reads the queue once (``Queue.observe``: one read-only script) and the ECS service
once (``DescribeServices``), asks the pure policy (:mod:`inferq.scaling.policy`) for a count, calls ``UpdateService``
only when that count differs from the service's, records the decision and the policy's memory in
``inferq:{Q}:scale``, and prints the tick's CloudWatch metrics (EMF). A scheduled invocation ticks every
:attr:`Cadence.every_s` until its time is nearly over; a wake-up from the gateway ticks once.

Failure is never a guess: if Redis or ECS cannot be read, or the update fails, the service keeps its count, the
tick is logged (one line, no traceback) and counted (``ObserveErrors``, ``ApplyErrors``) and the next tick tries
again. Redis failures follow the shared fault model (:mod:`inferq.redis.faults`): a TRANSIENT or CAPACITY fault (a
failover, a timeout, a full server) is such a failure; any other error is a bug and fails the invocation, once,
with its traceback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferq.queue.history import record_sample
from inferq.queue.protocol import Observation, Queue
from inferq.redis.faults import classify, is_recoverable
from inferq.scaling.policy import Decision, Demand, ScalePolicy, ScaleState, decide

from .ecs import ECS_ERRORS, EcsService, EcsUnavailable, ServiceCounts

if TYPE_CHECKING:
    from .standins import StandIns, StandInStep

__all__ = ["ECS_ERRORS", "Cadence", "EcsService", "EcsUnavailable", "Scaler", "ServiceCounts", "Tick"]

@dataclass(frozen=True)
class Cadence:
    every_s: float = 5.0
    """Time between the starts of two evaluations within one scheduled invocation."""
    reserve_s: float = 10.0
    """Time kept free at the end of the invocation for the last evaluation to finish (timeouts included)."""
    webhook_budget_s: float = 1.0
    """Time one tick may spend starting webhook deliveries (each POST may take ``webhook_http_timeout_s`` more)."""
    webhook_http_timeout_s: float = 3.0


@dataclass
class Tick:
    """What one evaluation saw and did."""

    at: float
    observation: Observation | None = None
    counts: ServiceCounts | None = None
    decision: Decision | None = None
    applied: bool = False
    errors: list[str] = field(default_factory=list)
    webhooks: dict[str, int] = field(default_factory=dict)
    enqueued: int | None = None
    job_s: float | None = None
    backlog_tokens: int | None = None
    slot_tokens_per_s: float | None = None
    stand_ins: StandInStep | None = None
    """With Spot: the on-demand stand-ins this tick set (None without Spot, or when ECS could not be read)."""

    @property
    def desired(self) -> int | None:
        """The count in force after this tick (None when ECS could not be read)."""
        if self.applied and self.decision is not None:
            return self.decision.desired
        return self.counts.desired if self.counts is not None else None


WebhookPass = Callable[[Queue, float, float], Awaitable[dict[str, int]]]


class Scaler:
    def __init__(
        self,
        queue: Queue,
        ecs: EcsService,
        policy: ScalePolicy,
        *,
        metrics: Any,
        logger: Any,
        webhooks: WebhookPass | None = None,
        cadence: Cadence | None = None,
        clock: Callable[[], float] = time.time,
        model: str | None = None,
        stand_ins: StandIns | None = None,
    ) -> None:
        self.queue = queue
        self.stand_ins = stand_ins
        """With Spot: the on-demand fallback service, sized after each decision (:mod:`.standins`)."""
        self.model = model
        """The registry model this scaler sizes (a metrics dimension); None without a registry."""
        self.ecs = ecs
        self.policy = policy
        self.metrics = metrics
        self.logger = logger
        self.webhooks = webhooks
        self.cadence = cadence or Cadence()
        self.clock = clock
        self._redis_wait_s = 2 * queue.settings.redis_timeout_s + 1.0

    async def run(self, *, budget_s: float, span_s: float, once: bool) -> list[Tick]:
        """Tick now, then every ``every_s`` while the next tick can end ``reserve_s`` before both the time budget
        (the Lambda's remaining time) and ``span_s`` (the schedule's period: invocations must not pile up)."""
        start = time.monotonic()
        end = start + min(budget_s, span_s) - self.cadence.reserve_s
        ticks: list[Tick] = []
        while True:
            began = time.monotonic()
            ticks.append(await self.tick())
            next_at = began + self.cadence.every_s
            if once or next_at > end:
                return ticks
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def tick(self) -> Tick:
        now = self.clock()
        tick = Tick(at=now)
        state_fields: dict[str, str] | None = None
        try:
            tick.observation = await asyncio.wait_for(self.queue.observe(now=int(now * 1000)), self._redis_wait_s)
            state_fields = await asyncio.wait_for(self.queue.scale_state(), self._redis_wait_s)
            figures = await asyncio.wait_for(fleet_figures(self.queue), self._redis_wait_s)
            tick.enqueued, tick.job_s, tick.backlog_tokens, tick.slot_tokens_per_s = figures
        except Exception as exc:
            _recoverable_or_raise(exc)
            tick.errors.append("redis")
            self.logger.warning("scaler: Redis unavailable, desired count unchanged", extra=_fault(exc))
        try:
            tick.counts = await asyncio.to_thread(self.ecs.counts)
        except EcsUnavailable as exc:
            tick.errors.append("ecs")
            self.logger.warning("scaler: ECS unreachable, desired count unchanged", extra={"error": str(exc)})

        if tick.observation is not None and tick.counts is not None and state_fields is not None:
            await self._decide_and_apply(tick, tick.observation, tick.counts, state_fields, now)
        if tick.observation is not None:
            await self._housekeeping(tick, tick.observation)
            await self._record_history(tick, tick.observation, now)
        self._emit(tick, now)
        return tick

    async def _decide_and_apply(
        self, tick: Tick, observation: Observation, counts: ServiceCounts, state_fields: dict[str, str], now: float
    ) -> None:
        # The service's own desired count is the capacity: it includes tasks still starting, and it is what is in
        # force if someone else changed it.
        state = ScaleState.from_fields(state_fields).adopt(counts.desired, now)
        demand = Demand.from_observation(observation, now_ms=int(now * 1000), enqueued=tick.enqueued, job_s=tick.job_s,
                                         backlog_tokens=tick.backlog_tokens,
                                         slot_tokens_per_s=tick.slot_tokens_per_s)
        decision = decide(self.policy, demand, state, now)
        tick.decision = decision
        log_extra = {
            "desired": decision.desired, "previous": counts.desired, "running": counts.running,
            "starting": counts.pending, "lag": observation.lag, "pending": observation.pending,
            "delayed": observation.delayed, "busy_workers": observation.busy_workers, "reason": decision.reason,
        }
        if decision.desired != counts.desired:
            try:
                await asyncio.to_thread(self.ecs.set_desired, decision.desired)
            except EcsUnavailable as exc:
                tick.errors.append("apply")
                self.logger.error("scaler: UpdateService failed, desired count unchanged",
                                  extra={**log_extra, "error": str(exc)})
                return  # nothing recorded: the next tick decides again from what is really in force
            tick.applied = True
            self.logger.info(f"scaler: {counts.desired} -> {decision.desired} workers", extra=log_extra)
        else:
            self.logger.debug("scaler: no change", extra=log_extra)
        spot_fields = await self._stand_ins(tick, decision.desired, counts, state_fields, now)
        try:
            await asyncio.wait_for(
                self.queue.record_decision(decision.desired, decision.reason, at=now, action=decision.action.value,
                                           target="" if decision.target is None else decision.target,
                                           **decision.state.to_fields(), **spot_fields),
                self._redis_wait_s,
            )
        except Exception as exc:
            _recoverable_or_raise(exc)
            # The count is applied; the next tick adopts it from ECS as a change made now.
            tick.errors.append("record")
            self.logger.warning("scaler: could not record the decision", extra=_fault(exc))

    async def _stand_ins(self, tick: Tick, desired: int, counts: ServiceCounts, state_fields: dict[str, str],
                         now: float) -> dict[str, str]:
        """With Spot: size the on-demand fallback service for Spot tasks short of capacity; the fields to keep
        in the scale hash (``stand_ins``, ``spot_short_at``). A failure leaves the fallback's count as it is."""
        if self.stand_ins is None:
            return {}
        raw = state_fields.get("spot_short_at") or ""
        try:
            short_at = float(raw) if raw else None
        except ValueError:
            short_at = None
        try:
            step = await asyncio.to_thread(self.stand_ins.step, desired, counts, short_at, now)
        except EcsUnavailable as exc:
            tick.errors.append("stand_ins")
            self.logger.error("scaler: could not size the on-demand fallback service", extra={"error": str(exc)})
            return {"spot_short_at": raw}
        tick.stand_ins = step
        if step.changed:
            self.logger.info(f"scaler: on-demand stand-ins {step.previous} -> {step.count}",
                             extra={"desired": desired, "spot_running": counts.running, "short": step.short})
        return {"stand_ins": str(step.count), "spot_short_at": "" if step.short_at is None else repr(step.short_at)}

    async def _housekeeping(self, tick: Tick, observation: Observation) -> None:
        """Work no worker may be up to do: move due retries into the stream, and deliver webhooks of jobs that ended
        without a worker (cancelled or expired while the fleet is at zero)."""
        if observation.delayed_due:
            try:
                await asyncio.wait_for(self.queue.promote(), self._redis_wait_s)
            except Exception as exc:
                _recoverable_or_raise(exc)
                self.logger.warning("scaler: could not promote due retries", extra=_fault(exc))
        try:  # jobs whose ttl_s passed unstarted leave the unfinished count even with no worker up
            await asyncio.wait_for(self.queue.expire_due(), self._redis_wait_s)
        except Exception as exc:
            _recoverable_or_raise(exc)
            self.logger.warning("scaler: could not expire jobs past their ttl_s", extra=_fault(exc))
        if self.webhooks is not None:
            try:
                tick.webhooks = await self.webhooks(
                    self.queue, self.cadence.webhook_budget_s, self.cadence.webhook_http_timeout_s
                )
            except Exception as exc:  # best effort: undelivered events stay pending for the next pass
                tick.errors.append("webhooks")
                if is_recoverable(exc):
                    self.logger.warning("scaler: webhook pass failed", extra=_fault(exc))
                else:  # not Redis's fault: a bug of the sender, loud, but scaling goes on
                    self.logger.exception("scaler: webhook pass failed", extra=_fault(exc))

    async def _record_history(self, tick: Tick, observation: Observation, now: float) -> None:
        """One sample for the console's charts (:mod:`inferq.queue.history`); a lost one is a gap, not a failure."""
        running = tick.counts.running if tick.counts is not None else None
        try:
            await asyncio.wait_for(
                record_sample(self.queue, observation, desired=tick.desired, running=running, at=now),
                self._redis_wait_s,
            )
        except Exception as exc:
            _recoverable_or_raise(exc)
            self.logger.warning("scaler: could not record a history sample", extra=_fault(exc))

    def _emit(self, tick: Tick, now: float) -> None:
        from aws_lambda_powertools.metrics import MetricUnit

        m = self.metrics
        m.add_dimension(name="queue", value=self.queue.settings.queue)
        if self.model is not None:
            m.add_dimension(name="model", value=self.model)
        o = tick.observation
        if o is not None:
            m.add_metric(name="Lag", unit=MetricUnit.Count, value=o.lag)
            m.add_metric(name="Pending", unit=MetricUnit.Count, value=o.pending)
            m.add_metric(name="Delayed", unit=MetricUnit.Count, value=o.delayed)
            m.add_metric(name="Dlq", unit=MetricUnit.Count, value=o.dlq)
            m.add_metric(name="Workers", unit=MetricUnit.Count, value=o.workers)
            m.add_metric(name="BusyWorkers", unit=MetricUnit.Count, value=o.busy_workers)
            m.add_metric(name="OldestJobAgeSeconds", unit=MetricUnit.Seconds,
                         value=round(o.oldest_age_s(int(now * 1000)), 3))
        if tick.backlog_tokens is not None:
            m.add_metric(name="BacklogTokens", unit=MetricUnit.Count, value=tick.backlog_tokens)
        desired = tick.desired
        if desired is not None:
            m.add_metric(name="Desired", unit=MetricUnit.Count, value=desired)
        if tick.counts is not None:
            m.add_metric(name="Running", unit=MetricUnit.Count, value=tick.counts.running)
            m.add_metric(name="Starting", unit=MetricUnit.Count, value=tick.counts.pending)
        if tick.stand_ins is not None:
            m.add_metric(name="OnDemandStandIns", unit=MetricUnit.Count, value=tick.stand_ins.count)
            m.add_metric(name="ShortOfSpot", unit=MetricUnit.Count, value=tick.stand_ins.short)
        m.add_metric(name="ScaleChanges", unit=MetricUnit.Count, value=1 if tick.applied else 0)
        observe_errors = sum(1 for e in tick.errors if e in ("redis", "ecs"))
        m.add_metric(name="ObserveErrors", unit=MetricUnit.Count, value=observe_errors)
        if "apply" in tick.errors or "stand_ins" in tick.errors:
            m.add_metric(name="ApplyErrors", unit=MetricUnit.Count, value=1)
        for name, value in tick.webhooks.items():
            m.add_metric(name=f"Webhooks{name.capitalize()}", unit=MetricUnit.Count, value=value)
        m.flush_metrics()


async def fleet_figures(queue: Queue) -> tuple[int, float | None, int, float | None]:
    """What the policy sizes by, beyond the job counts: the queue's arrival counter and its expected work
    (``enqueued`` and ``backlog_tokens`` in the stats hash), and the live workers' measured backend seconds per
    attempt and output tokens per backend second (one slot's throughput) from ``inferq:{Q}:fleet``, written with
    each heartbeat (None before any worker ran a job, or produced a token)."""
    keys = queue.keys
    async with queue.redis.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.stats, ["enqueued", "backlog_tokens"])
        pipe.hgetall(keys.fleet)
        pipe.hgetall(keys.workers)
        (raw_enqueued, raw_tokens), fleet, beats = await pipe.execute()
    runs, seconds, tokens, token_seconds = 0, 0.0, 0, 0.0
    for worker, record in fleet.items():
        parts = record.split(" ")
        if worker not in beats or len(parts) not in (3, 4):
            continue
        try:
            run_count, run_s = int(parts[1]), float(parts[2])
            produced = int(parts[3]) if len(parts) == 4 else 0
        except ValueError:
            continue
        runs, seconds = runs + run_count, seconds + run_s
        if produced > 0:  # a backend that reports no usage (the mock's embeddings) measures no throughput
            tokens, token_seconds = tokens + produced, token_seconds + run_s
    enqueued = _count(raw_enqueued)
    return (enqueued, seconds / runs if runs else None, max(_count(raw_tokens), 0),
            tokens / token_seconds if token_seconds > 0 else None)


def _count(raw: str | None) -> int:
    try:
        return int(raw) if raw not in (None, "") else 0
    except ValueError:
        return 0


def _recoverable_or_raise(exc: Exception) -> None:
    """Let a Redis failure that is not TRANSIENT or CAPACITY (a bug) fail the invocation."""
    if not is_recoverable(exc):
        raise exc


def _fault(exc: BaseException) -> dict[str, str]:
    return {"fault": classify(exc).value, "error": f"{type(exc).__name__}: {exc}"}
