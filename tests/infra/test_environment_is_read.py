"""Every environment variable the stack gives a process is read by that process, and the other way round: every
setting a deployed process reads is set by the template, the same for every process that reads it, or has a
default that is right for production.

A variable set in a template but read by nobody is a setting the operator believes in and the code ignores
(``JobTimeoutSeconds`` once went to the gateway, which never looks at it, and not to the workers, which do).
For each process (the Lambda functions as the SAM transform leaves them, and the worker container of the GPU
task) the variables are collected under every condition of the template, and each one must be either

- ``INFERQ_<FIELD>``, a field of :class:`inferq.config.settings.Settings` that the code the process runs refers to: the
  repository modules its entry point imports, transitively, lazy imports included, scanned for ``.field`` and
  ``"field"``; a :class:`Settings` property counts as the fields it reads; or
- a variable of a library the process ships: ``AWS_*`` (boto3), ``POWERTOOLS_*`` (Powertools, when the function's
  requirements include it).

The other way round (a setting the template forgets is a limit the operator set that a process ignores: the scaler,
whose batch driver enqueues lines, once ran without the tenant's depth, the queue's depth and the body bound the
gateway had), for each process, each setting its code refers to is

- given to it by the template, with the same value as to every other process that reads it (one parameter, one
  limit: a batch line and a submit are admitted alike);
- or in :data:`PRODUCTION_DEFAULTS`, with why its default is the right value in a deployment;
- or in :data:`NOT_RUN`, with why the process never runs the code that names it.

And every tenant bound (G11, :data:`TENANT_BOUNDS`) a process reads is non-zero at the deployed defaults.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from inferq.config.settings import PREFIX, Settings

from .cfn import LAMBDAS, ROOT, load

ENTRY_POINTS = {
    "GatewayFunction": "functions.gateway.app",
    "ScalerFunction": "functions.scaler.app",
    "AuthorizerFunction": "functions.authorizer.app",
    "worker": "gpu_worker.__main__",
}
REPOSITORY_PACKAGES = ("inferq", "functions", "gpu_worker")
FIELDS = set(Settings.__dataclass_fields__)


# --- what the code reads ---


def module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(name: str, tree: ast.AST) -> set[str]:
    """Repository modules one module imports, anywhere in its body (imports inside functions are lazy, not
    absent), with the packages that hold them."""
    path = module_file(name)
    package = name if path is not None and path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    closure = set()
    for module in found:
        if module.split(".")[0] not in REPOSITORY_PACKAGES:
            continue
        parts = module.split(".")
        closure.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {m for m in closure if module_file(m) is not None}


@cache
def parsed(name: str) -> ast.Module:
    path = module_file(name)
    assert path is not None, name
    return ast.parse(path.read_text(), filename=str(path))


def import_closure(entry: str) -> set[str]:
    seen: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(_imports(name, parsed(name)) - seen)
    return seen


def _names_used(tree: ast.AST) -> set[str]:
    """Attribute names and string constants: ``settings.window`` and ``getattr(settings, "ecs_cluster")``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


def _settings_properties() -> dict[str, set[str]]:
    """Each property or method of Settings -> the fields it reads (``target_per_worker`` reads the target and the
    window; ``is_operator(tenant)`` reads ``admin_tenants``)."""
    settings_class = next(
        n for n in parsed("inferq.config.settings").body if isinstance(n, ast.ClassDef) and n.name == "Settings"
    )
    props = [
        item for item in settings_class.body
        if isinstance(item, ast.FunctionDef) and not item.name.startswith("__")
        and not any(getattr(d, "id", None) in ("classmethod", "staticmethod") for d in item.decorator_list)
    ]
    names = {item.name for item in props}
    reads = {item.name: _names_used(item) & (FIELDS | names) for item in props}
    changed = True
    while changed:  # a property that reads another property reads that one's fields too (target -> window_limit)
        changed = False
        for used in reads.values():
            more = set().union(*(reads[other] for other in used & names)) - used
            if more:
                used |= more
                changed = True
    return {prop: used & FIELDS for prop, used in reads.items()}


