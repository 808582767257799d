"""An evaluator of the IAM policy grammar, for the policies the templates write (tests/infra/test_iam_flows.py).

moto enforces IAM only in part: it matches actions and, for S3 alone, resources, and it cannot evaluate a
``Condition`` (it reads condition keys from nothing, and a statement whose condition fails *denies*). This module
decides what AWS decides for a request context, following "Policy evaluation logic" of the IAM User Guide:

- an explicit ``Deny`` in any applicable policy wins; else an ``Allow`` of the identity policies (or of the
  resource's own policy, same account) allows; else the request is implicitly denied;
- ``Action``/``NotAction``: ``service:Operation`` patterns with ``*`` and ``?``, case-insensitive;
- ``Resource``/``NotResource``: ARN patterns with ``*`` and ``?``, compared segment by segment (a wildcard never
  spans the colons of ``arn:partition:service:region:account``; in the resource part it matches anything);
- ``Condition``: every operator's keys must all match (AND), any of a key's values may (OR); the operators are
  :data:`OPERATORS`, each with ``...IfExists``, and ``Null``. An operator outside that table, a set operator
  (``ForAnyValue:``/``ForAllValues:``) or a policy variable raises :class:`Unsupported` instead of guessing: a
  template that starts using one extends this module first.

Resource-based policies: an S3 bucket policy and a KMS key policy apply as AWS applies them within one account
(a key policy must allow the call itself or delegate to IAM through the account's root principal).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any


class Unsupported(Exception):
    """The policy uses grammar this evaluator does not implement (it never guesses)."""


@dataclass(frozen=True)
class Request:
    """One authorization AWS makes for an API call: the action, the resource ARN, the request context keys."""

    action: str
    resource: str
    context: Mapping[str, str | Sequence[str]] = field(default_factory=dict)

    def __str__(self) -> str:
        keys = ", ".join(f"{k}={v}" for k, v in sorted(self.context.items()))
        return f"{self.action} on {self.resource}" + (f" [{keys}]" if keys else "")


@dataclass(frozen=True)
class Grant:
    """One action pattern of one statement on one resource pattern: the unit a flow uses or leaves unused."""

    policy: str
    statement: int
    action: str
    resource: str

    def __str__(self) -> str:
        return f"{self.policy} statement {self.statement}: {self.action} on {self.resource}"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    grants: tuple[Grant, ...] = ()
    """The grants of Allow statements that matched (what the request used)."""


@dataclass(frozen=True)
class Policy:
    """A policy document's statements, named (``GatewayFunction``, ``FilesBucketPolicy``) for reports."""

    name: str
    statements: tuple[Mapping[str, Any], ...]

    @classmethod
    def of(cls, name: str, document: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> Policy:
        if isinstance(document, Mapping):
            body = document.get("Statement", [])
            statements = body if isinstance(body, list) else [body]
        else:
            statements = [s for d in document for s in _as_list(d.get("Statement", []))]
        for statement in statements:
            _check_grammar(statement)
        return cls(name, tuple(statements))

    def grants(self) -> list[Grant]:
        """Every (action pattern, resource pattern) an Allow statement of this policy grants."""
        out = []
        for index, statement in enumerate(self.statements):
            if statement.get("Effect") != "Allow":
                continue
            for action in _as_list(statement.get("Action", [])):
                for resource in _as_list(statement.get("Resource", ["*"])):
                    out.append(Grant(self.name, index, action, resource))
        return out


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


_KNOWN_ELEMENTS = {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition", "Principal",
                   "NotPrincipal"}


def _check_grammar(statement: Mapping[str, Any]) -> None:
    unknown = set(statement) - _KNOWN_ELEMENTS
    if unknown:
        raise Unsupported(f"statement elements {sorted(unknown)}")
    if statement.get("Effect") not in ("Allow", "Deny"):
        raise Unsupported(f"Effect {statement.get('Effect')!r}")
    if "NotPrincipal" in statement:
        raise Unsupported("NotPrincipal")
    for element in ("Action", "NotAction", "Resource", "NotResource"):
        for value in _as_list(statement.get(element, [])):
            if not isinstance(value, str):
                raise Unsupported(f"{element} value {value!r} (an unresolved intrinsic?)")
            if "${" in value:
                raise Unsupported(f"policy variable in {value!r}")
    for operator, keys in (statement.get("Condition") or {}).items():
        _operator(operator)
        for values in keys.values():
            for value in _as_list(values):
                if not isinstance(value, str | bool | int):
                    raise Unsupported(f"condition value {value!r} (an unresolved intrinsic?)")


# ---------------------------------------------------------------------- matching


@cache
def _wildcard(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    """``*`` (any run) and ``?`` (one character), everything else literal."""
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def like(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    return _wildcard(pattern, ignore_case).fullmatch(value) is not None


def action_matches(pattern: str, action: str) -> bool:
    return like(pattern, action, ignore_case=True)


def arn_matches(pattern: str, arn: str) -> bool:
    """An ARN pattern: ``*`` alone matches everything; otherwise the five colon-separated segments are matched each
    on its own, then the resource part (which may hold colons) as a whole."""
    if pattern == "*":
        return True
    want, got = pattern.split(":", 5), arn.split(":", 5)
    if len(want) != 6 or len(got) != 6:
        return False
    return all(like(w, g) for w, g in zip(want, got, strict=True))


# ---------------------------------------------------------------------- conditions

def _string_equals(want: str, got: str) -> bool:
    return want == got


def _string_equals_ignore_case(want: str, got: str) -> bool:
    return want.lower() == got.lower()


def _string_like(want: str, got: str) -> bool:
    return like(want, got)


def _bool(want: str, got: str) -> bool:
    return want.lower() == got.lower()


def _numeric(compare: Any) -> Any:
    def check(want: str, got: str) -> bool:
        return bool(compare(float(got), float(want)))

    return check


OPERATORS = {
    "StringEquals": (_string_equals, False),
    "StringNotEquals": (_string_equals, True),
    "StringEqualsIgnoreCase": (_string_equals_ignore_case, False),
    "StringLike": (_string_like, False),
    "StringNotLike": (_string_like, True),
    "ArnEquals": (arn_matches, False),
    "ArnLike": (arn_matches, False),
    "ArnNotEquals": (arn_matches, True),
    "ArnNotLike": (arn_matches, True),
    "Bool": (_bool, False),
    "NumericEquals": (_numeric(lambda got, want: got == want), False),
    "NumericLessThan": (_numeric(lambda got, want: got < want), False),
    "NumericLessThanEquals": (_numeric(lambda got, want: got <= want), False),
    "NumericGreaterThan": (_numeric(lambda got, want: got > want), False),
    "NumericGreaterThanEquals": (_numeric(lambda got, want: got >= want), False),
}
"""Operator -> (does one policy value match one request value, negated). ``ArnEquals`` and ``ArnLike`` both take
wildcards, as AWS documents."""


def _operator(name: str) -> tuple[Any, bool, bool]:
    """(compare, negated, if_exists) of an operator name; :class:`Unsupported` for one not implemented."""
    if name.startswith(("ForAnyValue:", "ForAllValues:")):
        raise Unsupported(f"set operator {name}")
    if name == "Null":
        return None, False, False
    base, if_exists = (name[:-8], True) if name.endswith("IfExists") else (name, False)
    if base not in OPERATORS:
        raise Unsupported(f"condition operator {name}")
    compare, negated = OPERATORS[base]
    return compare, negated, if_exists


def conditions_hold(condition: Mapping[str, Mapping[str, Any]] | None, context: Mapping[str, Any]) -> bool:
    """Whether a statement's ``Condition`` holds for the request context (keys are case-insensitive)."""
    if not condition:
        return True
    lowered = {k.lower(): v for k, v in context.items()}
    for operator, keys in condition.items():
        compare, negated, if_exists = _operator(operator)
        for key, wanted in keys.items():
            present = key.lower() in lowered
            if operator == "Null":  # "true": the key must be absent; "false": present
                if any(str(w).lower() == ("false" if present else "true") for w in _as_list(wanted)):
                    continue
                return False
            if not present:
                if if_exists:
                    continue
                if negated:
                    raise Unsupported(f"{operator} on {key}, absent from the request (AWS's answer differs by key)")
                return False
            got = lowered[key.lower()]
            if not isinstance(got, str):
                raise Unsupported(f"multi-valued key {key} without a set operator")
            matched = any(compare(str(w) if not isinstance(w, bool) else str(w).lower(), got)
                          for w in _as_list(wanted))
            if matched == negated:
                return False
    return True


# ---------------------------------------------------------------------- evaluation


def _applies(statement: Mapping[str, Any], request: Request) -> bool:
    if "Action" in statement:
        if not any(action_matches(a, request.action) for a in _as_list(statement["Action"])):
            return False
    elif any(action_matches(a, request.action) for a in _as_list(statement["NotAction"])):
        return False
    if "Resource" in statement:
        if not any(arn_matches(r, request.resource) for r in _as_list(statement["Resource"])):
            return False
    elif "NotResource" in statement and any(
            arn_matches(r, request.resource) for r in _as_list(statement["NotResource"])):
        return False
    return conditions_hold(statement.get("Condition"), request.context)


def _principal_matches(statement: Mapping[str, Any], principals: Iterable[str]) -> bool:
    principal = statement.get("Principal")
    if principal is None:
        raise Unsupported("a resource policy statement without Principal")
    if principal == "*":
        return True
    given = set(principals)
    return any(p == "*" or p in given for kind in ("AWS", "Service") for p in _as_list(principal.get(kind, [])))


def _matching(policy: Policy, request: Request, principals: Iterable[str] | None = None) -> tuple[list[Grant], bool]:
    """(grants of the Allow statements that apply, whether a Deny statement applies)."""
    allows, denied = [], False
    for index, statement in enumerate(policy.statements):
        if principals is not None and not _principal_matches(statement, principals):
            continue
        if not _applies(statement, request):
            continue
        if statement["Effect"] == "Deny":
            denied = True
            continue
        for action in _as_list(statement.get("Action", ["*"])):
            if not action_matches(action, request.action):
                continue
            for resource in _as_list(statement.get("Resource", ["*"])):
                if arn_matches(resource, request.resource):
                    allows.append(Grant(policy.name, index, action, resource))
    return allows, denied


def evaluate(request: Request, identity: Sequence[Policy], *, principal: str, account_root: str,
             resource_policy: Policy | None = None, key_policy: bool = False) -> Decision:
    """AWS's decision for ``request`` made by ``principal`` (a role ARN) whose identity policies are ``identity``.

    ``resource_policy``: the resource's own policy (a bucket policy; with ``key_policy``, a KMS key policy, which
    must itself allow the call or grant the account's root, ``account_root``, to let IAM decide)."""
    grants: list[Grant] = []
    denied = False
    for policy in identity:
        allows, deny = _matching(policy, request)
        grants += allows
        denied = denied or deny
    resource_allows: list[Grant] = []
    if resource_policy is not None:
        resource_allows, deny = _matching(resource_policy, request, principals=[principal])
        denied = denied or deny
    if denied:
        return Decision(False, "explicitly denied")
    if key_policy and resource_policy is not None:
        delegated, _ = _matching(resource_policy, request, principals=[account_root])
        if resource_allows:
            return Decision(True, "allowed by the key policy", tuple(grants))
        if delegated and grants:
            return Decision(True, "allowed (the key policy delegates to IAM)", tuple(grants))
        return Decision(False, "neither the key policy nor IAM (through the key policy) allows it")
    if grants or resource_allows:
        return Decision(True, "allowed", tuple(grants))
    return Decision(False, "no statement allows it (implicit deny)")
