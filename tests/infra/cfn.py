"""Reading the deployment's templates in tests: the paths, the SAM tools, and a small evaluator for the intrinsic
functions that decide a function's environment and its IAM statements."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cfnlint.decode import cfn_yaml

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
NESTED = {name: ROOT / "infra" / f"{name}.yaml" for name in ("network", "cache", "gpu", "observability")}
SAM_VENV = ROOT / ".tools" / "sam"
FUNCTIONS = {"GatewayFunction": "gateway", "ScalerFunction": "scaler"}
"""The functions that are clients of the queue: in the VPC, with the cache's URL and their own cache user."""
AUTHORIZER = {"AuthorizerFunction": "authorizer"}
"""The HTTP API's key check: outside the VPC, no cache, Secrets Manager only."""
LAMBDAS = {**FUNCTIONS, **AUTHORIZER}
READ_ONLY_VERBS = ("Get", "Describe", "List", "BatchGet")
NO_VALUE = object()


def load(path: Path) -> dict[str, Any]:
    """A template as plain JSON data (intrinsics in their long form, ``{"Fn::If": [...]}``)."""
    return json.loads(json.dumps(cfn_yaml.load(str(path))))


def sam_env() -> dict[str, str]:
    return {**os.environ, "SAM_CLI_TELEMETRY": "0", "AWS_DEFAULT_REGION": "us-east-1"}


def run(
    command: list[str], *, cwd: Path = ROOT, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run a tool; a failure shows its whole output in the test report."""
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"{' '.join(map(str, command))} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    return result


def make(*targets: str, env: Mapping[str, str] | None = None) -> str:
    return run(["make", "--no-print-directory", "-s", "-f", "mk/sam.mk", *targets], env=env).stdout.strip()


def lambda_python() -> str | None:
    """The python3.13 that mk/sam.mk compiles bytecode with, if this machine has one."""
    return make("print-lambda-python") or None


def host_platform() -> str:
    """The manylinux platform whose wheels load on this machine (for importing an artifact here)."""
    return "manylinux2014_aarch64" if platform.machine().lower() in ("aarch64", "arm64") else "manylinux2014_x86_64"


@dataclass(frozen=True)
class Resolver:
    """Evaluates a template's parameters, conditions and the intrinsics that pick values, with every parameter at
    its default unless overridden. A reference to a resource stays symbolic: its logical id, or ``Res.Attr``;
    ``attributes`` gives concrete stand-ins where the reader needs one (a URL that must parse, a bucket's name for
    ``Ref``, its ARN for ``Res.Arn``)."""

    template: Mapping[str, Any]
    overrides: Mapping[str, str] | None = None
    attributes: Mapping[str, str] | None = None

    def parameter(self, name: str) -> str:
        if self.overrides and name in self.overrides:
            return self.overrides[name]
        pseudo = {
            "AWS::Region": "us-east-1",
            "AWS::AccountId": "123456789012",
            "AWS::Partition": "aws",
            "AWS::StackName": "inferq",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/inferq/0a1b2c3d-4e5f-6789-abcd-0123",
        }
        if name in pseudo:
            return pseudo[name]
        default = self.template["Parameters"][name].get("Default")
        assert default is not None, f"parameter {name} has no default"
        return ",".join(map(str, default)) if isinstance(default, list) else str(default)

    def _substitute(self, name: str) -> Any:
        """``${Name}`` in Fn::Sub: a parameter (or pseudo parameter), a resource, or ``Resource.Attribute``."""
        if "." in name:
            return self.value({"Fn::GetAtt": name})
        return self.value({"Ref": name})

    def condition(self, name: str) -> bool:
        return bool(self.value(self.template["Conditions"][name]))

    def value(self, node: Any) -> Any:
        if isinstance(node, list):
            return [v for v in (self.value(item) for item in node) if v is not NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) != 1 or not next(iter(node)).startswith(("Fn::", "Ref", "Condition")):
            return {k: v for k, v in ((k, self.value(v)) for k, v in node.items()) if v is not NO_VALUE}
        ((function, args),) = node.items()
        if function == "Ref":
            if args == "AWS::NoValue":
                return NO_VALUE
            if args in self.template.get("Parameters", {}):
                kind = str(self.template["Parameters"][args].get("Type", ""))
                value = self.parameter(args)
                return value.split(",") if kind.startswith(("CommaDelimitedList", "List<")) else value
            if args.startswith("AWS::"):
                return self.parameter(args)
            return (self.attributes or {}).get(args, args)
        if function == "Fn::GetAtt":
            name = ".".join(args) if isinstance(args, list) else args
            return (self.attributes or {}).get(name, name)
        if function == "Fn::If":
            condition, if_true, if_false = args
            return self.value(if_true if self.condition(condition) else if_false)
        if function == "Condition":
            return self.condition(args)
        if function == "Fn::Equals":
            left, right = (str(self.value(a)) for a in args)
            return left == right
        if function == "Fn::Not":
            return not self.value(args[0])
        if function == "Fn::And":
            return all(self.value(a) for a in args)
        if function == "Fn::Or":
            return any(self.value(a) for a in args)
        if function == "Fn::Contains":  # Rules only
            items, item = args
            return str(self.value(item)) in [str(v) for v in self.value(items)]
        if function == "Fn::Join":
            separator, items = args
            return separator.join(str(v) for v in self.value(items))
        if function == "Fn::Split":
            separator, text = args
            return str(self.value(text)).split(separator)
        if function == "Fn::Select":
            index, items = args
            return self.value(items)[int(self.value(index))]
        if function == "Fn::FindInMap":
            name, top, second = (str(self.value(a)) for a in args)
            return self.template["Mappings"][name][top][second]
        if function == "Fn::Sub" and isinstance(args, str):
            return re.sub(r"\$\{([^}!]+)\}", lambda m: str(self._substitute(m.group(1))), args)
        if function == "Fn::Sub":
            text, variables = args
            local = {k: self.value(v) for k, v in variables.items()}

            def substitute(name: str) -> str:
                return str(local[name]) if name in local else str(self._substitute(name))

            return re.sub(r"\$\{([^}!]+)\}", lambda m: substitute(m.group(1)), text)
        raise NotImplementedError(f"{function} in {node}")


def statements(policy_document: Any) -> Iterator[dict[str, Any]]:
    """Every statement a policy may hold: both branches of a conditional one."""
    body = policy_document.get("Statement", [])
    for statement in body if isinstance(body, list) else [body]:
        if isinstance(statement, dict) and "Fn::If" in statement:
            for branch in statement["Fn::If"][1:]:
                if branch != {"Ref": "AWS::NoValue"}:
                    yield branch
        else:
            yield statement


def role_statements(template: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(role logical id, statement) for every inline policy of every role in a template."""
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] != "AWS::IAM::Role":
            continue
        policies = resource["Properties"].get("Policies", [])
        if isinstance(policies, dict) and "Fn::If" in policies:
            policies = [p for branch in policies["Fn::If"][1:] if isinstance(branch, list) for p in branch]
        for entry in policies:
            # a policy of its own under a condition ({"Fn::If": [cond, policy, NoValue]}): each branch
            branches = entry["Fn::If"][1:] if isinstance(entry, dict) and "Fn::If" in entry else [entry]
            for policy in branches:
                if policy == {"Ref": "AWS::NoValue"}:
                    continue
                for statement in statements(policy["PolicyDocument"]):
                    yield logical_id, statement


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
