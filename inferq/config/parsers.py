"""How each ``INFERQ_*`` value is parsed and checked (:mod:`inferq.config.settings` names the parser of each field).

Every parser takes the variable's name and its raw text and returns the value, or raises :class:`SettingsError`
naming the variable. The first line of a parser's docstring is what docs/configuration.md shows it accepts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlparse

from inferq.queue.jobs import Priority
from inferq.queue.keys import TENANT, TENANT_RULE


class SettingsError(ValueError):
    """A configuration variable has a value the process cannot run with."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise SettingsError(name, f"must be an integer, got {raw!r}") from None
        if lo is not None and value < lo:
            raise SettingsError(name, f"must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            raise SettingsError(name, f"must be <= {hi}, got {value}")
        return value

    return parse


def _float(lo: float | None = None) -> Callable[[str, str], float]:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise SettingsError(name, f"must be a number, got {raw!r}") from None
        if value != value or (lo is not None and value < lo):
            raise SettingsError(name, f"must be >= {lo}, got {raw!r}")
        return value

    return parse


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise SettingsError(name, f"must be true or false, got {raw!r}")


def _optional_str(name: str, raw: str) -> str | None:
    return raw.strip() or None


_SECRETS_KEY_RE = re.compile(
    r"^(file:.+|arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/[A-Za-z0-9/_-]+|alias/[A-Za-z0-9/_-]+)$")


def _secrets_key(name: str, raw: str) -> str | None:
    """A KMS key's ARN or alias, or ``file:<path>`` of a local key file; empty: none."""
    value = raw.strip()
    if value and not _SECRETS_KEY_RE.match(value):
        raise SettingsError(name, f"must be a KMS key ARN, alias/<name>, or file:<path>, got {raw!r}")
    return value or None


def _ports(name: str, raw: str) -> tuple[int, ...]:
    """Comma-separated TCP ports 1-65535 (at least one)."""
    ports = []
    for part in (p.strip() for p in raw.split(",")):
        if not part.isdigit() or not 1 <= int(part) <= 65535:
            raise SettingsError(name, f"must be comma-separated ports 1-65535, got {raw!r}")
        ports.append(int(part))
    return tuple(dict.fromkeys(ports))


_HOST_RE = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")


def _hosts(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated DNS names, each exact or ``*.zone`` (any name under the zone); empty: none (no bound)."""
    hosts = []
    for part in (p.strip().lower().rstrip(".") for p in raw.split(",") if p.strip()):
        if len(part) > 253 or not _HOST_RE.match(part):
            raise SettingsError(name, f"must be comma-separated host names (hooks.example.com, *.example.org), got "
                                      f"{part!r}")
        hosts.append(part)
    return tuple(dict.fromkeys(hosts))


def _networks(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated CIDR blocks (IPv4 or IPv6); empty: none."""
    import ipaddress

    networks = []
    for part in (p.strip() for p in raw.split(",") if p.strip()):
        try:
            networks.append(str(ipaddress.ip_network(part, strict=False)))
        except ValueError:
            raise SettingsError(name, f"must be comma-separated CIDR blocks (10.42.0.0/16), got {part!r}") from None
    return tuple(networks)


_QUEUE_RE = re.compile(r"^[^{}\s]{1,128}$")


def _queue(name: str, raw: str) -> str:
    """Any 1-128 characters but braces (the queue is the key's cluster hash tag) and whitespace."""
    value = raw.strip()
    if not _QUEUE_RE.match(value):
        raise SettingsError(name, f"must be 1-128 characters without braces or spaces, got {raw!r}")
    return value


def _redis_url(name: str, raw: str) -> str:
    value = raw.strip()
    parsed = urlparse(value)
    if parsed.scheme not in {"redis", "rediss", "unix"}:
        raise SettingsError(name, f"must be a redis://, rediss:// or unix:// URL, got scheme {parsed.scheme!r}")
    if parsed.scheme != "unix" and not parsed.hostname:
        raise SettingsError(name, "has no host")
    return value


def _http_url(name: str, raw: str) -> str:
    value = raw.strip().rstrip("/")
    parsed = urlparse(value)
    if parsed.scheme not in {"http", "https"} or not parsed.hostname:
        raise SettingsError(name, f"must be an http(s) URL, got {raw!r}")
    return value


def _api_keys(name: str, raw: str) -> dict[str, str] | None:
    """``tenant:key,tenant:key`` -> {key: tenant}. Development only: production keys live in Secrets Manager."""
    value = raw.strip()
    if not value:
        return None
    keys: dict[str, str] = {}
    for pair in value.split(","):
        tenant, sep, key = pair.strip().partition(":")
        if not sep or not tenant or not key:
            raise SettingsError(name, "must be 'tenant:key,tenant:key' (a pair is missing its ':')")
        if not TENANT.match(tenant):
            raise SettingsError(name, f"tenant {tenant!r} must be {TENANT_RULE}")
        keys[key] = tenant
    return keys


def _tenant_priorities(name: str, raw: str) -> dict[str, Priority] | None:
    """`tenant:priority,tenant:priority` (each priority `high`, `normal` or `low`)."""
    priorities: dict[str, Priority] = {}
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        tenant, sep, lane = pair.partition(":")
        if not sep or not TENANT.match(tenant.strip()):
            raise SettingsError(name, f"must be 'tenant:priority,...' with tenants of {TENANT_RULE}, got {pair!r}")
        try:
            priorities[tenant.strip()] = Priority(lane.strip())
        except ValueError:
            raise SettingsError(name, f"priority of {tenant.strip()!r} must be high, normal or low, "
                                f"got {lane.strip()!r}") from None
    return priorities or None


MAX_WEIGHT = 1000.0
"""The largest tenant weight (``INFERQ_TENANT_WEIGHTS``): a thousand to one is already more than a share policy needs,
and it keeps the virtual clock's steps (work over weight) well inside a double's exact range."""


def _tenant_weights(name: str, raw: str) -> dict[str, float] | None:
    """`tenant:weight,tenant:weight` (each weight a number > 0 and <= 1000; empty: unset)."""
    weights: dict[str, float] = {}
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        tenant, sep, value = pair.partition(":")
        if not sep or not TENANT.match(tenant.strip()):
            raise SettingsError(name, f"must be 'tenant:weight,...' with tenants of {TENANT_RULE}, got {pair!r}")
        try:
            weight = float(value.strip())
        except ValueError:
            weight = math.nan
        if not 0 < weight <= MAX_WEIGHT:  # also refuses nan and inf
            raise SettingsError(name, f"weight of {tenant.strip()!r} must be a number > 0 and <= {MAX_WEIGHT:g}, "
                                f"got {value.strip()!r}")
        weights[tenant.strip()] = weight
    return weights or None


def _priority(name: str, raw: str) -> Priority:
    """`high`, `normal` or `low`."""
    try:
        return Priority(raw.strip().lower())
    except ValueError:
        raise SettingsError(name, f"must be high, normal or low, got {raw!r}") from None


def _tenants(name: str, raw: str) -> frozenset[str] | None:
    """Comma-separated tenant names (empty: unset)."""
    tenants = [t.strip() for t in raw.split(",") if t.strip()]
    for tenant in tenants:
        if not TENANT.match(tenant):
            raise SettingsError(name, f"tenant {tenant!r} must be {TENANT_RULE}")
    return frozenset(tenants) or None


@dataclass(frozen=True)
class Budget:
    """A tenant's monthly budget (``INFERQ_TENANT_BUDGETS``): total tokens, estimated dollars, or both."""

    tokens: int | None = None
    usd: float | None = None

    def describe(self) -> str:
        parts = ([f"{self.tokens} tokens"] if self.tokens is not None else []) + \
            ([f"${self.usd:g}"] if self.usd is not None else [])
        return " and ".join(parts)


_BUDGET_RE = re.compile(r"^(?:([0-9]+)\s*tokens|\$?([0-9]+(?:\.[0-9]+)?)\s*usd|\$([0-9]+(?:\.[0-9]+)?))$", re.I)


def _tenant_budgets(name: str, raw: str) -> dict[str, Budget] | None:
    """`tenant:<N>tokens` or `tenant:<N>usd` (also `tenant:$<N>`), comma-separated; a tenant may have one of each."""
    budgets: dict[str, Budget] = {}
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        tenant, sep, amount = (part.strip() for part in pair.partition(":"))
        match = _BUDGET_RE.match(amount)
        if not sep or not TENANT.match(tenant) or match is None:
            raise SettingsError(name, f"must be 'tenant:<N>tokens' or 'tenant:<N>usd' (comma-separated), tenants of "
                                f"{TENANT_RULE}; got {pair!r}")
        tokens, usd, dollars = match.groups()
        budget = budgets.get(tenant, Budget())
        if tokens is not None:
            budget = Budget(int(tokens), budget.usd)
        else:
            budget = Budget(budget.tokens, float(usd if usd is not None else dollars))
        budgets[tenant] = budget
    return budgets or None


AUTO: Literal["auto"] = "auto"
"""``INFERQ_WINDOW=auto``: the worker sizes its window from the model server's load (gpu_worker/window.py)."""


def _window(name: str, raw: str) -> int | Literal["auto"]:
    """integer 1 to 4096, or `auto` (sized from the model server's load, up to `INFERQ_WINDOW_MAX`)."""
    if raw.strip().lower() == AUTO:
        return AUTO
    try:
        return _int(1, 4096)(name, raw)
    except SettingsError:
        raise SettingsError(name, f"must be an integer 1 to 4096 or 'auto', got {raw!r}") from None


def _backend(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in {"mock", "openai", "vllm"}:
        raise SettingsError(name, f"must be one of mock, openai, vllm; got {raw!r}")
    return value


def _log_level(name: str, raw: str) -> str:
    value = raw.strip().upper()
    if value not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise SettingsError(name, f"must be a log level (DEBUG, INFO, WARNING, ERROR), got {raw!r}")
    return value


_WINDOW_RE = re.compile(r"^([1-9][0-9]{0,6})([smh])$")
_WINDOW_UNIT_S = {"s": 1, "m": 60, "h": 3600}


def window_seconds(window: str) -> int | None:
    """Seconds of a batch ``completion_window`` such as ``24h`` (also ``30m``, ``90s``), or None if malformed."""
    match = _WINDOW_RE.match(window)
    return int(match.group(1)) * _WINDOW_UNIT_S[match.group(2)] if match else None


def _windows(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated batch completion windows a client may ask for (``24h`` is OpenAI's only value)."""
    values = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not values:
        raise SettingsError(name, "must name at least one completion window, e.g. 24h")
    for value in values:
        if window_seconds(value) is None:
            raise SettingsError(name, f"{value!r} is not a window like 24h, 30m or 90s")
    return values
