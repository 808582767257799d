"""What `make sam-local` (emulator/samlocal.py) changes in the built template and writes into the env-vars file,
checked on the repository's own template without Docker (tests/docker/test_sam_local.py runs the whole thing)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from emulator.sambuild import LOCAL_SCALER_TIMEOUT_S, leaves_out, patch_built_template
from emulator.samlocal import SECRETS_KEY, env_vars
from inferq.config.settings import Settings
from tests.infra.cfn import load

ROOT = Path(__file__).resolve().parents[2]


def built_template(tmp_path: Path) -> Path:
    """template.yaml in the long form `sam build` writes (intrinsics as mappings), as its build dir holds it."""
    path = tmp_path / "template.yaml"
    path.write_text(yaml.safe_dump(load(ROOT / "template.yaml"), sort_keys=False))
    return path


def test_the_local_copy_runs_this_machines_architecture_and_declares_the_endpoint(tmp_path: Path) -> None:
    path = built_template(tmp_path)
    patch_built_template(path, "x86_64")
    template: dict[str, Any] = yaml.safe_load(path.read_text())
    assert template["Globals"]["Function"]["Architectures"] == ["x86_64"]
    for name in ("GatewayFunction", "ScalerFunction", "AuthorizerFunction"):
        properties = template["Resources"][name]["Properties"]
        assert properties.get("Architectures", ["x86_64"]) == ["x86_64"]
        variables = properties["Environment"]["Variables"]
        assert variables["AWS_ENDPOINT_URL"] == ""
        assert not any(leaves_out(v) for v in variables.values()), name
    assert template["Resources"]["ScalerFunction"]["Properties"]["Timeout"] == LOCAL_SCALER_TIMEOUT_S
    # a variable the deployment leaves out by default is left out here too (sam local would set it to "")
    assert "INFERQ_SCALE_TARGET_PER_WORKER" not in template["Resources"]["ScalerFunction"]["Properties"][
        "Environment"]["Variables"]


def test_the_deployed_template_stays_arm64() -> None:
    assert load(ROOT / "template.yaml")["Globals"]["Function"]["Architectures"] == ["arm64"]


def test_the_env_vars_point_every_function_at_the_address_the_containers_reach(tmp_path: Path) -> None:
    endpoints = {"redis_url": "redis://172.30.99.1:40001/0", "aws_endpoint": "http://172.30.99.1:40002",
                 "ecs_cluster": "inferq", "ecs_service": "inferq-workers", "files_bucket": "inferq-files"}
    files = env_vars(endpoints, "host.docker.internal", "iq_dev_key")
    assert files["GatewayFunction"]["INFERQ_REDIS_URL"] == "redis://host.docker.internal:40001/0"
    assert files["ScalerFunction"]["AWS_ENDPOINT_URL"] == "http://host.docker.internal:40002"
    assert files["GatewayFunction"]["INFERQ_API_KEYS"] == "dev:iq_dev_key"
    # the authorizer checks the same key before the gateway does, and reads no secret locally
    assert files["AuthorizerFunction"]["INFERQ_API_KEYS"] == "dev:iq_dev_key"
    assert files["AuthorizerFunction"]["INFERQ_API_KEYS_SECRET"] == ""
    assert files["ScalerFunction"]["INFERQ_ECS_SERVICE"] == "inferq-workers"
    # the tenants' webhook secrets sealed by one KMS key in moto, which `inferq up` behind them uses too
    assert files["GatewayFunction"]["INFERQ_WEBHOOK_SECRETS_KEY"] == SECRETS_KEY == "alias/inferq-webhook-secrets"
    assert files["ScalerFunction"]["INFERQ_WEBHOOK_SECRETS_KEY"] == SECRETS_KEY
    # the emulator's ECS has one service per fleet: no Spot, no on-demand stand-in to size
    assert files["ScalerFunction"]["INFERQ_SCALE_SPOT_FALLBACK_S"] == "0"
    # every variable given is one the local template declares, or sam local would drop it silently
    path = built_template(tmp_path)
    patch_built_template(path, "x86_64")
    template: dict[str, Any] = yaml.safe_load(path.read_text())
    for name, variables in files.items():
        declared = set(template["Resources"][name]["Properties"]["Environment"]["Variables"])
        declared |= set(template["Globals"]["Function"]["Environment"]["Variables"])
        assert set(variables) <= declared, (name, set(variables) - declared)


def test_the_hand_written_env_file_gives_the_gateway_and_the_authorizer_the_same_key(tmp_path: Path) -> None:
    """emulator/sam-env.json (sam local by hand, emulator/README.md): the authorizer's variables are ones it
    declares (sam local drops the others silently)."""
    local = json.loads((ROOT / "emulator" / "sam-env.json").read_text())
    assert local["AuthorizerFunction"]["INFERQ_API_KEYS"] == local["GatewayFunction"]["INFERQ_API_KEYS"]
    path = built_template(tmp_path)
    patch_built_template(path, "x86_64")
    template: dict[str, Any] = yaml.safe_load(path.read_text())
    declared = set(template["Resources"]["AuthorizerFunction"]["Properties"]["Environment"]["Variables"])
    declared |= set(template["Globals"]["Function"]["Environment"]["Variables"])
    assert set(local["AuthorizerFunction"]) <= declared


def names_a_resource(value: Any, resources: set[str]) -> bool:
    """Whether a variable's value names a resource of the stack (``!Ref``, ``!GetAtt``, ``${Resource...}``), which
    sam local cannot know: it hands over a made-up stand-in (a Lambda ARN, the logical id), which the settings refuse
    or which points nowhere."""
    if isinstance(value, list):
        return any(names_a_resource(v, resources) for v in value)
    if not isinstance(value, dict):
        return False
    if "Ref" in value:
        return value["Ref"] in resources
    if "Fn::GetAtt" in value:
        target = value["Fn::GetAtt"]
        return (target[0] if isinstance(target, list) else target.split(".")[0]) in resources
    if "Fn::Sub" in value:
        text = value["Fn::Sub"] if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"][0]
        return any(f"${{{name}" in text for name in resources)
    return any(names_a_resource(v, resources) for v in value.values())


def test_every_variable_naming_a_resource_is_given_locally(tmp_path: Path) -> None:
    """What sam local cannot resolve, the env-vars files give: `make sam-local`'s for every function, the hand-written
    one for the gateway and the authorizer; each with a value every setting parses."""
    endpoints = {"redis_url": "redis://172.30.99.1:40001/0", "aws_endpoint": "http://172.30.99.1:40002",
                 "ecs_cluster": "inferq", "ecs_service": "inferq-workers", "files_bucket": "inferq-files"}
    files = env_vars(endpoints, "host.docker.internal", "iq_dev_key")
    by_hand = json.loads((ROOT / "emulator" / "sam-env.json").read_text())
    path = built_template(tmp_path)
    patch_built_template(path, "x86_64")
    template: dict[str, Any] = yaml.safe_load(path.read_text())
    resources = set(template["Resources"])
    for name, given in [*files.items(), *by_hand.items()]:
        variables = template["Resources"][name]["Properties"]["Environment"]["Variables"]
        unresolved = {k for k, v in variables.items() if names_a_resource(v, resources)}
        assert unresolved <= set(given), (name, unresolved - set(given))
        Settings.from_env({**given, "INFERQ_REDIS_URL": given.get("INFERQ_REDIS_URL", "redis://h:6379/0")})
