"""The emulator's ECS agent: keeps real ``python -m gpu_worker`` processes in line with the service's desired count.

What it copies from ECS, because the worker and the scaler depend on it:
- every task gets ``ECS_AGENT_URI``; the agent serves the task scale-in protection endpoint under it
  (``GET``/``PUT {ECS_AGENT_URI}/task-protection/v1/state``), which moto does not implement;
- scale-in stops surplus tasks that are not protected (newest first) with SIGTERM, and SIGKILL after the task
  definition's stop timeout; a protected task is never chosen: the surplus waits until its protection is
  disabled or expires, as with ECS services;
- a task whose process exits on its own (crash, kill -9, SIGTERM from someone else) is replaced; only when
  tasks keep failing within seconds of starting (a crash loop: bad image, bad setting) do replacements slow
  down, with a growing delay, as ECS throttles such restarts;
- the service's ``runningCount`` is the number of live tasks not being stopped, written into moto, so
  ``DescribeServices`` tells the scaler the truth;
- a GPU instance's boot, when ``boot_s`` (``INFERQ_EMULATOR_BOOT_S``) is set: a new task stays starting (the
  service's ``pendingCount``) that long before its worker process starts. A task still starting is the first
  one scale-in cancels, as ECS stops tasks that are not running yet first;
- a Spot interruption (:meth:`EcsAgent.interrupt`: ``inferq interrupt``, or every live task after a random time
  with mean ``INFERQ_EMULATOR_INTERRUPT_EVERY_S``): ECS drains the instance on EC2's two-minute notice, so the task
  is stopped whether protected or not (SIGTERM now, SIGKILL after its stop timeout or the notice, whichever is
  shorter), no longer counts as running, and the service starts its replacement at once, beside it (the stack's
  ``MaximumPercent`` of 200), as ECS does for a task on a draining instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from inferq.config.registry import Registry
from inferq.retry import backoff

from .ecs import MotoEcs, ServiceView
from .httpd import HttpServer, Request
from .procs import Child, LogSink

PROTECTION_PATH = re.compile(r"^/api/(?P<task>[A-Za-z0-9-]+)/task-protection/v1/state/?$")
INTERRUPT_PATH = "/interrupt"
"""The emulator's own control endpoint (not an ECS API): interrupt a task as EC2 Spot does (``inferq interrupt``)."""
SPOT_NOTICE_S = 120.0  # EC2's Spot interruption notice
DEFAULT_PROTECTION_MINUTES = 2 * 60  # ECS's default expiry
MAX_PROTECTION_MINUTES = 48 * 60
FAST_FAILURE_S = 3.0
CRASH_LOOP_AFTER = 3  # consecutive fast failures before replacements are delayed


@dataclass
class Task:
    arn: str
    id: str
    worker_id: str
    slot: int
    child: Child
    started_at: float = field(default_factory=time.monotonic)
    protected: bool = False
    protection_expires_at: float | None = None  # wall clock, seconds
    stopping: bool = False
    stop_reason: str = ""

    def is_protected(self, now: float) -> bool:
        return self.protected and (self.protection_expires_at is None or now < self.protection_expires_at)

    def protection(self) -> dict[str, Any]:
        expires = None
        if self.protected and self.protection_expires_at is not None:
            expires = datetime.fromtimestamp(self.protection_expires_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"ExpirationDate": expires, "ProtectionEnabled": self.is_protected(time.time()), "TaskArn": self.arn}


