"""``make sam-local``'s build (:mod:`emulator.samlocal`): ``sam build`` of the repository's template for this
machine's architecture, cached by a hash of its inputs, and what only the local copy of the built template says
(this machine's architecture, ``AWS_ENDPOINT_URL`` on every function, a short scaler timeout)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from .samdocker import say

ROOT = Path(__file__).resolve().parents[1]
SAM = ROOT / ".tools" / "sam" / "bin" / "sam"
LOCAL_SCALER_TIMEOUT_S = 10
"""The local scaler's timeout (AWS: 60 s). Every invocation, a wake-up too, drives the batches until its time is
nearly over, so a `sam local invoke` lasts about its timeout; 10 s keeps a manual invoke short."""


def patch_built_template(path: Path, architecture: str) -> None:
    """What only the local copy says: this machine's architecture, ``AWS_ENDPOINT_URL`` declared on every function
    (``sam local`` sets only variables the template declares; empty unless the env-vars file gives it), and a short
    scaler timeout (LOCAL_SCALER_TIMEOUT_S)."""
    template = yaml.safe_load(path.read_text())
    function_globals = template.get("Globals", {}).get("Function", {})
    if "Architectures" in function_globals:
        function_globals["Architectures"] = [architecture]
    functions = [name for name, resource in template["Resources"].items()
                 if resource.get("Type") == "AWS::Serverless::Function"]
    for name in functions:
        properties = template["Resources"][name]["Properties"]
        if "Architectures" in properties:
            properties["Architectures"] = [architecture]
        if name == "ScalerFunction":
            properties["Timeout"] = LOCAL_SCALER_TIMEOUT_S
        variables = properties.setdefault("Environment", {}).setdefault("Variables", {})
        variables.setdefault("AWS_ENDPOINT_URL", "")
        for scope in (variables, function_globals.get("Environment", {}).get("Variables", {})):
            for variable in [k for k, v in scope.items() if leaves_out(v)]:
                del scope[variable]
    path.write_text(yaml.safe_dump(template, sort_keys=False))


def leaves_out(value: Any) -> bool:
    """``!If [condition, value, !Ref AWS::NoValue]``: a variable the deployed function may not have at all. ``sam
    local`` would give it an empty string, which is not "unset" (an empty number fails the settings), so the local
    template leaves it out, as a deployment with the parameters' defaults does."""
    branches = value.get("Fn::If") if isinstance(value, dict) else None
    return isinstance(branches, list) and len(branches) == 3 and branches[2] == {"Ref": "AWS::NoValue"}


def lambda_architecture() -> tuple[str, str]:
    """(the template's architecture name, pip's platform) of this machine: what its engine runs without qemu."""
    import platform

    if platform.machine().lower() in ("aarch64", "arm64"):
        return "arm64", "manylinux2014_aarch64"
    return "x86_64", "manylinux2014_x86_64"


BUILD_INPUTS = ("template.yaml", "infra", "mk/sam.mk", "inferq", "functions")


def build_key(architecture: str) -> str:
    """A hash of everything `sam build` reads (and of how this module patches its output)."""
    import hashlib

    digest = hashlib.sha256(f"{architecture}\n".encode())
    digest.update(Path(__file__).read_bytes())
    for name in BUILD_INPUTS:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(
            p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        )
        for file in files:
            digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def sam_build(build_dir: Path) -> Path:
    """`sam build` into ``build_dir``, or nothing when the last build there had the same inputs."""
    architecture, pip_platform = lambda_architecture()
    key = build_key(architecture)
    stamp = build_dir / ".inferq-build-key"
    if stamp.exists() and stamp.read_text() == key and (build_dir / "template.yaml").exists():
        say(f"sam build: {build_dir} is current")
        return build_dir / "template.yaml"
    env = {**os.environ, "LAMBDA_PLATFORM": pip_platform, "SAM_CLI_TELEMETRY": "0"}
    started = time.monotonic()
    result = subprocess.run(
        [str(SAM), "build", "--template-file", str(ROOT / "template.yaml"), "--build-dir", str(build_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"sam build exited {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    template = build_dir / "template.yaml"
    patch_built_template(template, architecture)
    stamp.write_text(key)
    say(f"sam build ({architecture}) in {time.monotonic() - started:.0f}s: {template}")
    return template
