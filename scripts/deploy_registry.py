"""The model registry (INFERQ_MODELS) as the AWS deployment needs it: names, queues, services, scaling maximum,
backend and the ``deploy`` section.

The file is checked by the processes' own loader (:func:`inferq.config.registry.parse`, against the default settings),
so a registry the stack is generated from is one every process accepts, with the same defaults (queue, service);
the generator hands the processes the registry with those defaults written out, so the stack and the processes
cannot disagree on a name. What is kept here is only what the stack needs beyond the loader: the raw entry, and
the stack's own default backend (a vLLM sidecar when none is named).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from inferq.config import registry
from inferq.config.settings import Settings, SettingsError


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


def load(path: Path) -> Registry:
    """Read and check a registry file (.yaml, .yml or .json)."""
    text = path.read_text()
    document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    try:
        resolved = registry.parse(document, Settings.from_env({}), str(path))
    except SettingsError as exc:
        raise RegistryError(str(exc).removeprefix(f"{exc.variable}: ")) from None
    models = []
    for model, entry in zip(resolved.models, document["models"], strict=True):
        scale = entry.get("scale") or {}
        models.append(Model(model.name, model.queue, model.service, entry, dict(entry.get("backend") or {}),
                            dict(model.deploy), model.settings.scale_max if "max" in scale else None))
    return Registry(path, document, models)
