"""The AWS deployment as code: template.yaml (SAM) and its nested stacks under infra/.

Linted by cfn-lint and ``sam validate --lint``, then read back after the SAM transform: the handlers, runtime and
schedule the design fixes, environments that point at the stack's own resources and parse as inferq settings, and
IAM scoped to single resources.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from cfnlint import api as cfn_lint

from emulator.valkey import STREAM_NODE_MAX_ENTRIES
from inferq.config.settings import Settings

from .cfn import (
    FUNCTIONS,
    LAMBDAS,
    NESTED,
    NO_VALUE,
    READ_ONLY_VERBS,
    ROOT,
    TEMPLATE,
    Resolver,
    as_list,
    role_statements,
    run,
    sam_env,
)

# Stand-ins for nested-stack outputs where a value must parse (the URL the settings validate).
ATTRIBUTES = {"Cache.Outputs.RedisUrl": "rediss://cache.inferq.test:6379/0",
              "WebhookSecretsKey.Arn": "arn:aws:kms:us-east-1:123456789012:key/0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"}
WEBHOOK_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hooks-AbCdEf"
HF_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-AbCdEf"
TOKEN_REF = "{{resolve:secretsmanager:${AuthSecret}:SecretString:token}}"
# AWS managed policies a role may carry. Their '*' resources are AWS's to scope: ENIs for a Lambda in a VPC,
# X-Ray segments, the ECS agent's registration, ECR auth tokens. Everything else is inline and scoped.
MANAGED_POLICIES = {
    "service-role/AWSLambdaBasicExecutionRole",
    "service-role/AWSLambdaVPCAccessExecutionRole",
    "AWSXrayWriteOnlyAccess",
    "service-role/AmazonEC2ContainerServiceforEC2Role",
    "service-role/AmazonECSTaskExecutionRolePolicy",
}


def function(translated: dict[str, Any], logical_id: str) -> dict[str, Any]:
    resource = translated["Resources"][logical_id]
    assert resource["Type"] == "AWS::Lambda::Function"
    return resource["Properties"]


def environment(translated: dict[str, Any], logical_id: str) -> dict[str, Any]:
    return function(translated, logical_id)["Environment"]["Variables"]


def role_of(translated: dict[str, Any], logical_id: str) -> str:
    role = function(translated, logical_id)["Role"]
    assert role["Fn::GetAtt"][1] == "Arn"
    return role["Fn::GetAtt"][0]


def allowed(translated: dict[str, Any], role: str, action: str) -> list[Any]:
    """The resources a role's inline policies allow an action on."""
    return [
        statement["Resource"]
        for owner, statement in role_statements(translated)
        if owner == role and statement["Effect"] == "Allow" and action in as_list(statement["Action"])
    ]


def worker_container(gpu: dict[str, Any]) -> dict[str, Any]:
    containers = gpu["Resources"]["TaskDefinition"]["Properties"]["ContainerDefinitions"]
    return next(c for c in containers if c["Name"] == "worker")


def worker_environment(gpu: dict[str, Any], **overrides: str) -> dict[str, str]:
    """The worker container's environment as ECS would start it, parameters at their defaults but ``overrides``."""
    resolver = Resolver(gpu, overrides={"RedisUrl": "rediss://cache:6379/0", **overrides})
    return {e["Name"]: e["Value"] for e in resolver.value(worker_container(gpu)["Environment"])}


# --- linters ---


@pytest.mark.parametrize("path", [TEMPLATE, *NESTED.values()], ids=lambda p: Path(p).name)
def test_cfn_lint_finds_nothing(path: Path) -> None:
    matches = cfn_lint.lint_file(path, config=cfn_lint.ManualArgs(regions=["us-east-1"]))
    assert not matches, "\n".join(str(m) for m in matches)


def test_sam_validate_lint_passes(sam: Path) -> None:
    result = run([str(sam), "validate", "--lint", "--region", "us-east-1", "--template", str(TEMPLATE)], env=sam_env())
    assert "is a valid SAM Template" in result.stdout + result.stderr


def test_samconfig_lints_on_validate_and_deploys_with_the_needed_capabilities() -> None:
    config = tomllib.loads((ROOT / "samconfig.toml").read_text())["default"]
    assert config["validate"]["parameters"]["lint"] is True
    deploy = config["deploy"]["parameters"]
    assert set(deploy["capabilities"].split()) == {"CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"}
    assert deploy["resolve_s3"] is True


# --- the functions ---


@pytest.mark.parametrize("logical_id", LAMBDAS)
def test_functions_run_their_contract_handlers_on_python313_arm64(
    translated: dict[str, Any], source: dict[str, Any], logical_id: str
) -> None:
    props = function(translated, logical_id)
    assert props["Handler"] == f"functions/{LAMBDAS[logical_id]}/app.handler"
    assert props["Runtime"] == "python3.13"
    assert props["Architectures"] == ["arm64"]
    written = source["Resources"][logical_id]
    assert written["Metadata"] == {"BuildMethod": "makefile"}
    assert written["Properties"]["CodeUri"] == "."