def settings_read_by(entry: str) -> set[str]:
    """The Settings fields the code of a process refers to. settings.py itself is left out: its validation names
    every field, which proves nothing about a process."""
    used: set[str] = set()
    for name in import_closure(entry) - {"inferq.config.settings"}:
        used |= _names_used(parsed(name))
    for prop, fields in _settings_properties().items():
        if prop in used:
            used |= fields
    return used & FIELDS


# --- what the templates set ---


def _branches(node: Any) -> list[Any]:
    """A value as every condition may leave it (both sides of each Fn::If, AWS::NoValue dropped)."""
    if isinstance(node, dict) and "Fn::If" in node:
        return [v for branch in node["Fn::If"][1:] for v in _branches(branch)]
    if node == {"Ref": "AWS::NoValue"}:
        return []
    return [node]


def function_variables(translated: dict[str, Any], logical_id: str) -> set[str]:
    environment = translated["Resources"][logical_id]["Properties"]["Environment"]
    return {name for variables in _branches(environment["Variables"]) for name in variables}


def container_variables(task: dict[str, Any], container: str) -> set[str]:
    definition = next(c for c in task["Properties"]["ContainerDefinitions"] if c["Name"] == container)
    names = set()
    for key in ("Environment", "Secrets"):  # an ECS secret arrives as an environment variable too
        for entries in _branches(definition.get(key, [])):
            for entry in entries if isinstance(entries, list) else [entries]:
                for concrete in _branches(entry):
                    names.add(concrete["Name"])
    return names


def process_variables(translated: dict[str, Any]) -> dict[str, set[str]]:
    gpu = load(ROOT / "infra" / "gpu.yaml")
    return {
        **{logical_id: function_variables(translated, logical_id) for logical_id in LAMBDAS},
        "worker": container_variables(gpu["Resources"]["TaskDefinition"], "worker"),
    }


def unread(process: str, variables: set[str]) -> list[str]:
    """The variables of ``variables`` that ``process`` does not read, each with the reason."""
    read = settings_read_by(ENTRY_POINTS[process])
    requirements = ""
    if process in LAMBDAS:
        requirements = (ROOT / "functions" / LAMBDAS[process] / "requirements.txt").read_text()
    problems = []
    for name in sorted(variables):
        if name.startswith(PREFIX):
            field = name.removeprefix(PREFIX).lower()
            if field not in FIELDS:
                problems.append(f"{name}: not a setting (Settings has no field {field!r})")
            elif field not in read:
                problems.append(f"{name}: {process} never reads settings.{field}")
        elif name.startswith("POWERTOOLS_"):
            if "aws-lambda-powertools" not in requirements:
                problems.append(f"{name}: {process} does not ship Powertools")
        elif not name.startswith("AWS_"):
            problems.append(f"{name}: neither a setting nor a variable of a library the process ships")
    return problems


# --- the tests ---


@pytest.mark.parametrize("process", list(ENTRY_POINTS))
def test_every_variable_a_process_is_given_is_read_by_it(translated: dict[str, Any], process: str) -> None:
    variables = process_variables(translated)[process]
    assert variables, f"no environment found for {process}"
    assert unread(process, variables) == []


def test_the_reading_check_tells_a_process_that_reads_a_setting_from_one_that_does_not() -> None:
    """The analysis itself: the worker reads its drain time, the gateway does not. (The original bug was the job
    timeout given to the gateway; the gateway now refers to it, as a field a model registry may set.)"""
    assert "drain_s" in settings_read_by(ENTRY_POINTS["worker"])
    assert unread("GatewayFunction", {"INFERQ_DRAIN_S"}) == [
        "INFERQ_DRAIN_S: GatewayFunction never reads settings.drain_s"
    ]
    assert unread("worker", {"INFERQ_JOB_TIMEOUT_S", "AWS_REGION"}) == []
    assert unread("worker", {"POWERTOOLS_SERVICE_NAME", "INFERQ_NO_SUCH_THING"}) == [
        "INFERQ_NO_SUCH_THING: not a setting (Settings has no field 'no_such_thing')",
        "POWERTOOLS_SERVICE_NAME: worker does not ship Powertools",
    ]
    # lazy imports count: the scaler sends webhooks through a module it imports inside a function
    assert "inferq.webhooks.sender" in import_closure(ENTRY_POINTS["ScalerFunction"])
    assert "webhook_max_age_s" in settings_read_by(ENTRY_POINTS["ScalerFunction"])
    # a property counts as the fields it reads
    assert "scale_target_per_worker" in settings_read_by(ENTRY_POINTS["ScalerFunction"])


