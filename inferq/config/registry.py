"""The model registry (``INFERQ_MODELS``, docs/models.md): several models, each with its own queue, fleet and limits.

One ``.yaml``/``.yml`` or ``.json`` file names every model. Each entry yields that model's :class:`Settings` (the
process's ``INFERQ_*`` settings with the entry's overrides) and so its queue and keys. The gateway and the scaler
read every entry; a worker serves one (``INFERQ_MODEL``). Everything is checked when the file is read: a bad file or
field raises :class:`SettingsError` naming ``INFERQ_MODELS``, the model and the field, so the process stops at start.

Job ids of a registry's queues carry their queue (``job_<26 random chars>_<queue>``, see :func:`queue_of_job`), so
the gateway finds any job's queue without a lookup.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from inferq.config.settings import Settings, SettingsError
from inferq.queue.keys import Keys
from inferq.usage.prices import gpu_hour_usd

VARIABLE = "INFERQ_MODELS"
MODEL_VARIABLE = "INFERQ_MODEL"

NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
QUEUE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SERVICE_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
ALIAS_RE = re.compile(r"^[!-~]{1,256}$")
"""An alias is what clients send as ``body.model``: any printable ASCII without spaces (``org/model:tag``)."""

JOB_ID_BODY = 4 + 26
"""``job_`` and the 26 random characters; a registry's ids go on with ``_<queue>``."""

_TOP_FIELDS = {"default", "models"}
_MODEL_FIELDS = {"name", "aliases", "queue", "service", "window", "window_max", "job_timeout_s", "max_attempts",
                 "max_queue_depth", "gpu_hour_usd", "scale", "backend", "deploy", "multimodal"}
_PLAIN_OVERRIDES = ("window", "window_max", "job_timeout_s", "max_attempts", "max_queue_depth", "gpu_hour_usd")
_SCALE_FIELDS = {"min": "scale_min", "max": "scale_max", "target_per_worker": "scale_target_per_worker",
                 "down_cooldown_s": "scale_down_cooldown_s", "to_zero_after_s": "scale_to_zero_after_s",
                 "spot_fallback_s": "scale_spot_fallback_s"}
_BACKEND_FIELDS = {"kind", "base_url", "served_model", "args"}
_DEPLOY_FIELDS = {"instance_type": str, "image": str, "gpus": int, "memory_mib": int}
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
"""``deploy.image``: pinned by digest, as the stack's own images are (a tag can be moved under a task)."""
MODEL_RE = re.compile(r"^[A-Za-z0-9/][A-Za-z0-9._/:-]{0,255}$")
"""What the engine loads or serves the model as (``backend.args.model``, ``backend.served_model``): a repository id or
a path in the image; it reaches the GPU instances' user data (a root shell script), so no quote, space or ``$``."""
RESERVED_ARGS = {
    "host": "the engine listens on loopback only (the worker beside it is its one client)",
    "port": "the worker calls the engine on port 8000",
    "uds": "the engine listens on loopback TCP",
    "served_model_name": "backend.served_model names it",
    "api_key": "the engine is reached by the worker alone, over loopback",
    "enable_log_requests": "prompts never reach the logs",
    "enable_log_outputs": "outputs never reach the logs",
    "max_log_len": "prompts never reach the logs",
    "disable_uvicorn_access_log": "the engine's access log stays off",
    "log_config_file": "the engine's logging is the deployment's (a config could log prompts)",
    "allowed_local_media_path": "the engine reads no file a request names",
    "allowed_media_domains": "the engine fetches no address a request names",
    "middleware": "imports code into the engine's server",
    "tool_parser_plugin": "imports code into the engine's server",
    "ssl_keyfile": "the engine listens on loopback TCP",
    "ssl_certfile": "the engine listens on loopback TCP",
}
"""vLLM arguments a registry may not set: each would undo a guarantee of the deployment (DEPLOY.md)."""
_SPOT_FIELDS = {"spot", "spot_instance_types", "on_demand_base"}
"""The model's GPU capacity in AWS (scripts/gen_model_stacks.py): ``spot`` (default true: Spot with on-demand
stand-ins, as the stack's SpotCapacity allows), ``spot_instance_types`` (1-6 types of its GPU class; default its
``instance_type`` alone when it names one, else the stack's SpotInstanceTypes), ``on_demand_base`` (tasks kept on
on-demand, default 0)."""
INSTANCE_TYPE_RE = re.compile(r"^[a-z0-9]+\.[a-z0-9]+$")


@dataclass(frozen=True)
class Model:
    """One registry entry, resolved: its settings are the process's with this model's overrides."""

    name: str
    aliases: tuple[str, ...]
    queue: str
    service: str
    settings: Settings
    served_model: str
    backend_args: Mapping[str, Any] = field(default_factory=dict)
    deploy: Mapping[str, Any] = field(default_factory=dict)
    multimodal: bool = False
    """The model takes images (``image_url`` content parts); every other model takes text only."""

    @property
    def keys(self) -> Keys:
        return Keys(self.queue)


