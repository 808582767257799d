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
