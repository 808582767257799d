"""SnapStart for the gateway Lambda, read back from template.yaml after the SAM transform: snapshots of published
versions, a published version behind the alias ``live``, and the HTTP API invoking that alias (SnapStart never
applies to $LATEST)."""

from __future__ import annotations

import json
from typing import Any


def test_gateway_snapshots_its_published_versions_on_python313_arm64(translated: dict[str, Any]) -> None:
    gateway = translated["Resources"]["GatewayFunction"]["Properties"]
    assert gateway["SnapStart"] == {"ApplyOn": "PublishedVersions"}
    assert gateway["Runtime"] == "python3.13" and gateway["Architectures"] == ["arm64"]
    # What SnapStart cannot be combined with: ephemeral storage above 512 MB, EFS, provisioned concurrency.
    assert gateway.get("EphemeralStorage", {}).get("Size", 512) <= 512
    assert "FileSystemConfigs" not in gateway


def test_the_http_api_invokes_the_published_alias_never_latest(translated: dict[str, Any]) -> None:
    resources = translated["Resources"]
    aliases = {k: v for k, v in resources.items()
               if v["Type"] == "AWS::Lambda::Alias" and v["Properties"]["FunctionName"] == {"Ref": "GatewayFunction"}}
    assert list(aliases) == ["GatewayFunctionAliaslive"]
    alias = aliases["GatewayFunctionAliaslive"]["Properties"]
    version_id = alias["FunctionVersion"]["Fn::GetAtt"][0]
    assert resources[version_id]["Type"] == "AWS::Lambda::Version"
    assert "ProvisionedConcurrencyConfig" not in alias  # SnapStart and provisioned concurrency exclude each other

    api = json.dumps(resources["HttpApi"]["Properties"]["Body"])
    assert "functions/${GatewayFunctionAliaslive}/invocations" in api
    assert "${GatewayFunction.Arn}" not in api
    permissions = [v["Properties"] for v in resources.values() if v["Type"] == "AWS::Lambda::Permission"
                   and v["Properties"].get("Principal") == "apigateway.amazonaws.com"]
    # the API may invoke the gateway's alias, and the authorizer (not SnapStart'ed: no alias) as its authorizer
    authorizer = {"Fn::GetAtt": ["AuthorizerFunction", "Arn"]}
    gateway = [p for p in permissions if p["FunctionName"] != authorizer]
    assert gateway and all(p["FunctionName"] == {"Ref": "GatewayFunctionAliaslive"} for p in gateway)
    assert len(permissions) == len(gateway) + 1


def test_the_scaler_is_left_without_snapstart(translated: dict[str, Any]) -> None:
    # One invocation a minute: a snapshot's restore would rarely be reused; its init is not on a caller's path.
    assert "SnapStart" not in translated["Resources"]["ScalerFunction"]["Properties"]


def test_the_emergency_revocation_retires_what_the_api_calls(translated: dict[str, Any]) -> None:
    """Issue 47, L3: docs/operations.md's emergency revocation changes $LATEST's configuration, which retires the
    authorizer's sandboxes (the API calls its unqualified ARN) but not the gateway's: those are the `live` alias's,
    a published version. The procedure publishes a version and moves that alias to it."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = page[page.index("**Emergency revocation**"):page.index("## Rotate the cache token")]
    script = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert script, "no commands"
    commands = script.group(1)
    alias = translated["Resources"]["GatewayFunctionAliaslive"]["Properties"]["Name"]
    assert "update-function-configuration" in commands and "<AuthorizerFunctionName>" in commands
    # the new version from the changed configuration, active (its snapshot taken), then the alias moved to it
    steps = ["publish-version", "wait published-version-active", f"update-alias --function-name \"$GW\" --name {alias}"]
    positions = [commands.find(step) for step in steps]
    assert -1 not in positions and positions == sorted(positions), positions
    assert commands.index("update-function-configuration") < positions[0]