def test_scaler_runs_every_minute_and_a_wake_is_never_retried(translated: dict[str, Any]) -> None:
    rules = [r["Properties"] for r in translated["Resources"].values() if r["Type"] == "AWS::Events::Rule"]
    assert [(r["ScheduleExpression"], r["Targets"][0]["Arn"]) for r in rules] == [
        ("rate(1 minute)", {"Fn::GetAtt": ["ScalerFunction", "Arn"]})
    ]
    assert 50 <= function(translated, "ScalerFunction")["Timeout"] <= 60
    invoke_config = next(
        r["Properties"] for r in translated["Resources"].values() if r["Type"] == "AWS::Lambda::EventInvokeConfig"
    )
    assert invoke_config["FunctionName"] == {"Ref": "ScalerFunction"}
    assert invoke_config["MaximumRetryAttempts"] == 0


def test_gateway_serves_every_route_of_a_throttled_http_api(translated: dict[str, Any]) -> None:
    resources = translated["Resources"]
    paths = resources["HttpApi"]["Properties"]["Body"]["paths"]
    assert paths["/$default"]["x-amazon-apigateway-any-method"]["isDefaultRoute"] is True
    operations = [op for methods in paths.values() for op in methods.values()]
    assert len(operations) == len(paths) >= 1  # the catch-all, and the public routes (test_authorizer_template.py)
    for operation in operations:
        integration = operation["x-amazon-apigateway-integration"]
        assert "${GatewayFunctionAliaslive}" in integration["uri"]["Fn::Sub"]  # the published alias (SnapStart)
        assert integration["payloadFormatVersion"] == "2.0"
    stage = next(r["Properties"] for r in resources.values() if r["Type"] == "AWS::ApiGatewayV2::Stage")
    assert stage["DefaultRouteSettings"] == {
        "ThrottlingRateLimit": {"Ref": "ThrottlingRateLimit"},
        "ThrottlingBurstLimit": {"Ref": "ThrottlingBurstLimit"},
    }
    assert 20 < function(translated, "GatewayFunction")["Timeout"] < 30  # a 20 s long poll, inside API GW's 30 s


@pytest.mark.parametrize("logical_id", FUNCTIONS)
def test_functions_sit_in_the_private_subnets_as_clients_of_the_cache(
    translated: dict[str, Any], logical_id: str
) -> None:
    vpc = function(translated, logical_id)["VpcConfig"]
    assert vpc["SubnetIds"] == {"Fn::Split": [",", {"Fn::GetAtt": ["Network", "Outputs.PrivateSubnetIds"]}]}
    client_group = {"Fn::GetAtt": ["Network", "Outputs.ClientSecurityGroupId"]}
    assert vpc["SecurityGroupIds"] == [client_group]
    cache = translated["Resources"]["Cache"]["Properties"]["Parameters"]
    gpu = translated["Resources"]["Gpu"]["Properties"]["Parameters"]
    assert cache["ClientSecurityGroupId"] == gpu["TaskSecurityGroupId"] == client_group
    assert cache["SubnetIds"] == gpu["SubnetIds"] == {"Fn::GetAtt": ["Network", "Outputs.PrivateSubnetIds"]}


@pytest.mark.parametrize(
    ("logical_id", "service"), [("GatewayFunction", "inferq-gateway"), ("ScalerFunction", "inferq-scaler")]
)
def test_powertools_names_the_service_and_the_inferq_namespace(
    translated: dict[str, Any], logical_id: str, service: str
) -> None:
    env = environment(translated, logical_id)
    assert env["POWERTOOLS_SERVICE_NAME"] == service
    assert env["POWERTOOLS_METRICS_NAMESPACE"] == "inferq"
    assert env["POWERTOOLS_LOG_LEVEL"] == env["INFERQ_LOG_LEVEL"] == {"Ref": "LogLevel"}


@pytest.mark.parametrize(("logical_id", "role"), [("GatewayFunction", "Gateway"), ("ScalerFunction", "Scaler")])
def test_functions_reach_the_stack_cache_with_the_token_left_in_secrets_manager(
    translated: dict[str, Any], logical_id: str, role: str
) -> None:
    env = environment(translated, logical_id)
    resolver = Resolver(translated)
    assert resolver.value(env["INFERQ_REDIS_URL"]) == "Cache.Outputs.RedisUrl"
    # each function its own cache user's secret (inferq/redis/acl.py)
    assert resolver.value(env["INFERQ_REDIS_AUTH_SECRET"]) == f"Cache.Outputs.{role}AuthSecretArn"
    assert env["INFERQ_QUEUE"] == {"Ref": "QueueName"}
    # Given an existing cache, its URL and secret are used instead.
    existing = Resolver(
        translated, overrides={"ExistingRedisUrl": "rediss://mine:6379/0", "ExistingRedisAuthSecretArn": "arn:secret"}
    )
    assert existing.value(env["INFERQ_REDIS_URL"]) == "rediss://mine:6379/0"
    assert existing.value(env["INFERQ_REDIS_AUTH_SECRET"]) == "arn:secret"


