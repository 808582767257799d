"""The GPU fleet's Spot capacity (infra/gpu.yaml, template.yaml): a Spot Auto Scaling group over several instance
types of one GPU class (price-capacity-optimized, capacity rebalancing) under its own capacity provider, the
service on Spot past an optional on-demand base, an on-demand fallback service the scaler sizes while Spot is
short, ECS Spot draining on the instances, and stop timeouts that fit the two-minute interruption notice. Each
can be turned off by a parameter; on is the default (docs/benchmarks.md, "GPU dollars")."""

from __future__ import annotations

from typing import Any

import pytest

from inferq.config.settings import Settings
from inferq.scaling.capacity import FALLBACK_SUFFIX

from .cfn import Resolver, as_list, role_statements

NOTICE_S = 120  # EC2's Spot interruption notice
DETECTION_S = 5  # the ECS agent polls the instance metadata for the notice about every few seconds


class Resources(dict[str, Any]):
    """infra/gpu.yaml's resources as CloudFormation creates them, each resolved (conditions and intrinsics) when
    read; a resource whose condition is false is absent."""

    def __init__(self, gpu: dict[str, Any], overrides: dict[str, str]) -> None:
        required = {name: name.lower() for name, p in gpu["Parameters"].items() if "Default" not in p}
        self.resolver = Resolver(gpu, overrides={**required, **overrides})
        super().__init__({name: resource for name, resource in gpu["Resources"].items()
                          if "Condition" not in resource or self.resolver.condition(resource["Condition"])})

    def __getitem__(self, name: str) -> Any:
        return self.resolver.value(super().__getitem__(name))


def gpu_resources(nested: dict[str, dict[str, Any]], **overrides: str) -> Resources:
    return Resources(nested["gpu"], overrides)


def test_spot_is_on_by_default(nested: dict[str, dict[str, Any]], source: dict[str, Any]) -> None:
    assert nested["gpu"]["Parameters"]["SpotCapacity"]["Default"] == "enabled"
    assert source["Parameters"]["SpotCapacity"]["Default"] == "enabled"
    assert source["Parameters"]["OnDemandBaseTasks"]["Default"] == 0  # the simulator's cheapest at the same p95


def test_the_spot_group_spreads_over_several_types_of_one_class_at_the_best_price_and_capacity(
    nested: dict[str, dict[str, Any]],
) -> None:
    group = gpu_resources(nested)["SpotAutoScalingGroup"]["Properties"]
    policy = group["MixedInstancesPolicy"]
    assert policy["InstancesDistribution"] == {
        "OnDemandBaseCapacity": 0, "OnDemandPercentageAboveBaseCapacity": 0,
        "SpotAllocationStrategy": "price-capacity-optimized"}
    types = [o["InstanceType"] for o in policy["LaunchTemplate"]["Overrides"]]
    assert types == ["g5.xlarge", "g6.xlarge", "g5.2xlarge", "g6.2xlarge"]  # one A10G or one L4, 24 GiB each
    assert policy["LaunchTemplate"]["LaunchTemplateSpecification"]["LaunchTemplateId"] == "LaunchTemplate"
    assert group["CapacityRebalance"] is True
    assert group["NewInstancesProtectedFromScaleIn"] is True  # ECS decides which instance may go
    assert group["MinSize"] == "0" and group["MaxSize"] == "4"
    assert group["VPCZoneIdentifier"] == ["subnetids"]  # every zone the on-demand group spans


@pytest.mark.parametrize("types", ["g6e.xlarge", "a.b,c.d,e.f,g.h,i.j,k.l"])
def test_the_spot_types_are_a_parameter_of_one_to_six(nested: dict[str, dict[str, Any]], types: str) -> None:
    group = gpu_resources(nested, SpotInstanceTypes=types)["SpotAutoScalingGroup"]["Properties"]
    overrides = group["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"]
    assert [o["InstanceType"] for o in overrides] == types.split(",")