# --- the other way round: what a process reads, the template sets (or its default is right for production) ---

PRODUCTION_DEFAULTS: dict[str, str] = {
    "fair_share": "on: G10, fair share inside each lane; off is for comparisons (the bench's first come, first served)",
    "api_keys_cache_s": "5 minutes between reads of the keys secret: a revoked key stops within that",
    "api_keys_max_stale_s": "15 minutes of serving the last keys read while Secrets Manager fails, then fail closed",
    "batch_completion_windows": "24h, the one window OpenAI's Batch API has",
    "batch_max_lines": "50,000 lines, OpenAI's bound on a batch",
    "claim_idle_ms": "30 s without a lease renewal (renewed every few seconds) before another worker reclaims",
    "file_recount_s": "an hour between recounts of a tenant's files from S3: the lifecycle rule deletes by the day, "
    "and a recount is one LIST per 1,000 files",
    "events_maxlen": "100,000 terminal events kept per queue, a day of a busy queue within the result TTL",
    "inline_max_bytes": "64 KiB inline in a job record; larger bodies and results go to the files bucket",
    "log_payloads": "prompts and outputs are not logged",
    "max_attempts": "3 attempts of a retryable failure",
    "max_deliveries": "5 deliveries that never finished before a job that crashes workers is dead-lettered",
    "max_file_bytes": "200 MB per file, OpenAI's bound",
    "max_upload_bytes": "4 MiB per request of the Files API: under Lambda's 6 MB request bound",
    "metrics_port": "9100, the worker's Prometheus port inside its task",
    "model": "none: the template deploys one queue (a model registry's stacks set it: scripts/gen_model_stacks.py)",
    "models": "none: one queue, INFERQ_QUEUE (a model registry's stacks set it)",
    "openai_api_key": "the vLLM sidecar on localhost takes no key",
    "output_flush_ms": "a watched job's output written 500 ms after its first piece, then at doubling intervals",
    "output_flush_max_ms": "the intervals between writes of output end at 2.5 s (docs/benchmarks.md, ST: its Valkey "
                           "cost within twice an unstreamed job's)",
    "output_flush_tokens": "no early write by tokens: the interval alone bounds a streamed job's writes",
    "redis_max_connections": "1,000 connections per process, far above what one process holds",
    "redis_timeout_s": "2 s socket timeout: a frozen cache is a prompt 503, a failover's pause is waited out",
    "result_ttl_s": "a day of results (docs/operations.md: the per-tenant memory bound is computed with it)",
    "retry_base_ms": "1 s base of the retry backoff",
    "retry_max_ms": "60 s cap of the retry backoff",
    "scale_boot_s": "2 minutes for a GPU instance and its model server to start",
    "scale_drain": "surplus workers drain instead of being stopped mid-job",
    "scale_gather_s": "no gathering delay before scaling up from zero",
    "scaler_wake_url": "none: the gateway wakes the scaler by invoking it (INFERQ_SCALER_FUNCTION)",
    "tenant_priorities": "none: every tenant's jobs are normal unless an operator lists it",
    "vllm_model": "none: the worker talks to the vLLM sidecar (INFERQ_BACKEND=openai), no in-process engine",
    "webhook_allow_private": "false: webhooks go to public addresses only",
    "webhook_max_age_s": "an hour of webhook retries",
    "window_max": "64 jobs at most per worker with INFERQ_WINDOW=auto",
    "worker_id": "none: each worker names itself from its host and process",
}
"""Settings a deployed process reads that the template leaves at their default, and why that default is right."""

_PRODUCER = "only the producer side (submit, redrive) reads it: a worker submits nothing"
NOT_RUN_PACKAGES: dict[str, tuple[tuple[str, ...], str]] = {
    "AuthorizerFunction": (("inferq.queue", "inferq.redis", "inferq.usage"),
                           "the authorizer never opens the cache (no URL, no token, outside the VPC): these packages "
                           "come with the gateway's key store it imports, and it runs none of their code"),
}
"""A process's packages whose settings it never reads: it imports them and runs none of their code."""

