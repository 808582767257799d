"""What `make sam-local` (emulator/samlocal.py) changes in the built template and writes into the env-vars file,
checked on the repository's own template without Docker (tests/docker/test_sam_local.py runs the whole thing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from emulator.sambuild import LOCAL_SCALER_TIMEOUT_S, leaves_out, patch_built_template
from emulator.samlocal import env_vars
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
    for name in ("GatewayFunction", "ScalerFunction"):
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
    assert files["ScalerFunction"]["INFERQ_ECS_SERVICE"] == "inferq-workers"
    # every variable given is one the local template declares, or sam local would drop it silently
    path = built_template(tmp_path)
    patch_built_template(path, "x86_64")
    template: dict[str, Any] = yaml.safe_load(path.read_text())
    for name, variables in files.items():
        declared = set(template["Resources"][name]["Properties"]["Environment"]["Variables"])
        declared |= set(template["Globals"]["Function"]["Environment"]["Variables"])
        assert set(variables) <= declared, (name, set(variables) - declared)