@dataclass(frozen=True)
class Registry:
    path: str
    models: tuple[Model, ...]
    default: str | None = None
    _names: Mapping[str, Model] = field(default_factory=dict, repr=False)

    def resolve(self, requested: str | None) -> Model | None:
        """The model a ``body.model`` names (a name or an alias); absent: the default model, if there is one."""
        if requested is None:
            return self._names.get(self.default) if self.default else None
        return self._names.get(requested)

    def by_queue(self, queue: str) -> Model | None:
        return next((m for m in self.models if m.queue == queue), None)

    @cached_property
    def created(self) -> int:
        """When the registry file was last written (Unix seconds, read once): OpenAI's ``created`` of its models."""
        return int(os.path.getmtime(self.path))

    def multimodal(self, requested: Any) -> bool:
        """Whether the model a ``body.model`` names takes images (an unknown name: no)."""
        model = self.resolve(requested) if requested is None or isinstance(requested, str) else None
        return model is not None and model.multimodal

    @property
    def primary(self) -> Model:
        """The default model, or the first: the queue of what is not per model (files, batches, the console)."""
        return self.resolve(None) or self.models[0]


def queue_of_job(job_id: str) -> str | None:
    """The queue a registry job id carries (``job_<26>_<queue>``); None for an id of the single queue."""
    if len(job_id) > JOB_ID_BODY + 1 and job_id[JOB_ID_BODY] == "_":
        return job_id[JOB_ID_BODY + 1:]
    return None


class _Where:
    """Builds the messages: every problem names INFERQ_MODELS, the file, the model and the field."""

    def __init__(self, path: str) -> None:
        self.path = path

    def error(self, where: str, problem: str) -> SettingsError:
        return SettingsError(VARIABLE, f"{self.path}: {where}: {problem}")


def _read(path: str) -> Any:
    where = _Where(path)
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(VARIABLE, f"cannot read {path!r}: {exc.strerror or exc}") from None
    suffix = file.suffix.lower()
    if suffix not in {".yaml", ".yml", ".json"}:
        raise SettingsError(VARIABLE, f"{path!r} must end in .yaml, .yml or .json")
    try:
        if suffix == ".json":
            return json.loads(text)
        import yaml  # only a process with a YAML registry pays for the import

        return yaml.safe_load(text)
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError (not a ValueError), PyYAML missing
        raise where.error("file", f"not valid {'JSON' if suffix == '.json' else 'YAML'}: {exc}") from None


def _override(where: _Where, label: str, setting: str, raw: Any) -> Any:
    """A value of the file checked by the same parser as its INFERQ_* variable."""
    if isinstance(raw, (bool, dict, list)) or raw is None:
        raise where.error(label, f"must be a scalar, got {raw!r}")
    parse = next(f.metadata["parse"] for f in fields(Settings) if f.name == setting)
    try:
        return parse(label, str(raw))
    except SettingsError as exc:
        raise where.error(label, str(exc).split(": ", 1)[1]) from None