NOT_RUN: dict[tuple[str, str], str] = {
    ("worker", "max_queue_depth"): _PRODUCER,
    ("worker", "tenant_max_depth"): _PRODUCER,
    ("worker", "scale_tokens_per_s"): _PRODUCER + " (the expected tokens are written at submit)",
    ("worker", "tenant_weights"): _PRODUCER + " (a job's weight is written at submit, and its retries keep it)",
    ("GatewayFunction", "webhook_secret"): "the gateway signs no webhook (the scaler delivers them)",
    **{("worker", name): "INFERQ_WORKER_WEBHOOKS=false: the GPU task has no route to the internet, so its worker "
       "delivers no webhook (the scaler does)" for name in ("webhook_secret", "webhook_secrets_key",
                                                             "webhook_blocked_networks", "webhook_ports",
                                                             "webhook_hosts")},
    ("GatewayFunction", "output_max_bytes"): "the gateway reads a job's output, never appends to it (the worker does)",
    **{(process, name): "only a worker's retry of a job the engine died under counts engine deaths"
       for process in ("GatewayFunction", "ScalerFunction")
       for name in ("engine_strikes", "engine_strike_window_s", "engine_cooloff_s")},
    ("worker", "tenant_max_retained_bytes"): _PRODUCER,
}
"""(process, setting): the process's code names the setting, but the process never runs that code."""

ALTERNATIVES = ({"redis_auth", "redis_auth_secret"}, {"webhook_secret", "webhook_secret_id"})
"""Settings of which a process is given one: the Lambdas a secret's ARN, the worker the value (an ECS secret)."""

PER_PROCESS = {"redis_auth_secret", "log_level"}
"""Given to several processes with a value of each one's own: each role its cache user's secret; the worker's log
level is the container's."""

TENANT_BOUNDS = ("max_queue_depth", "tenant_max_depth", "tenant_max_files", "tenant_max_file_bytes",
                 "tenant_max_batches", "tenant_max_waits", "rate_limit_per_s", "max_body_bytes",
                 "tenant_max_retained_bytes", "engine_strikes",
                 "output_max_bytes")
"""What one tenant can make the deployment hold or spend (G11): non-zero wherever read, at the deployed defaults."""

REGISTRY_NAMES = "inferq.config.registry"
"""The model registry's loader names every per-model setting (a registry entry may set them) without reading the
process's own: a process without INFERQ_MODELS, which the template deploys, reads none of them there."""


def settings_used_by(process: str) -> set[str]:
    """:func:`settings_read_by` less the registry's names (see :data:`REGISTRY_NAMES`) and the packages the process
    never runs (:data:`NOT_RUN_PACKAGES`)."""
    skipped = NOT_RUN_PACKAGES.get(process, ((), ""))[0]
    used: set[str] = set()
    for name in import_closure(ENTRY_POINTS[process]) - {"inferq.config.settings", REGISTRY_NAMES}:
        if not any(name == package or name.startswith(package + ".") for package in skipped):
            used |= _names_used(parsed(name))
    for prop, fields in _settings_properties().items():
        if prop in used:
            used |= fields
    return used & FIELDS


