"""Settings: the contract names and defaults of docs/configuration.md, and a clear stop on any bad value."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from inferq.config.settings import Settings, SettingsError


def test_defaults_match_the_design() -> None:
    s = Settings.from_env({})
    assert s.redis_url == "redis://127.0.0.1:6379/0" and s.queue == "default"
    assert (s.claim_idle_ms, s.max_attempts, s.max_deliveries, s.job_timeout_s) == (30000, 3, 5, 600)
    assert (s.max_queue_depth, s.max_body_bytes, s.result_ttl_s, s.window, s.drain_s) == (10000, 262144, 86400, 8, 25)
    assert (s.backend, s.openai_base_url, s.metrics_port) == ("mock", "http://127.0.0.1:8000", 9100)
    assert (s.scale_min, s.scale_max, s.target_per_worker) == (0, 4, 8)
    assert (s.scale_down_cooldown_s, s.scale_to_zero_after_s, s.scaler_interval_s) == (120, 300, 60.0)
    assert s.api_keys is None and s.api_keys_secret is None and s.ecs_cluster is None


class AskedEnvironment(dict[str, str]):
    """An empty environment that notes every variable asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.append(key)
        return default


def test_settings_read_every_field_and_only_through_its_prefixed_variable() -> None:
    env = AskedEnvironment()
    Settings.from_env(env)
    expected = sorted("INFERQ_" + f.name.upper() for f in dataclasses.fields(Settings))
    assert sorted(env.asked) == expected, set(env.asked) ^ set(expected)
    unprefixed = {f.name.upper(): "not a valid value for anything" for f in dataclasses.fields(Settings)}
    assert Settings.from_env(unprefixed) == Settings.from_env({})  # WINDOW, QUEUE, ...: not inferq's


def test_every_variable_is_read_with_its_prefix() -> None:
    s = Settings.from_env({"INFERQ_WINDOW": "32", "INFERQ_QUEUE": "gpu-a", "INFERQ_BACKEND": "OpenAI",
                           "INFERQ_API_KEYS": "acme:k-12345678,b:k-87654321", "INFERQ_SCALE_TARGET_PER_WORKER": "5"})
    assert s.window == 32 and s.queue == "gpu-a" and s.backend == "openai" and s.target_per_worker == 5
    assert s.api_keys == {"k-12345678": "acme", "k-87654321": "b"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("INFERQ_WINDOW", "eight"),
        ("INFERQ_WINDOW", "0"),
        ("INFERQ_MAX_ATTEMPTS", "-1"),
        ("INFERQ_REDIS_URL", "http://localhost"),
        ("INFERQ_QUEUE", "has space"),
        ("INFERQ_QUEUE", "{brace}"),
        ("INFERQ_BACKEND", "tensorrt"),
        ("INFERQ_API_KEYS", "nocolon"),
        ("INFERQ_API_KEYS", "team b:k2"),  # the same tenant rule as the API keys secret (inferq.queue.keys.TENANT)
        ("INFERQ_OPENAI_BASE_URL", "localhost:8000"),
        ("INFERQ_JOB_TIMEOUT_S", "3601"),
        ("INFERQ_SCALER_INTERVAL_S", "nan"),
        ("INFERQ_LOG_PAYLOADS", "maybe"),
        ("INFERQ_SCALE_MIN", "9"),
        ("INFERQ_WEBHOOK_HOSTS", "hooks.example.com,https://x.example"),
        ("INFERQ_WEBHOOK_HOSTS", "*"),
        ("INFERQ_WEBHOOK_HOSTS", "a.*.example"),
        ("INFERQ_WEBHOOK_HOSTS", "10.0.0.1"),
        ("INFERQ_FILE_RECOUNT_S", "5"),
    ],
)
def test_a_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: value})
    assert info.value.variable == name and name in str(info.value)


def test_permissive_where_nothing_breaks() -> None:
    s = Settings.from_env({"INFERQ_API_KEYS": "a:k1,team-b:k2", "INFERQ_MAX_BODY_BYTES": "512",
                           "INFERQ_CLAIM_IDLE_MS": "50", "INFERQ_QUEUE": "gpu:a100"})
    assert s.api_keys == {"k1": "a", "k2": "team-b"} and s.max_body_bytes == 512 and s.claim_idle_ms == 50
    assert s.queue == "gpu:a100"