def test_gateway_finds_its_keys_and_its_scaler_in_the_stack(translated: dict[str, Any]) -> None:
    env = environment(translated, "GatewayFunction")
    assert env["INFERQ_API_KEYS_SECRET"] == {"Ref": "ApiKeysSecret"}
    assert translated["Resources"]["ApiKeysSecret"]["Type"] == "AWS::SecretsManager::Secret"
    assert env["INFERQ_SCALER_FUNCTION"] == {"Ref": "ScalerFunction"}
    assert env["INFERQ_MAX_QUEUE_DEPTH"] == {"Ref": "MaxQueueDepth"}
    assert env.get("INFERQ_API_KEYS", "") == ""  # development only: declared empty so sam local can set it


def test_scaler_sizes_the_gpu_service_of_the_stack(translated: dict[str, Any]) -> None:
    env = environment(translated, "ScalerFunction")
    assert env["INFERQ_ECS_CLUSTER"] == {"Fn::GetAtt": ["Gpu", "Outputs.ClusterName"]}
    assert env["INFERQ_ECS_SERVICE"] == {"Fn::GetAtt": ["Gpu", "Outputs.ServiceName"]}
    assert env["INFERQ_SCALE_MAX"] == {"Ref": "ScaleMax"}
    assert translated["Resources"]["Gpu"]["Properties"]["Parameters"]["MaxInstances"] == {"Ref": "ScaleMax"}
    # Target per worker defaults to the window: the variable is left out unless a target is given.
    resolved = Resolver(translated).value(env)
    assert "INFERQ_SCALE_TARGET_PER_WORKER" not in resolved
    assert (
        Resolver(translated, overrides={"ScaleTargetPerWorker": "4"}).value(env)["INFERQ_SCALE_TARGET_PER_WORKER"]
        == "4"
    )


def _inferq_variables(translated: dict[str, Any], gpu: dict[str, Any]) -> set[str]:
    names = {name for logical_id in FUNCTIONS for name in environment(translated, logical_id)}
    for entry in worker_container(gpu)["Environment"]:
        entry = entry["Fn::If"][1] if "Fn::If" in entry else entry
        names.add(entry["Name"])
    return {name for name in names if name.startswith("INFERQ_")}