def _mapping(where: _Where, label: str, raw: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise where.error(label, f"must be a mapping, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise where.error(label, f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")
    return raw


def _check_spot(where: _Where, at: str, deploy: Mapping[str, Any]) -> None:
    if "spot" in deploy and not isinstance(deploy["spot"], bool):
        raise where.error(f"{at} deploy.spot", "must be true or false")
    types = deploy.get("spot_instance_types")
    if types is not None and (not isinstance(types, list) or not 1 <= len(types) <= 6 or not all(
            isinstance(t, str) and INSTANCE_TYPE_RE.match(t) for t in types)):
        raise where.error(f"{at} deploy.spot_instance_types", "must be a list of 1 to 6 instance types (g5.xlarge)")
    base = deploy.get("on_demand_base")
    if base is not None and (not isinstance(base, int) or isinstance(base, bool) or base < 0):
        raise where.error(f"{at} deploy.on_demand_base", "must be an integer >= 0")


def _model(where: _Where, index: int, raw: Any, base: Settings) -> Model:
    entry = _mapping(where, f"models[{index}]", raw, _MODEL_FIELDS)
    name = entry.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise where.error(f"models[{index}].name", f"must be 1-64 of [A-Za-z0-9_.:-], got {name!r}")
    at = f"model {name!r}"
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and ALIAS_RE.match(a) for a in aliases):
        raise where.error(f"{at} aliases", "must be a list of names (printable, no spaces, at most 256)")
    queue = entry.get("queue", re.sub(r"[^A-Za-z0-9_-]", "-", name))
    if not isinstance(queue, str) or not QUEUE_RE.match(queue):
        raise where.error(f"{at} queue", f"must be 1-64 of [A-Za-z0-9_-], got {queue!r}")
    service = entry.get("service", f"inferq-{queue}")
    if not isinstance(service, str) or not SERVICE_RE.match(service):
        raise where.error(f"{at} service", f"must be an ECS service name (1-255 of [A-Za-z0-9_-]), got {service!r}")

    overrides: dict[str, Any] = {"queue": queue, "ecs_service": service}
    for key in _PLAIN_OVERRIDES:
        if key in entry:
            overrides[key] = _override(where, f"{at} {key}", key, entry[key])
    scale = _mapping(where, f"{at} scale", entry.get("scale", {}), set(_SCALE_FIELDS))
    for key, setting in _SCALE_FIELDS.items():
        if key in scale:
            overrides[setting] = _override(where, f"{at} scale.{key}", setting, scale[key])
    backend = _mapping(where, f"{at} backend", entry.get("backend", {}), _BACKEND_FIELDS)
    if "kind" in backend:
        overrides["backend"] = _override(where, f"{at} backend.kind", "backend", backend["kind"])
    if "base_url" in backend:
        overrides["openai_base_url"] = _override(where, f"{at} backend.base_url", "openai_base_url",
                                                 backend["base_url"])
    served_model = backend.get("served_model", name)
    if not isinstance(served_model, str) or not served_model:
        raise where.error(f"{at} backend.served_model", f"must be a non-empty string, got {served_model!r}")
    args = backend.get("args", {})
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise where.error(f"{at} backend.args", "must be a mapping of argument name to value")
    for key in args:
        reserved = RESERVED_ARGS.get(key.lstrip("-").replace("-", "_"))
        if reserved:
            raise where.error(f"{at} backend.args.{key}", f"may not be set here: {reserved}")
    given = (("backend.served_model", backend.get("served_model")), ("backend.args.model", args.get("model")))
    for label, value in given:
        if value is not None and (not isinstance(value, str) or not MODEL_RE.match(value)):
            raise where.error(f"{at} {label}", "must be a repository id or a path (letters, digits, . _ / : -)")
    deploy = _mapping(where, f"{at} deploy", entry.get("deploy", {}), set(_DEPLOY_FIELDS) | _SPOT_FIELDS)
    for key, kind in _DEPLOY_FIELDS.items():
        value = deploy.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)
                                  or (isinstance(value, int) and value < 1)):
            raise where.error(f"{at} deploy.{key}", f"must be {'a positive integer' if kind is int else 'a string'}")
    if deploy.get("image") is not None and not IMAGE_RE.match(deploy["image"]):
        raise where.error(f"{at} deploy.image", "must be pinned by digest, REPOSITORY@sha256:<64 hex>")
    _check_spot(where, at, deploy)
    listed = gpu_hour_usd(deploy.get("instance_type", ""))
    if "gpu_hour_usd" not in entry and listed is not None:  # its instance type's on-demand price per GPU-hour
        overrides["gpu_hour_usd"] = listed
    multimodal = entry.get("multimodal", False)
    if not isinstance(multimodal, bool):
        raise where.error(f"{at} multimodal", "must be true or false")
    try:
        settings = base.replace(**overrides)
    except SettingsError as exc:  # a combination (scale.min above scale.max, ...) checked by Settings itself
        raise where.error(at, str(exc)) from None
    return Model(name, tuple(aliases), queue, service, settings, served_model, dict(args), dict(deploy), multimodal)


def parse(raw: Any, base: Settings, path: str) -> Registry:
    """A registry from the file's decoded content; raises :class:`SettingsError` naming INFERQ_MODELS."""
    where = _Where(path)
    top = _mapping(where, "top level", raw, _TOP_FIELDS)
    entries = top.get("models")
    if not isinstance(entries, list) or not entries:
        raise where.error("models", "must be a non-empty list of models")
    models = tuple(_model(where, i, entry, base) for i, entry in enumerate(entries))
    names: dict[str, Model] = {}
    for model in models:
        for name in (model.name, *model.aliases):
            if name in names:
                raise where.error(f"model {model.name!r}", f"name or alias {name!r} is already used")
            names[name] = model
    for attribute in ("queue", "service"):
        seen: set[str] = set()
        for model in models:
            value = getattr(model, attribute)
            if value in seen:
                raise where.error(f"model {model.name!r} {attribute}", f"{value!r} is already another model's")
            seen.add(value)
    default = top.get("default")
    if default is not None and (not isinstance(default, str) or default not in names):
        raise where.error("default", f"must name a model of the file, got {default!r}")
    return Registry(path, models, default, names)


def load(settings: Settings) -> Registry | None:
    """The registry ``INFERQ_MODELS`` names, or None when it is unset (one queue, ``INFERQ_QUEUE``)."""
    if not settings.models:
        return None
    return parse(_read(settings.models), settings, settings.models)


def served_model(settings: Settings) -> Model | None:
    """The registry entry a worker serves: the one ``INFERQ_MODEL`` names (required when the file has more than
    one model); None without a registry."""
    registry = load(settings)
    if registry is None:
        return None
    names = ", ".join(m.name for m in registry.models)
    if settings.model is None:
        if len(registry.models) > 1:
            raise SettingsError(MODEL_VARIABLE, f"must name the model this worker serves, one of {names}")
        return registry.models[0]
    model = next((m for m in registry.models if m.name == settings.model), None)
    if model is None:
        raise SettingsError(MODEL_VARIABLE, f"{settings.model!r} is not a model of {registry.path} ({names})")
    return model