def test_a_process_with_a_bad_value_stops_at_start_naming_the_variable() -> None:
    code = "from inferq.config.settings import load_or_exit; load_or_exit()"
    proc = subprocess.run([sys.executable, "-c", code], env={"INFERQ_CLAIM_IDLE_MS": "soon"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "INFERQ_CLAIM_IDLE_MS" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------ every variable the code reads


ROOT = Path(__file__).resolve().parents[2]
CODE = ["inferq", "functions", "gpu_worker", "emulator", "docker"]
"""What ships or runs the stack (bench/, scripts/ and tests/ are tools: their variables are their own)."""
FOREIGN = {
    "AWS_ENDPOINT_URL": "boto3's endpoint override (moto under inferq up)",
    "AWS_ENDPOINT_URL_ECS": "boto3's endpoint override for ECS",
    "AWS_ENDPOINT_URL_S3": "boto3's endpoint override for S3",
    "POWERTOOLS_SERVICE_NAME": "Powertools' service name",
    "POWERTOOLS_METRICS_NAMESPACE": "Powertools' metrics namespace",
    "ECS_AGENT_URI": "set by the ECS agent in every task (task scale-in protection)",
    "SSL_CERT_FILE": "OpenSSL's CA bundle (webhook receivers behind a company CA)",
    "SSL_CERT_DIR": "OpenSSL's CA directory",
    "DOCKER_HOST": "Docker's engine address (make sam-local)",
    "NO_COLOR": "the no-color.org convention (inferq up's output)",
    "PATH": "the shell's search path (the private dockerd)",
}
"""Variables of other tools the code reads, with why: every other variable it reads must be ``INFERQ_``."""
INFERQ_NAME = re.compile(r"\bINFERQ_[A-Z0-9_]*[A-Z0-9]\b")


def _constant_strings(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level ``NAME = ("A", "B")``: what a loop over NAME reads."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Tuple, ast.List)):
            values = [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            for target in node.targets:
                if isinstance(target, ast.Name) and len(values) == len(node.value.elts):
                    found[target.id] = values
    return found


def _loop_values(tree: ast.Module, name: str, constants: dict[str, list[str]]) -> list[str] | None:
    for node in ast.walk(tree):
        if (isinstance(node, (ast.comprehension, ast.For)) and isinstance(node.target, ast.Name)
                and node.target.id == name and isinstance(node.iter, ast.Name) and node.iter.id in constants):
            return constants[node.iter.id]
    return None


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def environment_reads(path: Path, root: Path = ROOT) -> tuple[set[str], list[str]]:
    """The variables a module reads from its process's environment (``os.environ.get/[]/in``, ``os.getenv``), and
    the reads whose name this cannot tell (``where: expression``)."""
    tree = ast.parse(path.read_text())
    constants = _constant_strings(tree)
    names: set[str] = set()
    unknown: list[str] = []

    def read(arg: ast.expr, where: ast.AST) -> None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.add(arg.value)
        elif isinstance(arg, ast.Name) and (values := _loop_values(tree, arg.id, constants)) is not None:
            names.update(values)
        else:
            unknown.append(f"{path.relative_to(root).as_posix()}:{getattr(where, 'lineno', 0)}: {ast.unparse(arg)}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            func = node.func
            if (func.attr in ("get", "pop", "setdefault") and _is_environ(func.value)) or (
                func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os"
            ):
                read(node.args[0], node)
        elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            read(node.slice, node)
        elif (isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
              and _is_environ(node.comparators[-1])):
            read(node.left, node)
    return names, unknown


def code_reads() -> tuple[dict[str, str], list[str]]:
    reads: dict[str, str] = {}
    unknown: list[str] = []
    for package in CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            names, cannot_tell = environment_reads(path)
            reads.update({name: str(path.relative_to(ROOT)) for name in names if name not in reads})
            unknown += cannot_tell
    return reads, unknown


def named_inferq_variables() -> dict[str, str]:
    """Every ``INFERQ_*`` name the code, its images and compose files spell out (read, or handed to a child)."""
    found: dict[str, str] = {}
    for package in CODE:
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_file() and (path.suffix in (".py", ".sh", ".yaml", ".yml") or path.name == "Dockerfile"):
                for name in INFERQ_NAME.findall(path.read_text(errors="replace")):
                    found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def test_every_variable_the_code_reads_is_inferq_prefixed_or_another_tools() -> None:
    reads, unknown = code_reads()
    # Settings.from_env reads its fields by a computed name: those are the fields, checked below
    unknown = [u for u in unknown if not u.startswith("inferq/config/settings.py:")]
    assert unknown == [], f"environment reads whose variable this test cannot tell (use a literal name): {unknown}"
    stray = {name: where for name, where in reads.items() if not name.startswith("INFERQ_") and name not in FOREIGN}
    assert stray == {}, f"variables read without the INFERQ_ prefix (rename, or list in FOREIGN with why): {stray}"
    unread = sorted(set(FOREIGN) - set(reads))
    assert unread == [], f"FOREIGN lists variables no code reads any more: {unread}"


def test_every_setting_and_every_inferq_variable_is_documented() -> None:
    documented = set(INFERQ_NAME.findall((ROOT / "docs" / "configuration.md").read_text()))
    fields = {Settings.variable(f.name): "inferq/config/settings.py (Settings)" for f in dataclasses.fields(Settings)}
    assert all(name.startswith("INFERQ_") for name in fields)
    everything = {**named_inferq_variables(), **code_reads()[0], **fields}
    missing = {name: where for name, where in everything.items() if name.startswith("INFERQ_")
               and name not in documented}
    assert missing == {}, f"INFERQ_ variables missing from docs/configuration.md (SETTING_DOCS in " \
                          f"scripts/gen_docs.py, or its list of other variables): {missing}"


def test_the_environment_scan_finds_each_kind_of_read(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "import os\nfrom os import environ\nNAMES = ('C1', 'C2')\n"
        "a = os.environ.get('A')\nb = os.environ['B']\nc = any(os.environ.get(n) for n in NAMES)\n"
        "d = os.getenv('D')\ne = 'E' in os.environ\nf = environ.get('F', '')\ng = os.environ.get(compute())\n"
    )
    names, unknown = environment_reads(module, tmp_path)
    assert names == {"A", "B", "C1", "C2", "D", "E", "F"}
    assert unknown == ["probe.py:10: compute()"]


def test_no_secret_setting_reaches_a_repr() -> None:
    """Settings end up in logs and tracebacks: the API keys, the model server's key, the webhook key and the cache
    credentials never appear in their repr (issue 47, L3)."""
    secrets = {"api_keys": {"tenant": "key-9d1c-secret"}, "openai_api_key": "sk-9d1c-secret",
               "webhook_secret": "whsec_OWQxYy1zZWNyZXQ=", "redis_auth": '{"token": "9d1c-token"}'}
    shown = repr(Settings(**secrets))
    for name, value in secrets.items():
        assert re.search(rf"\b{name}=", shown) is None, name
        assert str(value) not in shown
    hidden = {f.name for f in dataclasses.fields(Settings) if not f.repr}
    assert hidden >= set(secrets)
