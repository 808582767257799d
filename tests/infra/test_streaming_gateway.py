"""The optional streaming gateway (StreamingGateway enabled, template.yaml): the gateway's app under uvicorn on ECS
Fargate behind an Application Load Balancer, where a ``stream: true`` answer's events arrive as they are made.

It is the gateway function again in a container, so these tests hold the two equal where they must be: the
process's environment and the IAM statements, resolved in each way the stack can be given a cache. Then what a
container on the internet adds: HTTPS alone, who may reach what, timeouts that outlast every wait and quiet stream,
and the stack's rules refusing a deployment that could not stand up. That the container streams is shown by the
same image under Docker (tests/docker/test_compose_stack.py, the events read while the job runs); that a load
balancer forwards a chunked answer as it is written is not measured here (no AWS account)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from functions.gateway.request_schemas import MAX_WAIT_S
from functions.gateway.routers.completions import KEEPALIVE_S, STREAM_SLOT_S

from .cfn import Resolver

ENABLED = {
    "StreamingGateway": "enabled",
    "StreamingGatewayImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/inferq-gateway@sha256:" + "ab" * 32,
    "StreamingGatewayCertificateArn": "arn:aws:acm:us-east-1:123456789012:certificate/0a1b2c3d-0a1b-0a1b-0a1b-0a1b2c",
}
EXISTING = "rediss://cache.example:6379/0"
TOKEN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:token-AbCdEf"
CACHES = {
    "created cache": {},
    "existing cache with a token": {"ExistingRedisUrl": EXISTING, "ExistingRedisAuthSecretArn": TOKEN},
    "existing cache without a token": {"ExistingRedisUrl": EXISTING},
}
LAMBDA_ONLY = {"INFERQ_API_KEYS"}
"""Declared on the function for `sam local` only (empty in AWS)."""


def resolver(source: dict[str, Any], **overrides: str) -> Resolver:
    return Resolver(source, overrides={**ENABLED, **overrides})


def resource(source: dict[str, Any], logical_id: str) -> dict[str, Any]:
    return source["Resources"][logical_id]


def container(source: dict[str, Any], r: Resolver) -> dict[str, Any]:
    task = r.value(resource(source, "StreamingGatewayTaskDefinition")["Properties"])
    (gateway,) = task["ContainerDefinitions"]
    return dict(gateway)


def statements(policies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for p in policies for s in p.get("PolicyDocument", p)["Statement"]]


def refusals(source: dict[str, Any], **overrides: str) -> list[str]:
    """What the stack's Rules refuse of these parameters (CloudFormation refuses the deployment before a change)."""
    r = Resolver(source, overrides=overrides)
    return [a["AssertDescription"] for rule in source["Rules"].values()
            if r.value(rule.get("RuleCondition", True)) for a in rule["Assertions"] if not r.value(a["Assert"])]


def test_it_is_off_by_default_and_every_part_of_it_goes_with_the_switch(source: dict[str, Any]) -> None:
    assert source["Parameters"]["StreamingGateway"]["Default"] == "disabled"
    assert not Resolver(source).condition("HasStreamingGateway")
    parts = [k for k in source["Resources"] if k.startswith("StreamingGateway")]
    assert len(parts) >= 12
    assert {resource(source, k)["Condition"] for k in parts} <= {"HasStreamingGateway", "HasStreamingGatewayWebAcl"}
    assert source["Outputs"]["StreamingGatewayDnsName"]["Condition"] == "HasStreamingGateway"
    assert refusals(source) == []