def given_values(translated: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """process -> setting -> its value as the root template writes it (a worker's nested-stack parameter resolved
    to what the root stack passes it)."""
    gpu_parameters = translated["Resources"]["Gpu"]["Properties"]["Parameters"]
    values: dict[str, dict[str, Any]] = {}
    for logical_id in LAMBDAS:
        environment = translated["Resources"][logical_id]["Properties"]["Environment"]["Variables"]
        values[logical_id] = {name.removeprefix(PREFIX).lower(): value for name, value in environment.items()
                              if name.startswith(PREFIX)}
    gpu = load(ROOT / "infra" / "gpu.yaml")
    definition = next(c for c in gpu["Resources"]["TaskDefinition"]["Properties"]["ContainerDefinitions"]
                      if c["Name"] == "worker")
    worker: dict[str, Any] = {}
    for entries in _branches(definition.get("Environment", [])):
        for entry in entries if isinstance(entries, list) else [entries]:
            for concrete in _branches(entry):
                value = concrete.get("Value")
                if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"] in gpu_parameters:
                    value = gpu_parameters[value["Ref"]]
                worker[concrete["Name"].removeprefix(PREFIX).lower()] = value
    for name in container_variables(gpu["Resources"]["TaskDefinition"], "worker"):
        worker.setdefault(name.removeprefix(PREFIX).lower(), "(an ECS secret)")
    values["worker"] = worker
    return values


def covered(process: str, setting: str, given: dict[str, Any]) -> bool:
    if setting in given or (process, setting) in NOT_RUN:
        return True
    return any(setting in pair and pair & set(given) for pair in ALTERNATIVES)


@pytest.mark.parametrize("process", list(ENTRY_POINTS))
def test_every_setting_a_process_reads_is_set_by_the_template_or_has_a_production_default(
    translated: dict[str, Any], process: str
) -> None:
    given = given_values(translated)[process]
    missing = sorted(s for s in settings_used_by(process) if not covered(process, s, given)
                     and s not in PRODUCTION_DEFAULTS)
    assert missing == [], (
        f"{process} reads {missing} and the template sets none of them: set each in template.yaml, or add it to "
        "PRODUCTION_DEFAULTS with why its default is right in a deployment (or to NOT_RUN with why the process "
        "never runs the code that names it)")


def test_a_setting_the_template_gives_one_process_every_process_that_reads_it_gets_with_the_same_value(
    translated: dict[str, Any]
) -> None:
    values = given_values(translated)
    wrong = []
    for setting in sorted({s for given in values.values() for s in given} - PER_PROCESS):
        holders = {process: given[setting] for process, given in values.items() if setting in given}
        for process in ENTRY_POINTS:
            if setting not in settings_used_by(process) or (process, setting) in NOT_RUN:
                continue
            if process not in holders:
                if not any(setting in pair and pair & set(values[process]) for pair in ALTERNATIVES):
                    wrong.append(f"{process} reads {setting} but is not given it (given to {sorted(holders)})")
            elif any(value != holders[process] for value in holders.values()):
                wrong.append(f"{setting} differs between processes: {holders}")
    assert wrong == []


def test_every_tenant_bound_is_non_zero_at_the_deployed_defaults(
    translated: dict[str, Any], source: dict[str, Any]
) -> None:
    parameters = source["Parameters"]
    values = given_values(translated)
    defaults = {f.name: f.default for f in Settings.__dataclass_fields__.values()}
    checked = 0
    for process in ENTRY_POINTS:
        for bound in TENANT_BOUNDS:
            if bound not in settings_used_by(process) or (process, bound) in NOT_RUN:
                continue
            checked += 1
            value = values[process].get(bound)
            if value is None:
                assert defaults[bound], f"{process}: {bound} is not set and its default is 0 (no bound)"
            else:
                assert isinstance(value, dict) and set(value) == {"Ref"}, (process, bound, value)
                assert int(parameters[value["Ref"]]["Default"]) > 0, f"{process}: {bound} defaults to 0 (no bound)"
    assert checked >= len(TENANT_BOUNDS)


def test_the_lists_of_the_other_way_round_name_real_settings_each_still_needed() -> None:
    assert set(PRODUCTION_DEFAULTS) <= FIELDS and set(TENANT_BOUNDS) <= FIELDS
    used_anywhere = set().union(*(settings_used_by(p) for p in ENTRY_POINTS))
    assert sorted(set(PRODUCTION_DEFAULTS) - used_anywhere) == [], "no deployed process reads these any more"
    assert sorted(k for k in NOT_RUN if k[1] not in settings_used_by(k[0])) == [], "no longer named: drop them"
    for process, (packages, _) in NOT_RUN_PACKAGES.items():
        closure = import_closure(ENTRY_POINTS[process])
        assert all(any(m.startswith(p + ".") for m in closure) for p in packages), (process, packages)
    # the scaler's batch driver admits lines under the gateway's limits (the bug this test was written for)
    assert {"tenant_max_depth", "max_queue_depth", "max_body_bytes"} <= settings_used_by("ScalerFunction")
