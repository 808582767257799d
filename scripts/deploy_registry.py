"""The model registry (INFERQ_MODELS) as the AWS deployment needs it: names, queues, services, scaling maximum,
backend and the ``deploy`` section, with the same defaults the processes apply.

A small standalone reader so that ``scripts/gen_model_stacks.py`` needs nothing but the file; the processes read
the registry with their own loader, and the generator hands them the registry with the defaults it resolved here
(queue, service) written out, so the stack and the processes cannot disagree on a name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
QUEUE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # as template.yaml's QueueName; it goes into alarm queries
SERVICE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
BACKEND_KINDS = ("mock", "openai", "vllm")


class RegistryError(ValueError):
    """A registry the deployment cannot be generated from; the message names the file and the field."""


@dataclass(frozen=True)
class Model:
    name: str
    queue: str
    service: str
    entry: dict[str, Any]  # the registry entry as written, for the processes
    backend: dict[str, Any] = field(default_factory=dict)
    deploy: dict[str, Any] = field(default_factory=dict)
    scale_max: int | None = None

    @property
    def sidecar(self) -> bool:
        """A vLLM server in the task beside the worker: a ``vllm`` backend, or none named (the stack's default).
        An ``openai`` backend calls a server elsewhere, ``mock`` none at all."""
        return self.backend.get("kind", "vllm") == "vllm"

    @property
    def served_model(self) -> str:
        return str(self.backend.get("served_model") or self.name)


@dataclass(frozen=True)
class Registry:
    source: Path
    document: dict[str, Any]
    models: list[Model]


def default_queue(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", name)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RegistryError(f"{where}: must be a mapping")
    return value


def _positive_int(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RegistryError(f"{where}: must be an integer >= {minimum}, got {value!r}")
    return value


def _model(raw: Any, index: int, source: Path) -> Model:
    where = f"{source}: models[{index}]"
    entry = _mapping(raw, where)
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise RegistryError(f"{where}.name: must match {NAME.pattern}, got {name!r}")
    where = f"{source}: model {name!r}"
    queue = str(entry.get("queue") or default_queue(name))
    if not QUEUE.match(queue):
        raise RegistryError(f"{where}.queue: must match {QUEUE.pattern}, got {queue!r}")
    service = str(entry.get("service") or f"inferq-{queue}")
    if not SERVICE.match(service):
        raise RegistryError(f"{where}: service {service!r} is not an ECS service name ({SERVICE.pattern})")
    backend = _mapping(entry.get("backend"), f"{where}.backend")
    if backend.get("kind", "vllm") not in BACKEND_KINDS:
        raise RegistryError(f"{where}.backend.kind: must be one of {', '.join(BACKEND_KINDS)}")
    _mapping(backend.get("args"), f"{where}.backend.args")
    deploy = _mapping(entry.get("deploy"), f"{where}.deploy")
    for key in ("gpus", "memory_mib"):
        if key in deploy:
            _positive_int(deploy[key], f"{where}.deploy.{key}")
    for key in ("instance_type", "image"):
        if key in deploy and not (isinstance(deploy[key], str) and deploy[key]):
            raise RegistryError(f"{where}.deploy.{key}: must be a non-empty string")
    scale = _mapping(entry.get("scale"), f"{where}.scale")
    scale_max = _positive_int(scale["max"], f"{where}.scale.max", 0) if "max" in scale else None
    return Model(name, queue, service, entry, backend, deploy, scale_max)


def load(path: Path) -> Registry:
    """Read and check a registry file (.yaml, .yml or .json)."""
    text = path.read_text()
    document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    document = _mapping(document, str(path))
    raw = document.get("models")
    if not isinstance(raw, list) or not raw:
        raise RegistryError(f"{path}: models: must be a non-empty list")
    models = [_model(entry, i, path) for i, entry in enumerate(raw)]
    for attribute in ("name", "queue", "service"):
        seen: set[str] = set()
        for model in models:
            value = getattr(model, attribute)
            if value in seen:
                raise RegistryError(f"{path}: two models share the {attribute} {value!r}")
            seen.add(value)
    return Registry(path, document, models)