@pytest.mark.parametrize("cache", CACHES)
def test_the_container_gets_the_gateway_functions_environment(source: dict[str, Any], cache: str) -> None:
    r = resolver(source, **CACHES[cache])
    function = {**source["Globals"]["Function"]["Environment"]["Variables"],
                **resource(source, "GatewayFunction")["Properties"]["Environment"]["Variables"]}
    expected = {k: str(v) for k, v in r.value(function).items() if k not in LAMBDA_ONLY}
    env = {e["Name"]: str(e["Value"]) for e in container(source, r)["Environment"]}
    assert env == {**expected, "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
    assert ("INFERQ_REDIS_AUTH_SECRET" in env) == (cache != "existing cache without a token")


@pytest.mark.parametrize("cache", CACHES)
def test_the_task_role_may_do_what_the_gateway_function_may_and_nothing_else(
    source: dict[str, Any], cache: str
) -> None:
    r = resolver(source, **CACHES[cache])
    function = statements(r.value(resource(source, "GatewayFunction")["Properties"]["Policies"]))
    task = statements(r.value(resource(source, "StreamingGatewayTaskRole")["Properties"]["Policies"]))
    assert task == function
    execution = r.value(resource(source, "StreamingGatewayExecutionRole")["Properties"])
    assert "Policies" not in execution  # reads no secret: the gateway reads its own, as the function does
    assert [a.rsplit("/", 1)[1] for a in execution["ManagedPolicyArns"]] == ["AmazonECSTaskExecutionRolePolicy"]


def test_the_container_runs_the_gateway_app_by_digest_without_capabilities(source: dict[str, Any]) -> None:
    r = resolver(source)
    gateway = container(source, r)
    assert gateway["Command"][:2] == ["uvicorn", "functions.gateway.app:app"]
    assert gateway["Image"] == ENABLED["StreamingGatewayImage"]
    pattern = source["Parameters"]["StreamingGatewayImage"]["AllowedPattern"]
    assert not re.fullmatch(pattern, "inferq-gateway:latest")
    # its root stays writable: a multipart upload past 1 MiB is spooled to /tmp (the Docker test uploads one)
    assert "ReadonlyRootFilesystem" not in gateway
    assert gateway["LinuxParameters"]["Capabilities"]["Drop"] == ["ALL"]
    task = r.value(resource(source, "StreamingGatewayTaskDefinition")["Properties"])
    assert task["RequiresCompatibilities"] == ["FARGATE"] and task["NetworkMode"] == "awsvpc"


def test_the_load_balancer_speaks_https_alone_with_the_given_certificate(source: dict[str, Any]) -> None:
    r = resolver(source)
    listeners = [k for k, v in source["Resources"].items() if v["Type"] == "AWS::ElasticLoadBalancingV2::Listener"]
    assert listeners == ["StreamingGatewayListener"]  # no port 80, where a key would cross in clear
    listener = r.value(resource(source, "StreamingGatewayListener")["Properties"])
    assert (listener["Port"], listener["Protocol"]) == (443, "HTTPS")
    assert listener["Certificates"] == [{"CertificateArn": ENABLED["StreamingGatewayCertificateArn"]}]
    assert listener["SslPolicy"].startswith("ELBSecurityPolicy-TLS13")


def test_only_the_load_balancer_reaches_the_tasks_and_only_over_https_from_outside(source: dict[str, Any]) -> None:
    r = resolver(source)
    lb = r.value(resource(source, "StreamingGatewayLoadBalancerSecurityGroup")["Properties"])
    assert [(i["FromPort"], i["ToPort"], i["CidrIp"]) for i in lb["SecurityGroupIngress"]] == [(443, 443, "0.0.0.0/0")]
    assert [(e["FromPort"], e["DestinationSecurityGroupId"]) for e in lb["SecurityGroupEgress"]] == [
        (8080, "StreamingGatewayTaskSecurityGroup")]
    ingress = [r.value(v["Properties"]) for v in source["Resources"].values()
               if v["Type"] == "AWS::EC2::SecurityGroupIngress" and
               v["Properties"]["GroupId"] == {"Ref": "StreamingGatewayTaskSecurityGroup"}]
    assert [(i["FromPort"], i["SourceSecurityGroupId"]) for i in ingress] == [
        (8080, "StreamingGatewayLoadBalancerSecurityGroup")]
    service = r.value(resource(source, "StreamingGatewayService")["Properties"])
    network = service["NetworkConfiguration"]["AwsvpcConfiguration"]
    assert network["AssignPublicIp"] == "DISABLED"
    assert network["Subnets"] == ["Network.Outputs.PrivateSubnetIds"]  # split of the private subnets' list
    assert network["SecurityGroups"] == ["Network.Outputs.ClientSecurityGroupId", "StreamingGatewayTaskSecurityGroup"]
    balancer = r.value(resource(source, "StreamingGatewayLoadBalancer")["Properties"])
    assert balancer["Scheme"] == "internet-facing"
    assert balancer["Subnets"] == ["Network.Outputs.PublicSubnetIds"]
    narrowed = resolver(source, StreamingGatewayIngressCidr="203.0.113.0/24")
    narrowed_lb = narrowed.value(resource(source, "StreamingGatewayLoadBalancerSecurityGroup")["Properties"])
    assert narrowed_lb["SecurityGroupIngress"][0]["CidrIp"] == "203.0.113.0/24"


def test_no_timeout_on_the_way_ends_a_wait_or_a_quiet_stream(source: dict[str, Any]) -> None:
    r = resolver(source)
    attributes = {a["Key"]: int(a["Value"]) for a in
                  r.value(resource(source, "StreamingGatewayLoadBalancer")["Properties"])["LoadBalancerAttributes"]
                  if a["Key"].endswith("seconds")}
    longest_wait = max(int(source["Parameters"]["SyncWaitSeconds"]["MaxValue"]), MAX_WAIT_S)
    # a connection idle past the load balancer's timeout is closed: every wait, and a stream's quiet stretch
    # (a keep-alive comment every KEEPALIVE_S), is shorter
    assert attributes["idle_timeout.timeout_seconds"] > max(longest_wait, KEEPALIVE_S)
    group = r.value(resource(source, "StreamingGatewayTargetGroup")["Properties"])
    delay = {a["Key"]: int(a["Value"]) for a in group["TargetGroupAttributes"]}["deregistration_delay.timeout_seconds"]
    # a task leaving (a deployment, a scale-in) finishes its waits and its streams before ECS stops it
    assert delay >= STREAM_SLOT_S > longest_wait
    assert group["HealthCheckPath"] == "/healthz" and group["TargetType"] == "ip"
    gateway = container(source, r)
    graceful = int(gateway["Command"][gateway["Command"].index("--timeout-graceful-shutdown") + 1])
    assert gateway["StopTimeout"] > graceful


def test_it_scales_between_its_bounds(source: dict[str, Any]) -> None:
    r = resolver(source, StreamingGatewayTasks="3", StreamingGatewayMaxTasks="12")
    target = r.value(resource(source, "StreamingGatewayScalableTarget")["Properties"])
    assert (target["MinCapacity"], target["MaxCapacity"]) == ("3", "12")
    # no count of its own: a stack update (a new image) would reset what scaling reached
    assert "DesiredCount" not in r.value(resource(source, "StreamingGatewayService")["Properties"])


def test_a_web_acl_is_put_on_the_load_balancer_when_given(source: dict[str, Any]) -> None:
    acl = "arn:aws:wafv2:us-east-1:123456789012:regional/webacl/inferq/0a1b2c3d"
    assert not resolver(source).condition("HasStreamingGatewayWebAcl")
    assert resolver(source, StreamingGatewayWebAclArn=acl).condition("HasStreamingGatewayWebAcl")
    pattern = source["Parameters"]["StreamingGatewayWebAclArn"]["AllowedPattern"]
    assert re.fullmatch(pattern, acl)
    assert not re.fullmatch(pattern, acl.replace("regional", "global"))  # CloudFront's scope cannot go on it


def test_the_rules_refuse_a_streaming_gateway_that_could_not_stand_up(source: dict[str, Any]) -> None:
    assert refusals(source, **ENABLED) == []
    assert refusals(source, **{**ENABLED, "StreamingGatewayImage": ""}) == [
        "StreamingGateway enabled needs StreamingGatewayImage, the gateway image by digest."]
    assert len(refusals(source, StreamingGateway="enabled")) == 2  # no image, no certificate
    assert len(refusals(source, **ENABLED, NetworkEgress="endpoints")) == 1  # a new VPC without public subnets
    existing = {"ExistingVpcId": "vpc-0abc", "ExistingPrivateSubnetIds": "subnet-1,subnet-2"}
    assert refusals(source, **existing) == []
    assert len(refusals(source, **ENABLED, **existing)) == 1
    assert refusals(source, **ENABLED, **existing, ExistingPublicSubnetIds="subnet-3,subnet-4") == []


def test_the_alarms_watch_its_load_balancer_only_when_there_is_one(
    source: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    observability = nested["observability"]
    given = resource(source, "Observability")["Properties"]["Parameters"]
    names = ("StreamingGatewayLoadBalancer", "StreamingGatewayTargetGroup")
    watched = {k: resolver(source).value(given[k]) for k in names}
    assert watched == {"StreamingGatewayLoadBalancer": "StreamingGatewayLoadBalancer.LoadBalancerFullName",
                       "StreamingGatewayTargetGroup": "StreamingGatewayTargetGroup.TargetGroupFullName"}
    off = {k: Resolver(source).value(given[k]) for k in names}
    assert off == dict.fromkeys(names, "none")
    assert not Resolver(observability, overrides=off).condition("WatchesStreamingGateway")
    assert Resolver(observability, overrides={"StreamingGatewayLoadBalancer": "app/x/1"}).condition(
        "WatchesStreamingGateway")
    alarms = {k: v["Properties"] for k, v in observability["Resources"].items()
              if v.get("Condition") == "WatchesStreamingGateway"}
    assert {a["MetricName"] for a in alarms.values()} == {"HealthyHostCount", "HTTPCode_ELB_5XX_Count"}
    for alarm in alarms.values():
        assert alarm["Namespace"] == "AWS/ApplicationELB"
        assert {"Name": "LoadBalancer", "Value": {"Ref": "StreamingGatewayLoadBalancer"}} in alarm["Dimensions"]
        assert alarm["AlarmActions"] == [{"Ref": "AlarmTopic"}]
    healthy = next(a for a in alarms.values() if a["MetricName"] == "HealthyHostCount")
    # no task reporting is no task healthy
    assert (healthy["ComparisonOperator"], healthy["Threshold"], healthy["TreatMissingData"]) == (
        "LessThanThreshold", 1, "breaching")