class EcsAgent:
    def __init__(
        self,
        ecs: MotoEcs | ServiceView,
        sink: LogSink,
        env: Mapping[str, str],
        *,
        host: str = "127.0.0.1",
        stop_timeout_s: float = 30.0,
        metrics_port_base: int = 0,
        worker_argv: Sequence[str] | None = None,
        log_protection: bool = False,
        worker_prefix: str = "worker",
        boot_s: float = 0.0,
        interrupt_every_s: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        self.ecs = ecs
        self.service = ecs.service if isinstance(ecs, ServiceView) else ecs.services[0]
        """The ECS service whose tasks this agent runs."""
        self.boot_s = boot_s
        self.interrupt_every_s = interrupt_every_s
        """Mean seconds before each live task is interrupted as by Spot (0: only on request)."""
        self._rng = rng or random.Random()
        self._timers: set[asyncio.Task[None]] = set()
        self.interrupted = 0
        self._booting: list[asyncio.Task[Any]] = []
        self.worker_prefix = worker_prefix
        """Worker ids are ``<prefix>-<n>``: one agent per model's service names its workers after the model."""
        self.sink = sink
        self.env = dict(env)
        self.host = host
        self.stop_timeout_s = stop_timeout_s
        self.metrics_port_base = metrics_port_base
        self.worker_argv = list(worker_argv or [sys.executable, "-m", "gpu_worker"])
        self.log_protection = log_protection
        self.tasks: dict[str, Task] = {}
        self.started = 0
        self._server = HttpServer(self._handle, host)
        self._kick = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False
        self._fast_failures = 0
        self._not_before = 0.0
        self._waiting_note = ""
        self._background: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> EcsAgent:
        await self._server.start()
        loop = asyncio.get_running_loop()

        def on_desired_change(_desired: int) -> None:  # called on moto's request thread
            loop.call_soon_threadsafe(self.kick)

        self.ecs.on_desired_change = on_desired_change
        self._loop_task = asyncio.create_task(self._run(), name="ecs-agent")
        return self

    @property
    def port(self) -> int:
        return self._server.port

    def agent_uri(self, task_id: str) -> str:
        return f"http://{self.host}:{self.port}/api/{task_id}"

    def kick(self) -> None:
        self._kick.set()

    async def shutdown(self) -> None:
        """Stop every task (protection or not, as deleting the service does) and wait for them all."""
        self._closing = True
        self.ecs.on_desired_change = None
        for boot in [*self._booting, *self._timers]:
            boot.cancel()
        if self._loop_task is not None:
            # not cancelled: it ends at its next turn (at most half a second). On Python 3.11 a cancel that lands
            # as the kick it waits for is set is swallowed by asyncio.wait_for, and the loop went on forever under
            # frequent kicks (Spot interruptions every 0.3 s: a test's shutdown hung past its 300 s timeout); a
            # cancel during a launch would also leave its process running, unregistered
            self.kick()
            await self._loop_task
        for task in list(self.tasks.values()):
            self._stop(task, "emulator shutting down")
        await asyncio.gather(*(t.child.wait() for t in list(self.tasks.values())), return_exceptions=True)
        await self._server.close()

    # ------------------------------------------------------------------ reconciliation

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), 0.5)
            self._kick.clear()
            try:
                await self.reconcile()
            except Exception as exc:
                self.sink.line("agent", f"reconcile failed: {exc!r}")

    def live(self) -> list[Task]:
        return [t for t in self.tasks.values() if not t.stopping]

    async def reconcile(self) -> None:
        if self._closing:
            return
        desired = self.ecs.desired_count()
        live = self.live()
        self._booting = [b for b in self._booting if not b.done()]
        starting = len(live) + len(self._booting)
        if starting < desired:
            wait = self._not_before - time.monotonic()
            if wait > 0:
                asyncio.get_running_loop().call_later(wait, self.kick)
            elif self.boot_s > 0:
                for _ in range(desired - starting):
                    self._booting.append(asyncio.create_task(self._boot_then_launch()))
            else:
                for _ in range(desired - len(live)):
                    await self._launch()
        elif starting > desired:
            cancel = min(starting - desired, len(self._booting))
            for boot in self._booting[len(self._booting) - cancel:]:  # tasks still starting go first
                boot.cancel()
            self._booting = self._booting[: len(self._booting) - cancel]
            if len(live) > desired:
                self._scale_in(live, len(live) - desired)
        self._publish()

    async def _boot_then_launch(self) -> None:
        """An emulated GPU instance's boot: the task is pending for ``boot_s``, then its worker starts."""
        await asyncio.sleep(self.boot_s)
        if not self._closing:
            await self._launch()
        self.kick()

    def _scale_in(self, live: list[Task], surplus: int) -> None:
        now = time.time()
        candidates = sorted((t for t in live if not t.is_protected(now)), key=lambda t: t.started_at, reverse=True)
        for task in candidates[:surplus]:
            self._stop(task, "scale-in")
        waiting = surplus - min(surplus, len(candidates))
        note = f"{waiting} surplus task(s) protected from scale-in; waiting" if waiting else ""
        if note and note != self._waiting_note:
            self.sink.line("agent", note)
        self._waiting_note = note
        if waiting:
            expiries = [t.protection_expires_at for t in live if t.is_protected(now) and t.protection_expires_at]
            if expiries:
                asyncio.get_running_loop().call_later(max(0.0, min(expiries) - now) + 0.05, self.kick)

    def _publish(self) -> None:
        booting = sum(1 for b in self._booting if not b.done())
        self.ecs.set_counts(running=len(self.live()), pending=booting)

    async def _launch(self) -> Task:
        self.started += 1
        worker_id = f"{self.worker_prefix}-{self.started}"
        used = {t.slot for t in self.tasks.values()}
        slot = next(i for i in range(1, len(used) + 2) if i not in used)
        arn, task_id = self.ecs.run_task()
        env = dict(self.env)
        env["INFERQ_WORKER_ID"] = worker_id
        env["ECS_AGENT_URI"] = self.agent_uri(task_id)
        env["INFERQ_METRICS_PORT"] = str(self.metrics_port_base + slot - 1 if self.metrics_port_base else 0)
        child = Child(worker_id, self.worker_argv, env, self.sink, death_signal=signal.SIGKILL)
        await child.start()
        task = Task(arn, task_id, worker_id, slot, child, started_at=child.started_at)
        self.tasks[task_id] = task  # registered once its process exists: every task in here can be signalled
        self.sink.line("agent", f"started {worker_id} (task {task_id[:8]}, pid {child.pid})")
        self._spawn(self._watch(task))
        if self.interrupt_every_s > 0:
            after_s = self._rng.expovariate(1.0 / self.interrupt_every_s)
            timer = asyncio.create_task(self._interrupt_later(task, after_s))
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)
        if self._closing:
            self._stop(task, "emulator shutting down")
        return task

    def _stop(self, task: Task, reason: str, grace_s: float | None = None) -> None:
        if task.stopping:
            return
        task.stopping = True
        task.stop_reason = reason
        grace = self.stop_timeout_s if grace_s is None else grace_s
        self.sink.line("agent", f"stopping {task.worker_id} ({reason}): SIGTERM, SIGKILL after {grace:g}s")
        self._spawn(task.child.stop(grace))
        self._publish()

    # ------------------------------------------------------------------ Spot interruptions

    def interrupt(self, worker_id: str | None = None, notice_s: float = SPOT_NOTICE_S) -> Task | None:
        """Interrupt a live task as EC2 Spot does (module docstring): ``worker_id``'s, or the longest-running
        one's; None when there is no such task. Its replacement is started at once."""
        live = self.live()
        if worker_id is not None:
            live = [t for t in live if t.worker_id == worker_id]
        if not live:
            return None
        task = min(live, key=lambda t: t.started_at)
        self.interrupted += 1
        self._stop(task, f"Spot interruption, {notice_s:g}s notice", min(self.stop_timeout_s, notice_s))
        self.kick()  # the service is a task short: its replacement starts now
        return task

    async def _interrupt_later(self, task: Task, after_s: float) -> None:
        await asyncio.sleep(after_s)
        if not self._closing and not task.stopping and self.tasks.get(task.id) is task:
            self.interrupt(task.worker_id)

    async def _watch(self, task: Task) -> None:
        code = await task.child.wait()
        self.tasks.pop(task.id, None)
        self.ecs.stop_task(task.arn, task.stop_reason or f"Essential container in task exited ({code})")
        if task.stopping:
            self.sink.line("agent", f"{task.worker_id} stopped (exit {code})")
        else:
            lived = time.monotonic() - task.started_at
            # killed from outside (kill -9, the OOM killer, someone's SIGTERM) is no sign of a crash loop
            failed_fast = code not in (0, -signal.SIGKILL, -signal.SIGTERM) and lived < FAST_FAILURE_S
            self._fast_failures = self._fast_failures + 1 if failed_fast else 0
            over = self._fast_failures - CRASH_LOOP_AFTER
            delay = backoff(over + 1, 0.5, 15.0, jitter=False) if over >= 0 else 0.0
            self._not_before = time.monotonic() + delay
            self.sink.line("agent", f"{task.worker_id} exited on its own (exit {code}); replacing it"
                           + (f" in {delay:g}s (crash loop)" if delay else ""))
        self._publish()
        self.kick()

    def _spawn(self, coro: Any) -> None:
        job = asyncio.create_task(coro)
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ task scale-in protection endpoint

    async def _handle(self, request: Request) -> tuple[int, Any]:
        if request.path == INTERRUPT_PATH:
            return self._handle_interrupt(request)
        match = PROTECTION_PATH.match(request.path)
        if match is None:
            return 404, {"error": {"Code": "NotFound", "Message": f"no such endpoint {request.path}"}}
        task = self.tasks.get(match["task"])
        if task is None:
            return 404, {"error": {"Code": "ResourceNotFoundException", "Message": "unknown task"}}
        if request.method == "GET":
            return 200, {"protection": task.protection()}
        if request.method != "PUT":
            return 405, {"error": {"Arn": task.arn, "Code": "InvalidRequest", "Message": "use GET or PUT"}}
        try:
            body = request.json()
            enabled = body["ProtectionEnabled"]
            minutes = body.get("ExpiresInMinutes", DEFAULT_PROTECTION_MINUTES)
            if not isinstance(enabled, bool):
                raise ValueError("ProtectionEnabled must be a boolean")
            if minutes is None:
                minutes = DEFAULT_PROTECTION_MINUTES
            if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= MAX_PROTECTION_MINUTES:
                raise ValueError(f"ExpiresInMinutes must be an integer from 1 to {MAX_PROTECTION_MINUTES}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            message = str(exc) if isinstance(exc, ValueError) else "body must be {\"ProtectionEnabled\": bool, ...}"
            return 400, {"error": {"Arn": task.arn, "Code": "InvalidParameterException", "Message": message}}
        task.protected = enabled
        task.protection_expires_at = time.time() + minutes * 60 if enabled else None
        if self.log_protection:
            self.sink.line("agent", f"{task.worker_id} scale-in protection {'on' if enabled else 'off'}")
        if not enabled:
            self.kick()  # a surplus task that just went idle can be stopped now
        return 200, {"protection": task.protection()}


    def _handle_interrupt(self, request: Request) -> tuple[int, Any]:
        """``POST /interrupt`` ``{"worker": <id, optional>, "notice_s": <seconds, optional>}``."""
        if request.method != "POST":
            return 405, {"error": {"type": "method_not_allowed", "message": "use POST"}}
        try:
            body = request.json() or {}
            worker = body.get("worker")
            notice = body.get("notice_s", SPOT_NOTICE_S)
            if worker is not None and not isinstance(worker, str):
                raise ValueError("worker must be a worker id (a string)")
            if isinstance(notice, bool) or not isinstance(notice, int | float) or not 0 <= notice <= 3600:
                raise ValueError("notice_s must be a number of seconds from 0 to 3600")
        except (ValueError, AttributeError) as exc:
            message = str(exc) if isinstance(exc, ValueError) else "body must be a JSON object"
            return 400, {"error": {"type": "invalid_request", "message": message}}
        task = self.interrupt(worker, float(notice))
        if task is None:
            which = f"worker {worker}" if worker else "any worker"
            return 404, {"error": {"type": "not_found", "message": f"no live {which} in this fleet"}}
        return 200, {"worker": task.worker_id, "task": task.id, "pid": task.child.pid, "notice_s": notice,
                     "kill_after_s": min(self.stop_timeout_s, float(notice))}


async def start_fleets(
    ecs: MotoEcs, registry: Registry | None, sink: LogSink, env: Mapping[str, str], *, stop_timeout_s: float,
    metrics_port_base: int, log_protection: bool, boot_s: float = 0.0, interrupt_every_s: float = 0.0,
) -> list[EcsAgent]:
    """One agent for the one service, or, with a model registry, one per model's service: its workers get that
    model's entry (``INFERQ_MODEL``), its service name, and metrics ports of their own."""
    if registry is None:
        return [await EcsAgent(ecs, sink, env, stop_timeout_s=stop_timeout_s, metrics_port_base=metrics_port_base,
                               log_protection=log_protection, boot_s=boot_s,
                               interrupt_every_s=interrupt_every_s).start()]
    agents = []
    for i, model in enumerate(registry.models):
        fleet_env = {**env, "INFERQ_MODEL": model.name, "INFERQ_ECS_SERVICE": model.service}
        agents.append(await EcsAgent(
            ecs.fleet(model.service), sink, fleet_env, stop_timeout_s=stop_timeout_s,
            metrics_port_base=metrics_port_base + 100 * i if metrics_port_base else 0,
            log_protection=log_protection, worker_prefix=model.queue, boot_s=boot_s,
            interrupt_every_s=interrupt_every_s,
        ).start())
    return agents
