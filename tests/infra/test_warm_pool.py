"""The GPU fleet's warm pool (infra/gpu.yaml): stopped instances with images and weights on their volumes, used by
the ECS capacity provider's Auto Scaling group before cold launches."""

from __future__ import annotations

import json
from typing import Any

import cfnlint.api as cfn_lint

from .cfn import NESTED


def _user_data(gpu: dict[str, Any]) -> str:
    sub = gpu["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Sub"]
    return str(sub if isinstance(sub, str) else sub[0])


def test_the_gpu_group_has_a_stopped_warm_pool_sized_by_a_parameter(nested: dict[str, dict[str, Any]]) -> None:
    gpu = nested["gpu"]
    pool = gpu["Resources"]["WarmPool"]
    assert pool["Type"] == "AWS::AutoScaling::WarmPool"
    assert pool["Condition"] == "HasWarmPool"
    props = pool["Properties"]
    assert props["AutoScalingGroupName"] == {"Ref": "AutoScalingGroup"}
    assert props["PoolState"] == "Stopped"  # a stopped instance pays for its volume only
    assert props["MinSize"] == {"Ref": "WarmPoolSize"}
    assert "InstanceReusePolicy" not in props  # ECS refuses ReuseOnScaleIn
    parameter = gpu["Parameters"]["WarmPoolSize"]
    assert (parameter["Type"], parameter["MinValue"]) == ("Number", 0) and parameter["Default"] >= 1
    assert gpu["Conditions"]["HasWarmPool"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "WarmPoolSize"}, 0]}]}


def test_the_capacity_provider_owns_the_group_with_the_warm_pool(nested: dict[str, dict[str, Any]]) -> None:
    resources = nested["gpu"]["Resources"]
    provider = resources["CapacityProvider"]["Properties"]["AutoScalingGroupProvider"]
    assert provider["AutoScalingGroupArn"] == {"Ref": "AutoScalingGroup"}
    assert resources["WarmPool"]["Properties"]["AutoScalingGroupName"] == {"Ref": "AutoScalingGroup"}


def test_instances_wait_out_the_warm_pool_and_cache_images_and_weights_before_being_stopped(
    nested: dict[str, dict[str, Any]],
) -> None:
    gpu = nested["gpu"]
    user_data = _user_data(gpu)
    assert "ECS_WARM_POOLS_CHECK=true" in user_data  # the agent registers only once the instance is in service
    assert "Warmed:Stopped" in user_data and "docker pull '${VllmImage}'" in user_data
    # the weights on every boot, warm pool or not: the engine has no route to download them (DEPLOY.md)
    assert "download '${ModelId}'" in user_data and "/var/lib/inferq/huggingface" in user_data
    assert "/var/lib/cloud/scripts/per-boot/" in user_data  # each boot, the one out of the pool included
    assert "complete-lifecycle-action" in user_data and "inferq-warm-pool" in user_data
    group = gpu["Resources"]["AutoScalingGroup"]["Properties"]
    hooks = group["LifecycleHookSpecificationList"]["Fn::If"]
    assert hooks[0] == "HasWarmPool"
    (hook,) = hooks[1]
    assert hook["LifecycleHookName"] == "inferq-warm-pool"
    assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_LAUNCHING"
    assert hook["DefaultResult"] == "CONTINUE"  # a hook nobody completes never blocks the fleet
    assert group["AutoScalingGroupName"] == {"Fn::Sub": "${AWS::StackName}-gpu"}


def test_instances_may_complete_the_lifecycle_action_of_their_own_group_only(
    nested: dict[str, dict[str, Any]],
) -> None:
    role = nested["gpu"]["Resources"]["InstanceRole"]["Properties"]
    # besides, under HasHuggingFaceToken, the token's read (tests/infra/test_security.py)
    statements = [s for p in role["Policies"] if "PolicyDocument" in p for s in p["PolicyDocument"]["Statement"]]
    conditional = [p["Fn::If"] for p in role["Policies"] if "Fn::If" in p]
    assert [c[0] for c in conditional] == ["HasHuggingFaceToken"]
    assert [s["Action"] for s in statements] == ["autoscaling:CompleteLifecycleAction"]
    resource = json.dumps(statements[0]["Resource"])
    assert "autoScalingGroupName/${AWS::StackName}-gpu" in resource and "*\"" not in resource.replace(":*:", "")


def test_the_gpu_stack_with_its_warm_pool_is_cfn_lint_clean() -> None:
    matches = cfn_lint.lint_file(NESTED["gpu"], config=cfn_lint.ManualArgs(regions=["us-east-1"]))
    assert not matches, "\n".join(str(m) for m in matches)
