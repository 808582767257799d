"""ECS and CloudWatch for the emulator: moto in server mode, run inside the supervisor.

In-process on purpose: the agent reads the service's desired count straight from moto's backend (no polling over
HTTP), hears of every ``UpdateService`` the moment it happens, and writes back the real ``runningCount`` and
``pendingCount`` — moto alone reports ``runningCount == desiredCount`` as soon as the desired count changes, which
would hide a scale-up still in progress from the scaler.

With a model registry there is one service per model (:meth:`MotoEcs.fleet` gives each agent its own view).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

ACCOUNT = "123456789012"
REGION = "us-east-1"
FAMILY = "inferq-worker"
CONTAINER = "worker"


@dataclass(frozen=True)
class Names:
    cluster: str = "inferq"
    service: str = "inferq-workers"


class MotoEcs:
    """A moto server on ``host:port`` with the worker cluster, task definition and service (desired count 0)."""

    def __init__(self, names: Names, *, host: str = "127.0.0.1", port: int = 0, stop_timeout_s: int = 30,
                 services: Sequence[str] = ()) -> None:
        self.names = names
        self.services = list(services) or [names.service]
        """Every service of the cluster: ``names.service``, or one per model of a registry."""
        self.host = host
        self.port = port
        self.stop_timeout_s = stop_timeout_s
        self._server: Any = None
        self._backend: Any = None
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[int, int]] = {name: (0, 0) for name in self.services}
        self._listeners: dict[str, Callable[[int], None]] = {}

    @property
    def on_desired_change(self) -> Callable[[int], None] | None:
        """Called (on moto's request thread) when the first service's desired count changes."""
        return self._listeners.get(self.services[0])

    @on_desired_change.setter
    def on_desired_change(self, listener: Callable[[int], None] | None) -> None:
        self.listen(self.services[0], listener)

    def listen(self, service: str, listener: Callable[[int], None] | None) -> None:
        if listener is None:
            self._listeners.pop(service, None)
        else:
            self._listeners[service] = listener

    def fleet(self, service: str) -> ServiceView:
        """One service's view, the interface an :class:`~emulator.agent.EcsAgent` drives."""
        return ServiceView(self, service)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> MotoEcs:
        """Blocking (about two seconds of imports on a small machine): call it from a thread."""
        from moto.ecs.models import ecs_backends
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access line per scaler call drowns the log

        self._server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self._server.start()
        self.port = int(self._server.get_host_and_port()[1])
        backend = ecs_backends[ACCOUNT][REGION]
        backend.create_cluster(cluster_name=self.names.cluster)
        backend.register_task_definition(
            family=FAMILY,
            container_definitions=[{
                "name": CONTAINER, "image": "inferq-worker:local", "essential": True, "memory": 1024,
                "stopTimeout": self.stop_timeout_s, "command": ["python", "-m", "gpu_worker"],
            }],
            volumes=[],
            requires_compatibilities=["EC2"],
        )
        for service in self.services:
            backend.create_service(self.names.cluster, service, 0, task_definition_str=FAMILY)
        self._backend = backend
        self._hook_update_service(backend)
        for service in self.services:
            self._write_counts(service)
        return self

    def _hook_update_service(self, backend: Any) -> None:
        original = backend.update_service

        def update_service(service_properties: dict[str, Any]) -> Any:
            service = original(service_properties)
            if service.name in self._counts:
                self._write_counts(service.name)
                listener = self._listeners.get(service.name)
                if listener is not None:
                    listener(int(service.desired_count))
            return service

        backend.update_service = update_service

    def _service(self, name: str | None = None) -> Any:
        return self._backend.services[f"{self.names.cluster}:{name or self.services[0]}"]

    def desired_count(self, service: str | None = None) -> int:
        if self._backend is None:
            return 0
        return int(self._service(service).desired_count)

    def set_counts(self, running: int, pending: int, service: str | None = None) -> None:
        """The agent's truth, shown by ``DescribeServices`` (service and primary deployment)."""
        name = service or self.services[0]
        with self._lock:
            self._counts[name] = (running, pending)
        self._write_counts(name)

    def _write_counts(self, name: str) -> None:
        if self._backend is None:
            return
        with self._lock:
            running, pending = self._counts[name]
        service = self._service(name)
        service.running_count = running
        service.pending_count = pending
        for deployment in service.deployments[:1]:
            deployment["runningCount"] = running
            deployment["pendingCount"] = pending
            deployment["desiredCount"] = int(service.desired_count)
            deployment["rolloutState"] = "COMPLETED" if running == service.desired_count else "IN_PROGRESS"

    def run_task(self, service: str | None = None) -> tuple[str, str]:
        """Record a task of the service in moto (``ListTasks``/``DescribeTasks`` show it); returns (arn, id)."""
        name = service or self.services[0]
        tasks = self._backend.run_task(
            self.names.cluster, FAMILY, 1, None, f"ecs-svc/{name}", None, "FARGATE", group=f"service:{name}",
        )
        arn = str(tasks[0].task_arn)
        return arn, arn.rsplit("/", 1)[-1]

    def stop_task(self, arn: str, reason: str) -> None:
        with contextlib.suppress(Exception):  # bookkeeping only: a task moto forgot must not break the agent
            self._backend.stop_task(self.names.cluster, arn, reason)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._backend is not None:
            # moto's backends are process-wide: leave no hook and no service behind for other users of moto
            self._backend.__dict__.pop("update_service", None)
            for service in self.services:
                self._backend.services.pop(f"{self.names.cluster}:{service}", None)
            self._backend = None


class ServiceView:
    """One service of a :class:`MotoEcs`, with the methods an agent uses (its fleet's desired count and tasks)."""

    def __init__(self, ecs: MotoEcs, service: str) -> None:
        self.ecs = ecs
        self.service = service

    @property
    def on_desired_change(self) -> Callable[[int], None] | None:
        return self.ecs._listeners.get(self.service)

    @on_desired_change.setter
    def on_desired_change(self, listener: Callable[[int], None] | None) -> None:
        self.ecs.listen(self.service, listener)

    def desired_count(self) -> int:
        return self.ecs.desired_count(self.service)

    def set_counts(self, running: int, pending: int) -> None:
        self.ecs.set_counts(running, pending, self.service)

    def run_task(self) -> tuple[str, str]:
        return self.ecs.run_task(self.service)

    def stop_task(self, arn: str, reason: str) -> None:
        self.ecs.stop_task(arn, reason)
