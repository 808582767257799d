"""Every environment variable the stack gives a process is read by that process.

A variable set in a template but read by nobody is a setting the operator believes in and the code ignores
(``JobTimeoutSeconds`` once went to the gateway, which never looks at it, and not to the workers, which do).
For each process (the two Lambda functions as the SAM transform leaves them, and the worker container of the GPU
task) the variables are collected under every condition of the template, and each one must be either

- ``INFERQ_<FIELD>``, a field of :class:`inferq.config.settings.Settings` that the code the process runs refers to: the
  repository modules its entry point imports, transitively, lazy imports included, scanned for ``.field`` and
  ``"field"``; a :class:`Settings` property counts as the fields it reads; or
- a variable of a library the process ships: ``AWS_*`` (boto3), ``POWERTOOLS_*`` (Powertools, when the function's
  requirements include it).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from inferq.config.settings import PREFIX, Settings

from .cfn import FUNCTIONS, ROOT, load

ENTRY_POINTS = {
    "GatewayFunction": "functions.gateway.app",
    "ScalerFunction": "functions.scaler.app",
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
        **{logical_id: function_variables(translated, logical_id) for logical_id in FUNCTIONS},
        "worker": container_variables(gpu["Resources"]["TaskDefinition"], "worker"),
    }


def unread(process: str, variables: set[str]) -> list[str]:
    """The variables of ``variables`` that ``process`` does not read, each with the reason."""
    read = settings_read_by(ENTRY_POINTS[process])
    requirements = ""
    if process in FUNCTIONS:
        requirements = (ROOT / "functions" / FUNCTIONS[process] / "requirements.txt").read_text()
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