def test_every_inferq_variable_the_stack_sets_is_a_setting(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    """A misspelt or unimplemented name would be silently ignored by the settings, not refused."""
    known = {Settings.variable(f) for f in Settings.__dataclass_fields__}
    assert _inferq_variables(translated, nested["gpu"]) - known == set()


@pytest.mark.parametrize("logical_id", FUNCTIONS)
def test_function_environment_parses_as_settings(translated: dict[str, Any], logical_id: str) -> None:
    env = Resolver(translated, attributes=ATTRIBUTES).value(environment(translated, logical_id))
    settings = Settings.from_env(env)
    assert settings.queue == "default"
    assert settings.redis_url.startswith("rediss://")


# --- IAM ---


def test_gateway_may_invoke_only_the_scaler_and_read_only_its_secrets(translated: dict[str, Any]) -> None:
    role = role_of(translated, "GatewayFunction")
    assert allowed(translated, role, "lambda:InvokeFunction") == [{"Fn::GetAtt": ["ScalerFunction", "Arn"]}]
    secrets = [Resolver(translated).value(r) for r in allowed(translated, role, "secretsmanager:GetSecretValue")]
    assert sorted(secrets) == ["ApiKeysSecret", "Cache.Outputs.GatewayAuthSecretArn"]
    actions = {a for owner, s in role_statements(translated) if owner == role for a in as_list(s["Action"])}
    files = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListBucket"}
    sealed = {"kms:GenerateDataKey", "kms:Decrypt"}  # the tenants' webhook secrets (tests/infra/test_iam_flows.py)
    assert actions == {"lambda:InvokeFunction", "secretsmanager:GetSecretValue"} | files | sealed


def test_scaler_may_update_only_the_gpu_service(translated: dict[str, Any]) -> None:
    """The GPU service, and with Spot (the default) its on-demand fallback service: nothing else."""
    role = role_of(translated, "ScalerFunction")
    for action in ("ecs:UpdateService", "ecs:DescribeServices"):
        (resource,) = allowed(translated, role, action)
        assert Resolver(translated).value(resource) == ["Gpu.Outputs.ServiceArn", "Gpu.Outputs.FallbackServiceArn"]
        assert Resolver(translated, overrides={"SpotCapacity": "disabled"}).value(resource) == "Gpu.Outputs.ServiceArn"
    assert allowed(translated, role, "secretsmanager:GetSecretValue") != []
    assert allowed(translated, role, "lambda:InvokeFunction") == []
    api_keys = [r for r in allowed(translated, role, "secretsmanager:GetSecretValue") if r == {"Ref": "ApiKeysSecret"}]
    assert api_keys == []


def test_worker_task_may_protect_only_tasks_of_its_cluster(nested: dict[str, dict[str, Any]]) -> None:
    gpu = nested["gpu"]
    resources = allowed(gpu, "TaskRole", "ecs:UpdateTaskProtection")
    assert resources == [{"Fn::Sub": "arn:${AWS::Partition}:ecs:${AWS::Region}:${AWS::AccountId}:task/${Cluster}/*"}]
    assert gpu["Resources"]["TaskDefinition"]["Properties"]["TaskRoleArn"] == {"Fn::GetAtt": ["TaskRole", "Arn"]}


def _all_templates(translated: dict[str, Any], nested: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {"template.yaml": translated, **{f"infra/{n}.yaml": t for n, t in nested.items()}}


def test_no_write_action_is_allowed_on_every_resource(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    broad = []
    for name, template in _all_templates(translated, nested).items():
        for role, statement in role_statements(template):
            assert "NotResource" not in statement and "NotAction" not in statement, (name, role, statement)
            for action in as_list(statement["Action"]):
                verb = action.split(":", 1)[1]
                if verb == "*" or (not verb.startswith(READ_ONLY_VERBS) and "*" in as_list(statement["Resource"])):
                    broad.append((name, role, action))
    assert broad == []


def test_roles_attach_only_the_aws_managed_policies_they_need(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    for template in _all_templates(translated, nested).values():
        for resource in template["Resources"].values():
            if resource["Type"] != "AWS::IAM::Role":
                continue
            for arn in resource["Properties"].get("ManagedPolicyArns", []):
                text = arn["Fn::Sub"] if isinstance(arn, dict) else arn
                assert re.sub(r"^arn:(aws|\$\{AWS::Partition\}):iam::aws:policy/", "", text) in MANAGED_POLICIES


# --- logs, outputs, nested stacks ---


def test_every_log_group_has_a_retention_and_each_function_its_own(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    for template in _all_templates(translated, nested).values():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] == "AWS::Logs::LogGroup":
                assert resource["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}, logical_id
    groups = {function(translated, f)["LoggingConfig"]["LogGroup"]["Ref"] for f in LAMBDAS}
    assert groups == {"GatewayLogGroup", "ScalerLogGroup", "AuthorizerLogGroup"}


def test_outputs_name_the_api_the_queue_and_the_services(translated: dict[str, Any]) -> None:
    outputs = translated["Outputs"]
    assert "${HttpApi}.execute-api" in outputs["ApiUrl"]["Value"]["Fn::Sub"]
    assert Resolver(translated).value(outputs["QueueEndpoint"]["Value"]) == "Cache.Outputs.RedisUrl"
    assert outputs["GatewayFunctionName"]["Value"] == {"Ref": "GatewayFunction"}
    assert outputs["ScalerFunctionName"]["Value"] == {"Ref": "ScalerFunction"}
    assert outputs["EcsClusterName"]["Value"] == {"Fn::GetAtt": ["Gpu", "Outputs.ClusterName"]}
    assert outputs["EcsServiceName"]["Value"] == {"Fn::GetAtt": ["Gpu", "Outputs.ServiceName"]}


def test_nested_stacks_come_from_infra(translated: dict[str, Any]) -> None:
    stacks = {
        logical_id: r["Properties"]["TemplateURL"]
        for logical_id, r in translated["Resources"].items()
        if r["Type"] == "AWS::CloudFormation::Stack"
    }
    assert stacks == {
        "Network": "infra/network.yaml",
        "Cache": "infra/cache.yaml",
        "Gpu": "infra/gpu.yaml",
        "Observability": "infra/observability.yaml",
    }


def test_an_existing_vpc_or_cache_replaces_the_created_one(translated: dict[str, Any]) -> None:
    resolver = Resolver(translated)
    assert resolver.condition("CreateCache")
    assert not resolver.condition("HasExistingCacheSecurityGroup")
    existing = Resolver(
        translated, overrides={"ExistingRedisUrl": "rediss://mine:6379/0", "ExistingCacheSecurityGroupId": "sg-0123"}
    )
    assert not existing.condition("CreateCache")
    assert existing.condition("HasExistingCacheSecurityGroup")
    network = translated["Resources"]["Network"]["Properties"]["Parameters"]
    assert network["ExistingVpcId"] == {"Ref": "ExistingVpcId"}


def test_network_spans_two_zones_with_the_endpoints_the_stack_calls(nested: dict[str, dict[str, Any]]) -> None:
    network = nested["network"]["Resources"]
    zones = {str(network[s]["Properties"]["AvailabilityZone"]) for s in ("PrivateSubnetA", "PrivateSubnetB")}
    assert len(zones) == 2
    services = {
        r["Properties"]["ServiceName"]["Fn::Sub"].rsplit("}.", 1)[1]
        for r in network.values()
        if r["Type"] == "AWS::EC2::VPCEndpoint"
    }
    assert services == {
        "s3",
        "ecr.api",
        "ecr.dkr",
        "logs",
        "secretsmanager",
        "ecs",
        "ecs-agent",
        "ecs-telemetry",
        "lambda",
        "monitoring",
    }


def test_cache_is_valkey_with_tls_and_a_token_generated_in_secrets_manager(nested: dict[str, dict[str, Any]]) -> None:
    cache = nested["cache"]["Resources"]
    for role in ("Gateway", "Scaler", "Worker"):
        assert cache[f"{role}AuthSecret"]["Properties"]["GenerateSecretString"]["GenerateStringKey"] == "token"
    group = cache["ReplicationGroup"]["Properties"]
    assert (group["Engine"], group["TransitEncryptionEnabled"], group["AtRestEncryptionEnabled"]) == (
        "valkey",
        True,
        True,
    )
    # RBAC, not one AUTH token: the role users and a disabled default user
    assert "AuthToken" not in group
    assert group["UserGroupIds"] == [{"Ref": "UserGroup"}]
    assert cache["UserGroup"]["Properties"]["UserIds"] == [
        {"Ref": "DefaultUser"}, {"Ref": "GatewayUser"}, {"Ref": "ScalerUser"}, {"Ref": "WorkerUser"}
    ]
    parameters = cache["ParameterGroup"]["Properties"]["Properties"]
    assert parameters["maxmemory-policy"] == "noeviction"
    # the same stream node size as the emulator's Valkey (emulator.valkey.STREAM_NODE_MAX_ENTRIES)
    assert parameters["stream-node-max-entries"] == str(STREAM_NODE_MAX_ENTRIES)
    serverless = cache["ServerlessCache"]["Properties"]
    assert serverless["Engine"] == "valkey"
    assert cache["DefaultUser"]["Properties"]["UserName"] == "default"
    assert cache["DefaultUser"]["Properties"]["AccessString"] == "off -@all"
    url = nested["cache"]["Outputs"]["RedisUrl"]["Value"]
    assert Resolver(nested["cache"]).value(url) == (
        "rediss://ReplicationGroup.PrimaryEndPoint.Address:ReplicationGroup.PrimaryEndPoint.Port/0"
    )
    assert Resolver(nested["cache"], overrides={"Mode": "serverless"}).value(url) == (
        "rediss://ServerlessCache.Endpoint.Address:ServerlessCache.Endpoint.Port?cluster=true"
    )


def test_gpu_fleet_scales_from_zero_on_a_managed_capacity_provider(nested: dict[str, dict[str, Any]]) -> None:
    gpu = nested["gpu"]
    resources = gpu["Resources"]
    assert gpu["Parameters"]["GpuAmiId"]["Default"] == (
        "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"
    )
    assert resources["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["ImageId"] == {"Ref": "GpuAmiId"}
    group = resources["AutoScalingGroup"]["Properties"]
    assert group["MinSize"] == "0"
    assert group["NewInstancesProtectedFromScaleIn"] is True
    provider = resources["CapacityProvider"]["Properties"]["AutoScalingGroupProvider"]
    assert provider["ManagedScaling"]["Status"] == "ENABLED"
    assert provider["ManagedTerminationProtection"] == "ENABLED"
    assert provider["ManagedDraining"] == "ENABLED"
    service = resources["Service"]["Properties"]
    assert service["DesiredCount"] == 0
    on_demand = Resolver(gpu, overrides={"SpotCapacity": "disabled"}).value(service["CapacityProviderStrategy"])
    assert [item["CapacityProvider"] for item in on_demand] == ["CapacityProvider"]  # tests/infra/test_spot.py: Spot
    assert "LaunchType" not in service


def test_gpu_task_runs_vllm_and_a_worker_that_waits_for_it(nested: dict[str, dict[str, Any]]) -> None:
    task = nested["gpu"]["Resources"]["TaskDefinition"]["Properties"]
    vllm, worker = task["ContainerDefinitions"]
    assert vllm["Name"] == "vllm"
    # vllm, started by env without the credentials' address (tests/infra/test_security.py holds the list)
    assert vllm["EntryPoint"][0] == "/usr/bin/env" and vllm["EntryPoint"][-1] == "vllm"
    assert vllm["Command"][:2] == ["serve", {"Ref": "ModelId"}]
    assert vllm["Image"] == {"Ref": "VllmImage"}
    assert vllm["ResourceRequirements"] == [{"Type": "GPU", "Value": "1"}]
    assert "8000/health" in " ".join(vllm["HealthCheck"]["Command"])
    assert worker["Command"] == ["python", "-m", "gpu_worker"]
    # started beside the model server: the worker waits for /health itself (tests/integration/worker/test_boot.py)
    assert worker["DependsOn"] == [{"ContainerName": "vllm", "Condition": "START"}]
    assert vllm["Essential"] is True and worker["Essential"] is True  # either dying stops the task
    assert worker["StopTimeout"] + vllm["StopTimeout"] <= 120  # within a Spot notice (tests/infra/test_spot.py)
    env = Resolver(
        nested["gpu"], overrides={"RedisUrl": "rediss://cache:6379/0", "RedisAuthSecretArn": "arn:secret"}
    ).value(worker["Environment"])
    env = {e["Name"]: e["Value"] for e in env}
    assert env["INFERQ_BACKEND"] == "openai"
    assert env["INFERQ_OPENAI_BASE_URL"] == "http://127.0.0.1:8000"  # vLLM listens on loopback only
    # the worker's cache credentials come from ECS into its container alone, not through the task role
    assert "INFERQ_REDIS_AUTH_SECRET" not in env
    container = Resolver(nested["gpu"], overrides={"RedisUrl": "r", "RedisAuthSecretArn": "arn:secret"}).value(worker)
    assert {"Name": "INFERQ_REDIS_AUTH", "ValueFrom": "arn:secret"} in container["Secrets"]
    assert int(env["INFERQ_DRAIN_S"]) < worker["StopTimeout"]
    Settings.from_env(env)


def test_alarms_watch_the_scaler_metrics_by_queue(nested: dict[str, dict[str, Any]]) -> None:
    resources = nested["observability"]["Resources"]
    expressions = " ".join(
        query["Expression"]["Fn::Sub"]
        for r in resources.values()
        if r["Type"] == "AWS::CloudWatch::Alarm"
        for query in r["Properties"].get("Metrics", [])
        if isinstance(query.get("Expression"), dict)
    )
    for metric in ("Dlq", "OldestJobAgeSeconds", "Lag"):
        assert f"MAX({metric}) FROM inferq WHERE queue = '${{QueueName}}'" in expressions
    assert "AWS::CloudWatch::Dashboard" in {r["Type"] for r in resources.values()}


def test_a_tenant_past_80_percent_of_a_budget_alarms_with_or_without_a_registry(nested: dict[str, dict[str, Any]]
                                                                                 ) -> None:
    """Issue 48: the warning at 80 %, over every tenant's BudgetUsedPercent (the scaler's), whatever the queues."""
    from inferq.usage.budgets import WARN_AT

    alarm = nested["observability"]["Resources"]["BudgetWarningAlarm"]
    assert "Condition" not in alarm  # a registry's stack (QueueName "") keeps it: budgets span the models
    properties = alarm["Properties"]
    assert properties["Metrics"][0]["Expression"] == "SELECT MAX(BudgetUsedPercent) FROM inferq"
    assert properties["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert properties["Threshold"] == WARN_AT * 100 and properties["AlarmActions"] == [{"Ref": "AlarmTopic"}]


def test_the_cache_memory_alarm_watches_the_stacks_own_cache_in_each_mode(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    """G11: the cache runs with noeviction, so an alarm says when it nears full, long before a write is refused."""
    parameters = translated["Resources"]["Observability"]["Properties"]["Parameters"]
    assert parameters["CacheMode"] == {"Fn::If": ["CreateCache", {"Ref": "CacheMode"}, ""]}
    assert parameters["CacheName"] == {"Fn::If": ["CreateCache", {"Fn::GetAtt": ["Cache", "Outputs.Name"]}, "none"]}
    observability = nested["observability"]
    alarms = {r["Condition"]: r["Properties"] for r in observability["Resources"].values()
              if r["Type"] == "AWS::CloudWatch::Alarm" and r.get("Condition", "").startswith("Watches")
              and r["Condition"] not in ("WatchesQueue", "WatchesNoQueue", "WatchesStreamingGateway")}
    assert set(alarms) == {"WatchesReplicationGroup", "WatchesServerless", "WatchesMemoryDb"}
    for alarm in alarms.values():
        assert alarm["Threshold"] == {"Ref": "CacheMemoryThresholdPercent"}
        assert alarm["AlarmActions"] == [{"Ref": "AlarmTopic"}]
    assert observability["Parameters"]["CacheMemoryThresholdPercent"]["Default"] == 80
    node = alarms["WatchesReplicationGroup"]
    assert node["MetricName"] == "DatabaseMemoryUsagePercentage"
    assert node["Dimensions"] == [{"Name": "CacheClusterId", "Value": {"Fn::Sub": "${CacheName}-001"}}]
    conditions = observability["Conditions"]
    for condition, mode in (("WatchesReplicationGroup", "replication-group"), ("WatchesServerless", "serverless"),
                            ("WatchesMemoryDb", "memorydb")):
        assert conditions[condition] == {"Fn::Equals": [{"Ref": "CacheMode"}, mode]}
        assert mode in nested["cache"]["Parameters"]["Mode"]["AllowedValues"]
    assert "Name" in nested["cache"]["Outputs"] and "MaxDataGb" in nested["cache"]["Outputs"]


# --- the job timeout, the webhook secret, one scaler at a time, durability (issue 11) ---


def test_the_job_timeout_reaches_the_workers_that_enforce_it_and_not_the_gateway(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    assert "INFERQ_JOB_TIMEOUT_S" not in environment(translated, "GatewayFunction")
    gpu_parameters = translated["Resources"]["Gpu"]["Properties"]["Parameters"]
    assert gpu_parameters["JobTimeoutSeconds"] == {"Ref": "JobTimeoutSeconds"}
    env = worker_environment(nested["gpu"], JobTimeoutSeconds="900")
    assert Settings.from_env(env).job_timeout_s == 900
    default = translated["Parameters"]["JobTimeoutSeconds"]["Default"]
    assert worker_environment(nested["gpu"])["INFERQ_JOB_TIMEOUT_S"] == str(default)


def test_the_deployment_wide_webhook_key_is_off_unless_asked_for(translated: dict[str, Any]) -> None:
    """L1 (issue 47): a key that signs every tenant's webhooks lets whoever holds it forge any of them. By default
    there is none: no secret, no variable, no grant, an empty output; tenants' own secrets sign."""
    assert translated["Parameters"]["SharedWebhookKey"]["Default"] == "off"
    resolver = Resolver(translated)
    assert not resolver.condition("HasSharedWebhookKey") and not resolver.condition("CreateWebhookSecret")
    assert "INFERQ_WEBHOOK_SECRET_ID" not in resolver.value(environment(translated, "ScalerFunction"))
    assert resolver.value(translated["Outputs"]["WebhookSecretArn"]["Value"]) == ""
    role = role_of(translated, "ScalerFunction")
    reads = [resolver.value(s) for owner, s in role_statements(translated) if owner == role
             and "secretsmanager:GetSecretValue" in as_list(s["Action"])]
    assert [r for r in reads if r and r.get("Resource") in ("WebhookSecret", WEBHOOK_ARN)] == []
    # an ARN with the key off is refused at deploy time (the template's description and DEPLOY.md say so too)
    rule = translated["Rules"]["SharedWebhookKeyNeedsOn"]
    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "SharedWebhookKey"}, "off"]}
    assert rule["Assertions"][0]["Assert"] == {"Fn::Equals": [{"Ref": "WebhookSecretArn"}, ""]}
    for text in (translated["Parameters"]["SharedWebhookKey"]["Description"], (ROOT / "DEPLOY.md").read_text()):
        assert "forge" in text


def test_a_shared_webhook_key_reaches_the_scaler_by_reference_only(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    resources = translated["Resources"]
    generated = resources["WebhookSecret"]
    assert generated["Type"] == "AWS::SecretsManager::Secret"
    assert generated["Properties"]["GenerateSecretString"]["PasswordLength"] >= 32
    scaler_env = environment(translated, "ScalerFunction")
    on = {"SharedWebhookKey": "on"}
    for resolver, arn in ((Resolver(translated, overrides=on), "WebhookSecret"),
                          (Resolver(translated, overrides={**on, "WebhookSecretArn": WEBHOOK_ARN}), WEBHOOK_ARN)):
        assert resolver.value(scaler_env)["INFERQ_WEBHOOK_SECRET_ID"] == arn
        assert resolver.value(translated["Outputs"]["WebhookSecretArn"]["Value"]) == arn
    assert not Resolver(translated, overrides={**on, "WebhookSecretArn": WEBHOOK_ARN}).condition(
        "CreateWebhookSecret")
    # the value itself never sits in a function or task definition
    for logical_id in FUNCTIONS:
        assert "INFERQ_WEBHOOK_SECRET" not in environment(translated, logical_id)
    # the GPU tasks deliver no webhook (no route to the internet): no key, no variable, no grant
    gpu = nested["gpu"]
    assert "WebhookSecretArn" not in translated["Resources"]["Gpu"]["Properties"]["Parameters"]
    assert worker_environment(gpu)["INFERQ_WORKER_WEBHOOKS"] == "false"
    assert "INFERQ_WEBHOOK_SECRET" not in json.dumps(gpu)


def _policies(gpu: dict[str, Any], role: str, **overrides: str) -> Any:
    return Resolver(gpu, overrides={"RedisUrl": "r", **overrides}).value(
        gpu["Resources"][role]["Properties"].get("Policies", [])
    )


def test_only_the_scaler_may_read_the_webhook_secret(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    resolver = Resolver(translated, overrides={"SharedWebhookKey": "on"})
    readers = {
        owner
        for owner, statement in role_statements(translated)
        if "secretsmanager:GetSecretValue" in as_list(statement["Action"])
        and resolver.value(statement["Resource"]) == "WebhookSecret"
    }
    assert readers == {role_of(translated, "ScalerFunction")}
    gpu = nested["gpu"]
    # the execution role reads the workers' cache secret alone (the Hugging Face token is the instances')
    assert _policies(gpu, "TaskExecutionRole", HuggingFaceTokenSecretArn=HF_ARN) is NO_VALUE
    assert HF_ARN not in json.dumps(_policies(gpu, "TaskRole", HuggingFaceTokenSecretArn=HF_ARN))


def test_scaler_invocations_never_overlap(translated: dict[str, Any]) -> None:
    assert function(translated, "ScalerFunction")["ReservedConcurrentExecutions"] == 1


def test_wait_replicas_reach_the_gateway_and_the_workers(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    assert environment(translated, "GatewayFunction")["INFERQ_REDIS_WAIT_REPLICAS"] == {"Ref": "RedisWaitReplicas"}
    gpu_parameters = translated["Resources"]["Gpu"]["Properties"]["Parameters"]
    assert gpu_parameters["RedisWaitReplicas"] == {"Ref": "RedisWaitReplicas"}
    assert translated["Parameters"]["RedisWaitReplicas"]["Default"] == 0
    assert Settings.from_env(worker_environment(nested["gpu"], RedisWaitReplicas="1")).redis_wait_replicas == 1


def test_memorydb_is_a_durable_cache_option_behind_the_same_url_and_token(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    cache = nested["cache"]
    resources = cache["Resources"]
    memorydb = Resolver(cache, overrides={"Mode": "memorydb"})
    assert memorydb.condition("IsMemoryDb")
    assert not memorydb.condition("IsReplicationGroup") and not memorydb.condition("IsServerless")
    assert not Resolver(cache).condition("IsMemoryDb")  # ElastiCache stays the default
    for name in ("MemoryDbCluster", "MemoryDbGatewayUser", "MemoryDbScalerUser", "MemoryDbWorkerUser", "MemoryDbAcl",
                 "MemoryDbSubnetGroup", "MemoryDbParameterGroup"):
        assert resources[name]["Condition"] == "IsMemoryDb", name
    cluster = memorydb.value(resources["MemoryDbCluster"]["Properties"])
    assert (cluster["Engine"], cluster["TLSEnabled"], cluster["Port"]) == ("valkey", True, 6379)
    assert (cluster["ACLName"], cluster["SubnetGroupName"], cluster["SecurityGroupIds"]) == (
        "MemoryDbAcl",
        "MemoryDbSubnetGroup",
        ["CacheSecurityGroup"],
    )
    assert cluster["NumReplicasPerShard"] == 1  # two nodes: a primary and a replica in another zone
    one_node = Resolver(cache, overrides={"Mode": "memorydb", "Nodes": "1"})
    assert one_node.value(resources["MemoryDbCluster"]["Properties"]["NumReplicasPerShard"]) == 0
    params = memorydb.value(resources["MemoryDbParameterGroup"]["Properties"])
    assert params["Parameters"] == {"maxmemory-policy": "noeviction"}
    users = [f"MemoryDb{role}User" for role in ("Gateway", "Scaler", "Worker")]
    assert resources["MemoryDbAcl"]["Properties"]["UserNames"] == [{"Ref": name} for name in users]
    for role, name in zip(("Gateway", "Scaler", "Worker"), users, strict=True):
        user = resources[name]["Properties"]
        token = TOKEN_REF.replace("AuthSecret", f"{role}AuthSecret")
        assert user["AuthenticationMode"] == {"Type": "password", "Passwords": [{"Fn::Sub": token}]}
        # The secret names the ACL user, so clients authenticate as it with the token (MemoryDB reserves "default").
        template = resources[f"{role}AuthSecret"]["Properties"]["GenerateSecretString"]["SecretStringTemplate"]
        assert json.loads(memorydb.value(template)) == {"username": memorydb.value(user["UserName"])}
    url = memorydb.value(cache["Outputs"]["RedisUrl"]["Value"])
    assert url == "rediss://MemoryDbCluster.ClusterEndpoint.Address:6379?cluster=true"
    assert Settings(redis_url=url).redis_url == url
    # The root stack chooses it with CacheMode and hands its URL and secret to every process as before.
    assert "memorydb" in translated["Parameters"]["CacheMode"]["AllowedValues"]
    cache_parameters = translated["Resources"]["Cache"]["Properties"]["Parameters"]
    assert cache_parameters["Mode"] == {"Ref": "CacheMode"}
    assert cache_parameters["MemoryDbNodeType"] == {"Ref": "MemoryDbNodeType"}


def test_the_gateway_concurrency_one_tenant_can_take_is_what_the_docs_state(source: dict[str, Any]) -> None:
    """G11: a wait holds a gateway execution; one tenant holds at most TenantMaxWaits of the reserved ones, and
    docs/operations.md ("Sizing the gateway") says how many tenants at the cap fill the reservation."""
    waits = int(source["Parameters"]["TenantMaxWaits"]["Default"])
    reserved = int(source["Parameters"]["GatewayReservedConcurrency"]["Default"])
    assert 0 < waits < reserved  # one tenant alone can never take the gateway
    page = (ROOT / "docs" / "operations.md").read_text()
    stated = re.search(r"At the defaults one tenant can hold (\d+) of the (\d+) reserved executions", page)
    assert stated is not None and (int(stated.group(1)), int(stated.group(2))) == (waits, reserved)
    assert f"**{math.ceil(reserved / waits)} tenants at the cap together**" in page