def test_no_warm_pool_on_spot_and_spot_instances_skip_its_launch_hook(nested: dict[str, dict[str, Any]]) -> None:
    resources = gpu_resources(nested)
    assert resources["WarmPool"]["Properties"]["AutoScalingGroupName"] == "AutoScalingGroup"  # on-demand only
    assert "LifecycleHookSpecificationList" not in resources["SpotAutoScalingGroup"]["Properties"]
    user_data = nested["gpu"]["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["UserData"]
    script = user_data["Fn::Base64"]["Fn::Sub"]
    assert 'if [ "$(imds instance-life-cycle)" = "spot" ]; then exit 0; fi' in script
    assert script.index("instance-life-cycle") < script.index("complete-lifecycle-action")


def test_ecs_drains_a_spot_instance_on_its_interruption_notice(nested: dict[str, dict[str, Any]]) -> None:
    user_data = nested["gpu"]["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["UserData"]
    assert "ECS_ENABLE_SPOT_INSTANCE_DRAINING=true" in user_data["Fn::Base64"]["Fn::Sub"]
    provider = gpu_resources(nested)["SpotCapacityProvider"]["Properties"]["AutoScalingGroupProvider"]
    assert provider["AutoScalingGroupArn"] == "SpotAutoScalingGroup"
    # what the group terminates (capacity rebalancing, scale-in) is drained too; ECS keeps busy instances
    assert provider["ManagedDraining"] == "ENABLED" and provider["ManagedTerminationProtection"] == "ENABLED"
    assert provider["ManagedScaling"]["Status"] == "ENABLED"


def test_the_service_runs_on_spot_past_an_on_demand_base(nested: dict[str, dict[str, Any]]) -> None:
    service = gpu_resources(nested)["Service"]["Properties"]
    assert service["CapacityProviderStrategy"] == [
        {"CapacityProvider": "CapacityProvider", "Base": "0", "Weight": "0"},
        {"CapacityProvider": "SpotCapacityProvider", "Weight": 10}]
    based = gpu_resources(nested, OnDemandBaseTasks="1", OnDemandWeight="10")["Service"]["Properties"]
    assert based["CapacityProviderStrategy"][0] == {"CapacityProvider": "CapacityProvider", "Base": "1", "Weight": "10"}
    # a drained task's replacement starts beside it at once, not after its stop timeout
    assert service["DeploymentConfiguration"]["MaximumPercent"] == 200
    associations = gpu_resources(nested)["ClusterCapacityProviders"]["Properties"]["CapacityProviders"]
    assert associations == ["CapacityProvider", "SpotCapacityProvider"]


def test_spot_off_is_the_on_demand_fleet_as_before(nested: dict[str, dict[str, Any]]) -> None:
    resources = gpu_resources(nested, SpotCapacity="disabled")
    assert not {"SpotAutoScalingGroup", "SpotCapacityProvider", "FallbackService"} & set(resources)
    service = resources["Service"]["Properties"]
    assert service["CapacityProviderStrategy"] == [{"CapacityProvider": "CapacityProvider", "Weight": 1, "Base": 0}]
    assert service["DeploymentConfiguration"]["MaximumPercent"] == 100
    assert resources["ClusterCapacityProviders"]["Properties"]["CapacityProviders"] == ["CapacityProvider"]


def test_the_fallback_service_is_the_same_task_on_demand_named_after_the_service(
    nested: dict[str, dict[str, Any]],
) -> None:
    resources = gpu_resources(nested)
    fallback, service = resources["FallbackService"]["Properties"], resources["Service"]["Properties"]
    assert fallback["ServiceName"] == "Service.Name" + FALLBACK_SUFFIX  # the scaler finds it by this name
    assert fallback["CapacityProviderStrategy"] == [{"CapacityProvider": "CapacityProvider", "Weight": 1}]
    assert fallback["DesiredCount"] == 0  # the scaler sizes it
    for key in ("TaskDefinition", "Cluster", "NetworkConfiguration"):
        assert fallback[key] == service[key]
    outputs = Resolver(nested["gpu"]).value(nested["gpu"]["Outputs"])
    assert outputs["FallbackServiceArn"]["Value"] == "FallbackService"


def test_stop_timeouts_fit_the_two_minute_notice(nested: dict[str, dict[str, Any]]) -> None:
    """The worker is stopped first (the reverse of its start dependency), then vLLM: both within the notice; the
    worker's drain leaves it time to hand back what is left before its own SIGKILL."""
    gpu = nested["gpu"]
    containers = {c["Name"]: c for c in gpu["Resources"]["TaskDefinition"]["Properties"]["ContainerDefinitions"]}
    worker, vllm = containers["worker"], containers["vllm"]
    assert worker["DependsOn"] == [{"ContainerName": "vllm", "Condition": "START"}]
    assert DETECTION_S + worker["StopTimeout"] + vllm["StopTimeout"] <= NOTICE_S
    drain = gpu["Parameters"]["DrainSeconds"]
    assert drain["Default"] <= drain["MaxValue"] <= worker["StopTimeout"] - 10
    env = {e["Name"]: e["Value"] for e in Resolver(gpu, overrides={"RedisUrl": "redis://cache"}).value(
        worker["Environment"])}
    assert Settings.from_env(env).drain_s == drain["Default"]


def test_the_scaler_sizes_the_fallback_with_spot_and_reads_the_spot_tasks_waits(translated: dict[str, Any]) -> None:
    env = translated["Resources"]["ScalerFunction"]["Properties"]["Environment"]["Variables"]
    assert Resolver(translated).value(env["INFERQ_SCALE_SPOT_FALLBACK_S"]) == "180"
    assert Resolver(translated, overrides={"SpotCapacity": "disabled"}).value(env["INFERQ_SCALE_SPOT_FALLBACK_S"]) == 0
    assert Settings.from_env({"INFERQ_SCALE_SPOT_FALLBACK_S": "180"}).scale_spot_fallback_s == 180.0
    role = translated["Resources"]["ScalerFunction"]["Properties"]["Role"]["Fn::GetAtt"][0]
    reads = {a: s for owner, s in role_statements(translated) if owner == role
             for a in as_list(s["Action"]) if a in ("ecs:ListTasks", "ecs:DescribeTasks")}
    assert set(reads) == {"ecs:ListTasks", "ecs:DescribeTasks"}
    for statement in reads.values():  # read-only, in the GPU cluster only
        assert statement["Condition"] == {"ArnEquals": {"ecs:cluster": {"Fn::GetAtt": ["Gpu", "Outputs.ClusterArn"]}}}
    assert Resolver(translated).value(reads["ecs:DescribeTasks"]["Resource"]) == (
        "arn:aws:ecs:us-east-1:123456789012:task/Gpu.Outputs.ClusterName/*")
    parameters = translated["Resources"]["Gpu"]["Properties"]["Parameters"]
    for name in ("SpotCapacity", "OnDemandBaseTasks", "OnDemandWeight"):
        assert parameters[name] == {"Ref": name}
    assert Resolver(translated).value(parameters["SpotInstanceTypes"]) == "g5.xlarge,g6.xlarge,g5.2xlarge,g6.2xlarge"
