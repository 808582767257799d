"""The deployment of a model registry (scripts/gen_model_stacks.py): one GPU fleet per model in one cluster.

A two-model registry (a vLLM-served chat model with its own instance type and scale, a mock embedding model with
its own image) is generated into a scratch directory; the result must pass cfn-lint and ``sam validate --lint``,
give each model its launch template, Auto Scaling group, capacity provider, task definition and service, let the
scaler update exactly those services, hand every process the same registry, and set only variables the processes
read. Without a registry, template.yaml and infra/gpu.yaml stay the one-service deployment they were.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cfnlint import api as cfn_lint

from inferq.config.settings import Settings
from inferq.scaling.capacity import fallback_service
from scripts import gen_model_stacks
from scripts.deploy_registry import RegistryError

from .cfn import NESTED, ROOT, SAM_VENV, TEMPLATE, Resolver, as_list, load, role_statements, run, sam_env
from .test_environment_is_read import container_variables, function_variables, unread

REGISTRY = """\
default: chat
models:
  - name: chat
    aliases: [gpt-4o-mini]
    window: 8
    scale: {min: 0, max: 3, target_per_worker: 8}
    backend:
      kind: vllm
      args: {model: Qwen/Qwen2.5-1.5B-Instruct, max_model_len: 4096, enforce_eager: true, disable_log_stats: false,
             override_generation_config: {temperature: 0.5}, allowed_origins: [a, b]}
    deploy: {instance_type: g6.xlarge, gpus: 1, memory_mib: 15000, spot_instance_types: [g6.xlarge, g6.2xlarge],
             on_demand_base: 1}
  - name: embed.small
    queue: embed
    backend: {kind: mock}
    deploy: {instance_type: g5.2xlarge, spot: false,
             image: "123456789012.dkr.ecr.us-east-1.amazonaws.com/inferq-worker@sha256:\
e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1"}
"""
EMBED_DIGEST = "sha256:" + "e1" * 32
MODELS = {"Chat": ("chat", "chat", "inferq-chat"), "EmbedSmall": ("embed.small", "embed", "inferq-embed")}
FLEET = ("LaunchTemplate", "AutoScalingGroup", "CapacityProvider", "TaskDefinition", "Service")
SPOT = ("SpotAutoScalingGroup", "SpotCapacityProvider", "FallbackService")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated files for the two-model registry, under a scratch directory."""
    directory = tmp_path_factory.mktemp("models")
    registry = directory / "models.yaml"
    registry.write_text(REGISTRY)
    written = gen_model_stacks.generate(registry, directory / "out")
    assert sorted(p.relative_to(directory / "out").as_posix() for p in written) == [
        "infra/models.generated.yaml",
        "infra/registry/inferq/models.json",
        "template.models.yaml",
    ]
    return directory / "out"


@pytest.fixture(scope="module")
def gpu(generated: Path) -> dict[str, Any]:
    return load(generated / "infra" / "models.generated.yaml")


@pytest.fixture(scope="module")
def root(generated: Path, sam: Path) -> dict[str, Any]:
    """template.models.yaml after the SAM transform."""
    result = run(
        [str(SAM_VENV / "bin" / "python"), str(ROOT / "tests" / "infra" / "sam_translate.py"),
         str(generated / "template.models.yaml")],
        env=sam_env(),
    )
    return json.loads(result.stdout)


def containers(gpu: dict[str, Any], suffix: str) -> dict[str, dict[str, Any]]:
    definitions = gpu["Resources"][f"TaskDefinition{suffix}"]["Properties"]["ContainerDefinitions"]
    return {c["Name"]: c for c in definitions}


def worker_env(gpu: dict[str, Any], suffix: str) -> dict[str, str]:
    resolver = Resolver(gpu, overrides={"RedisUrl": "rediss://cache:6379/0", "FilesBucket": "files"})
    return {e["Name"]: e["Value"] for e in resolver.value(containers(gpu, suffix)["worker"]["Environment"])}


# --- the tools accept it ---


@pytest.mark.parametrize("name", ["template.models.yaml", "infra/models.generated.yaml"])
def test_generated_templates_pass_cfn_lint(generated: Path, name: str) -> None:
    matches = cfn_lint.lint_file(generated / name, config=cfn_lint.ManualArgs(regions=["us-east-1"]))
    assert not matches, "\n".join(str(m) for m in matches)


@pytest.mark.parametrize(
    "models",
    [
        [{"name": "only-mock", "backend": {"kind": "mock"}}],  # no sidecar anywhere: no vLLM parameter left over
        [{"name": "remote", "backend": {"kind": "openai", "base_url": "http://10.0.0.5:8000"}},
         {"name": "local", "scale": {"max": 0}}],  # nothing under deploy: the stack's defaults
    ],
    ids=["one-mock-model", "openai-and-defaults"],
)
def test_other_registry_shapes_lint_clean_too(tmp_path: Path, models: list[dict[str, Any]]) -> None:
    registry = tmp_path / "models.json"
    registry.write_text(json.dumps({"models": models}))
    for path in gen_model_stacks.generate(registry, tmp_path / "out"):
        if path.suffix == ".yaml":
            matches = cfn_lint.lint_file(path, config=cfn_lint.ManualArgs(regions=["us-east-1"]))
            assert not matches, "\n".join(str(m) for m in matches)


def test_generated_root_passes_sam_validate_lint(generated: Path, sam: Path) -> None:
    result = run([str(sam), "validate", "--lint", "--region", "us-east-1", "--template", "template.models.yaml"],
                 cwd=generated, env=sam_env())
    assert "is a valid SAM Template" in result.stdout + result.stderr


@pytest.mark.slow
def test_sam_build_takes_the_generated_root_and_packages_the_registry_layer(
    generated: Path, sam: Path, tmp_path: Path
) -> None:
    """What `sam deploy` would upload: both functions built, the layer's directory holding inferq/models.json (a
    layer unpacks under /opt, where INFERQ_MODELS points)."""
    build = tmp_path / "build"
    # as samconfig.toml builds (this directory has none): in place and in parallel, never copying the repository
    # (its .venv and .tools) into a scratch directory per function
    run([str(sam), "build", "--template", "template.models.yaml", "--build-dir", str(build), "--build-in-source",
         "--parallel"], cwd=generated, env=sam_env())
    built = load(build / "template.yaml")
    layer = built["Resources"]["ModelRegistry"]["Properties"]["ContentUri"]
    content = (build / layer).resolve() / gen_model_stacks.LAYER_FILE
    assert json.loads(content.read_text()) == json.loads(
        (generated / gen_model_stacks.LAYER_DIR / gen_model_stacks.LAYER_FILE).read_text()
    )
    assert (build / "Gpu" / "template.yaml").is_file()  # the generated GPU stack, as a nested stack
    for function in ("GatewayFunction", "ScalerFunction"):
        assert (build / function / "inferq" / "__init__.py").is_file()


# --- one fleet per model ---


def test_each_model_has_its_own_fleet_in_the_one_cluster(gpu: dict[str, Any]) -> None:
    resources = gpu["Resources"]
    assert not set(FLEET) & set(resources)  # the single fleet of infra/gpu.yaml is gone
    for suffix, (_name, _queue, service) in MODELS.items():
        assert {f"{r}{suffix}" for r in FLEET} <= set(resources)
        group = resources[f"AutoScalingGroup{suffix}"]["Properties"]
        assert group["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": f"LaunchTemplate{suffix}"}
        assert group["MinSize"] == "0"
        provider = resources[f"CapacityProvider{suffix}"]["Properties"]["AutoScalingGroupProvider"]
        assert provider["AutoScalingGroupArn"] == {"Ref": f"AutoScalingGroup{suffix}"}
        assert provider["ManagedTerminationProtection"] == "ENABLED"
        properties = resources[f"Service{suffix}"]["Properties"]
        assert properties["ServiceName"] == service
        assert properties["Cluster"] == {"Ref": "Cluster"}
        assert properties["TaskDefinition"] == {"Ref": f"TaskDefinition{suffix}"}
        assert properties["DesiredCount"] == 0
        strategy = Resolver(gpu).value(properties["CapacityProviderStrategy"])
        assert strategy[0]["CapacityProvider"] == f"CapacityProvider{suffix}"  # on-demand: the base, or all
    associations = Resolver(gpu).value(resources["ClusterCapacityProviders"]["Properties"]["CapacityProviders"])
    assert associations == ["CapacityProviderChat", "CapacityProviderEmbedSmall", "SpotCapacityProviderChat"]
    instance_types = {s: resources[f"LaunchTemplate{s}"]["Properties"]["LaunchTemplateData"]["InstanceType"]
                      for s in MODELS}
    assert instance_types == {"Chat": "g6.xlarge", "EmbedSmall": "g5.2xlarge"}
    # scale.max bounds the chat fleet's instances; the other keeps the stack's ScaleMax (MaxInstances)
    assert resources["AutoScalingGroupChat"]["Properties"]["MaxSize"] == "3"
    assert resources["AutoScalingGroupEmbedSmall"]["Properties"]["MaxSize"] == {"Ref": "MaxInstances"}
    assert "InstanceType" not in gpu["Parameters"]  # every model names its own: no unused parameter left


def test_a_model_runs_on_spot_of_its_own_types_with_its_fallback_unless_it_opts_out(
    gpu: dict[str, Any], generated: Path, root: dict[str, Any]
) -> None:
    resources = gpu["Resources"]
    assert {f"{r}Chat" for r in SPOT} <= set(resources)
    assert not {f"{r}EmbedSmall" for r in SPOT} & set(resources)  # deploy.spot: false
    group = resources["SpotAutoScalingGroupChat"]["Properties"]
    assert group["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"] == [
        {"InstanceType": "g6.xlarge"}, {"InstanceType": "g6.2xlarge"}]
    assert group["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"]["LaunchTemplateId"] == {
        "Ref": "LaunchTemplateChat"}
    assert group["MaxSize"] == "3"
    provider = resources["SpotCapacityProviderChat"]["Properties"]["AutoScalingGroupProvider"]
    assert provider["AutoScalingGroupArn"] == {"Ref": "SpotAutoScalingGroupChat"}
    strategy = Resolver(gpu).value(resources["ServiceChat"]["Properties"]["CapacityProviderStrategy"])
    assert strategy == [{"CapacityProvider": "CapacityProviderChat", "Base": 1, "Weight": "0"},
                        {"CapacityProvider": "SpotCapacityProviderChat", "Weight": 10}]
    fallback = resources["FallbackServiceChat"]["Properties"]
    assert fallback["ServiceName"] == fallback_service("inferq-chat")
    assert fallback["TaskDefinition"] == {"Ref": "TaskDefinitionChat"}
    assert fallback["CapacityProviderStrategy"] == [{"CapacityProvider": {"Ref": "CapacityProviderChat"}, "Weight": 1}]
    embed = resources["ServiceEmbedSmall"]["Properties"]
    assert embed["CapacityProviderStrategy"] == [
        {"CapacityProvider": {"Ref": "CapacityProviderEmbedSmall"}, "Weight": 1, "Base": 0}]
    # the scaler sizes chat's fallback service, and no fallback for embed, which has none
    entries = {e["name"]: e for e in json.loads(
        (generated / "infra" / "registry" / "inferq" / "models.json").read_text())["models"]}
    assert entries["embed.small"]["scale"]["spot_fallback_s"] == 0 and "scale" in entries["chat"]
    assert "spot_fallback_s" not in entries["chat"]["scale"]
    role = root["Resources"]["ScalerFunction"]["Properties"]["Role"]["Fn::GetAtt"][0]
    updates = [s["Resource"] for owner, s in role_statements(root)
               if owner == role and "ecs:UpdateService" in as_list(s["Action"])]
    assert Resolver(root).value(updates) == [[
        "Gpu.Outputs.ServiceChatArn", "Gpu.Outputs.ServiceEmbedSmallArn", "Gpu.Outputs.FallbackServiceChatArn"]]
    assert Resolver(root, overrides={"SpotCapacity": "disabled"}).value(updates) == [[
        "Gpu.Outputs.ServiceChatArn", "Gpu.Outputs.ServiceEmbedSmallArn"]]


def test_the_vllm_sidecar_runs_the_registry_args_and_a_mock_model_gets_no_gpu(gpu: dict[str, Any]) -> None:
    chat = containers(gpu, "Chat")
    command = chat["vllm"]["Command"]
    assert command[:4] == ["serve", "Qwen/Qwen2.5-1.5B-Instruct", "--served-model-name", "chat"]
    assert command[command.index("--max-model-len") + 1] == "4096"
    assert "--enforce-eager" in command and "--disable-log-stats" not in command
    assert command[command.index("--override-generation-config") + 1] == '{"temperature":0.5}'
    assert command[command.index("--allowed-origins") + 1:][:2] == ["a", "b"]
    assert command[command.index("--gpu-memory-utilization") + 1] == "0.90"  # the stack's default
    # loopback, and the single-model task's logging flags last, where no registry argument can override them
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[-5:] == ["--no-enable-log-requests", "--no-enable-log-outputs", "--max-log-len", "0",
                            "--disable-uvicorn-access-log"]
    assert chat["vllm"]["ResourceRequirements"] == [{"Type": "GPU", "Value": "1"}]
    assert chat["vllm"]["MemoryReservation"] == 15000
    assert chat["worker"]["DependsOn"] == [{"ContainerName": "vllm", "Condition": "START"}]  # beside the server
    embed = containers(gpu, "EmbedSmall")
    assert list(embed) == ["worker"]
    assert embed["worker"]["Image"] == "123456789012.dkr.ecr.us-east-1.amazonaws.com/inferq-worker@" + EMBED_DIGEST
    assert "DependsOn" not in embed["worker"] and "ResourceRequirements" not in embed["worker"]
    assert chat["worker"]["Image"] == gpu["Outputs"]["WorkerImage"]["Value"]  # the stack's default image


def test_gpus_above_one_spread_the_model_over_them(tmp_path: Path) -> None:
    registry = tmp_path / "models.json"
    registry.write_text(json.dumps({"models": [{"name": "big", "deploy": {"gpus": 4}}]}))
    gen_model_stacks.generate(registry, tmp_path)
    vllm = containers(load(tmp_path / "infra" / "models.generated.yaml"), "Big")["vllm"]
    assert vllm["Command"][vllm["Command"].index("--tensor-parallel-size") + 1] == "4"
    assert vllm["ResourceRequirements"] == [{"Type": "GPU", "Value": "4"}]
    assert vllm["Command"][1] == "big"  # no args.model: it serves the model's own name


# --- every process reads the same registry ---


def test_every_worker_and_both_functions_read_the_deployed_registry(generated: Path, gpu: dict[str, Any],
                                                                   root: dict[str, Any]) -> None:
    document = json.loads((generated / "infra" / "registry" / "inferq" / "models.json").read_text())
    entries = {e["name"]: e for e in document["models"]}
    assert document["default"] == "chat"
    for suffix, (name, queue, service) in MODELS.items():
        assert (entries[name]["queue"], entries[name]["service"]) == (queue, service)  # written out, not implied
        env = worker_env(gpu, suffix)
        assert env["INFERQ_MODEL"] == name
        assert env["INFERQ_MODELS"] == gen_model_stacks.WORKER_REGISTRY
        assert "INFERQ_QUEUE" not in env and "INFERQ_BACKEND" not in env  # the entry decides them
        assert json.loads(containers(gpu, suffix)["worker"]["Command"][-1]) == {"models": [entries[name]]}
        Settings.from_env(env)
    # the sidecar-served model is, to its worker, an OpenAI-compatible server on localhost
    assert entries["chat"]["backend"] == {"kind": "openai", "base_url": "http://127.0.0.1:8000", "served_model": "chat"}
    assert entries["embed.small"]["backend"] == {"kind": "mock"}
    # SAM names the layer version ModelRegistry<hash of its content>: a changed registry is a new version
    (layer,) = [k for k, r in root["Resources"].items() if r["Type"] == "AWS::Lambda::LayerVersion"]
    assert layer.startswith("ModelRegistry")
    for function in ("GatewayFunction", "ScalerFunction"):
        properties = root["Resources"][function]["Properties"]
        assert properties["Layers"] == [{"Ref": layer}]
        variables = properties["Environment"]["Variables"]
        assert variables["INFERQ_MODELS"] == "/opt/" + gen_model_stacks.LAYER_FILE
        assert "INFERQ_QUEUE" not in variables
    assert "INFERQ_ECS_SERVICE" not in root["Resources"]["ScalerFunction"]["Properties"]["Environment"]["Variables"]


def test_the_worker_command_writes_the_registry_then_becomes_the_worker(gpu: dict[str, Any], tmp_path: Path) -> None:
    """The container's own command, run by a real sh, with a stand-in ``python`` that shows what it was given."""
    command = containers(gpu, "Chat")["worker"]["Command"]
    stand_in = tmp_path / "bin" / "python"
    stand_in.parent.mkdir()
    stand_in.write_text('#!/bin/sh\necho "args: $*"\ncat "$INFERQ_MODELS"\n')
    stand_in.chmod(0o755)
    target = tmp_path / "models.json"
    env = {"PATH": f"{stand_in.parent}:{os.environ['PATH']}", "INFERQ_MODELS": str(target)}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=True)
    first, rest = result.stdout.split("\n", 1)
    assert first == "args: -m gpu_worker"
    assert json.loads(rest) == json.loads(target.read_text()) == json.loads(command[-1])


def test_adding_a_model_leaves_the_other_fleets_as_they_were(gpu: dict[str, Any], tmp_path: Path) -> None:
    """A new model must not roll the running GPU tasks of the others (a new task definition each would)."""
    registry = tmp_path / "models.yaml"
    registry.write_text(REGISTRY + "  - name: rerank\n    backend: {kind: mock}\n")
    gen_model_stacks.generate(registry, tmp_path)
    grown = load(tmp_path / "infra" / "models.generated.yaml")["Resources"]
    assert "ServiceRerank" in grown
    for suffix in MODELS:
        for resource in FLEET:
            assert grown[resource + suffix] == gpu["Resources"][resource + suffix], resource + suffix


def test_every_variable_of_the_generated_processes_is_read(root: dict[str, Any], gpu: dict[str, Any]) -> None:
    for function in ("GatewayFunction", "ScalerFunction"):
        assert unread(function, function_variables(root, function)) == []
    for suffix in MODELS:
        task = gpu["Resources"][f"TaskDefinition{suffix}"]
        assert unread("worker", container_variables(task, "worker")) == []


# --- IAM and alarms ---


def test_the_scaler_may_update_exactly_the_models_services(root: dict[str, Any], gpu: dict[str, Any]) -> None:
    role = root["Resources"]["ScalerFunction"]["Properties"]["Role"]["Fn::GetAtt"][0]
    ecs = [s for owner, s in role_statements(root) if owner == role
           and any(a.startswith("ecs:") for a in as_list(s["Action"]))]
    assert sorted(a for s in ecs for a in as_list(s["Action"])) == [
        "ecs:DescribeServices", "ecs:DescribeTasks", "ecs:ListTasks", "ecs:UpdateService"]
    services = [s for s in ecs if as_list(s["Action"])[0].endswith("Services") or "UpdateService" in s["Action"]]
    for statement in services:  # and, with Spot, the Spot models' fallback services (test above)
        outputs = [r["Fn::GetAtt"] for r in statement["Resource"] if "Fn::GetAtt" in r]
        assert outputs == [["Gpu", f"Outputs.Service{s}Arn"] for s in MODELS]
    for statement in ecs:  # the Spot tasks' waits: read-only, in the one cluster
        if statement not in services:
            cluster = {"Fn::GetAtt": ["Gpu", "Outputs.ClusterArn"]}
            assert statement["Condition"] == {"ArnEquals": {"ecs:cluster": cluster}}
    # the count and nothing else, on any of the models' task definitions and capacity providers
    update = next(s for s in ecs if as_list(s["Action"]) == ["ecs:UpdateService"])["Condition"]
    assert update["ArnEqualsIfExists"]["ecs:task-definition"] == [
        {"Fn::GetAtt": ["Gpu", f"Outputs.TaskDefinition{s}Arn"]} for s in MODELS]
    assert update["StringEqualsIfExists"]["ecs:capacity-provider"] == [
        {"Fn::GetAtt": ["Gpu", f"Outputs.CapacityProvider{s}Name"]} for s in MODELS]
    for suffix in MODELS:
        assert gpu["Outputs"][f"TaskDefinition{suffix}Arn"]["Value"] == {"Ref": f"TaskDefinition{suffix}"}
    for suffix in MODELS:  # each output is the ARN of that model's service
        assert gpu["Outputs"][f"Service{suffix}Arn"]["Value"] == {"Ref": f"Service{suffix}"}
    assert root["Resources"]["Gpu"]["Properties"]["TemplateURL"] == "infra/models.generated.yaml"


def test_each_model_has_its_alarms_and_the_single_queue_ones_are_off(root: dict[str, Any]) -> None:
    resources = root["Resources"]
    for suffix, (_name, queue, _service) in MODELS.items():
        for alarm, query in (("DlqNotEmptyAlarm", "MAX(Dlq)"), ("OldestJobAgeAlarm", "MAX(OldestJobAgeSeconds)"),
                             ("ScalerSilentAlarm", "COUNT(Desired)")):
            properties = resources[f"{alarm}{suffix}"]["Properties"]
            assert properties["Metrics"][0]["Expression"] == f"SELECT {query} FROM inferq WHERE queue = '{queue}'"
            assert properties["AlarmActions"] == [{"Fn::GetAtt": ["Observability", "Outputs.AlarmTopicArn"]}]
        assert resources[f"ScalerSilentAlarm{suffix}"]["Properties"]["TreatMissingData"] == "breaching"
    observability = load(NESTED["observability"])
    assert resources["Observability"]["Properties"]["Parameters"]["QueueName"] == ""
    off = Resolver(observability, overrides={"QueueName": ""})
    assert not off.condition("WatchesQueue") and off.condition("WatchesNoQueue")
    queue_alarms = {k for k, r in observability["Resources"].items() if r.get("Condition") == "WatchesQueue"}
    assert queue_alarms == {"DlqNotEmptyAlarm", "OldestJobAgeAlarm", "LagAlarm", "ScalerSilentAlarm", "Dashboard"}
    assert Resolver(observability).condition("WatchesQueue")  # template.yaml's default queue keeps them


# --- without a registry ---


def test_without_a_registry_the_deployment_is_one_service_and_the_generator_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p: p.read_bytes() for p in (TEMPLATE, *NESTED.values())}
    registry = tmp_path / "models.yaml"
    registry.write_text(REGISTRY)
    gen_model_stacks.generate(registry, tmp_path)
    assert {p: p.read_bytes() for p in before} == before
    gpu = load(NESTED["gpu"])
    kinds = [r["Type"] for r in gpu["Resources"].values() if r.get("Condition") != "UseSpot"]
    for kind in ("AWS::ECS::Service", "AWS::ECS::TaskDefinition", "AWS::ECS::CapacityProvider",
                 "AWS::AutoScaling::AutoScalingGroup"):
        assert kinds.count(kind) == 1, kind  # and with Spot, its group, provider and on-demand fallback service
    assert load(TEMPLATE)["Resources"]["Gpu"]["Properties"]["TemplateURL"] == "infra/gpu.yaml"
    monkeypatch.delenv("INFERQ_MODELS", raising=False)
    with pytest.raises(SystemExit) as stopped:
        gen_model_stacks.main([])
    assert stopped.value.code == 2
    assert "deploy template.yaml as it is" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([{"name": "a"}, {"name": "b", "queue": "a"}], "model 'b' queue: 'a' is already another model's"),
        ([{"name": "a", "service": "x"}, {"name": "b", "service": "x"}],
         "model 'b' service: 'x' is already another model's"),
        ([{"name": "a b"}], "models[0].name"),
        ([{"name": "a", "service": "not/ok"}], "must be an ECS service name"),
        ([{"name": "a", "deploy": {"gpus": 0}}], "model 'a' deploy.gpus"),
        ([{"name": "a", "backend": {"kind": "tgi"}}], "model 'a' backend.kind"),
        ([{"name": "a-b"}, {"name": "a.b", "queue": "ab", "service": "ab"}],
         "models 'a-b' and 'a.b' both make the resource names *AB"),
        ([{"name": "a", "queue": "it's"}], "model 'a' queue: must be"),
        ([], "models: must be a non-empty list"),
    ],
)
def test_a_registry_the_stack_cannot_be_built_from_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], models: list[dict[str, Any]], message: str
) -> None:
    registry = tmp_path / "models.json"
    registry.write_text(json.dumps({"models": models}))
    with pytest.raises(RegistryError, match="models.json: .*" + re.escape(message)):
        gen_model_stacks.generate(registry, tmp_path)
    assert gen_model_stacks.main([str(registry), "--out", str(tmp_path)]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "template.models.yaml").exists()


# --- claim checks (files bucket, claims/ prefix) ---


def test_gateway_workers_and_the_batch_driver_may_read_and_write_claim_checks(
    translated: dict[str, Any],
) -> None:
    gateway = translated["Resources"]["GatewayFunction"]["Properties"]["Role"]["Fn::GetAtt"][0]
    claims = [s for owner, s in role_statements(translated)
              if owner == gateway and "claims/" in json.dumps(s["Resource"])]
    assert [(sorted(as_list(s["Action"])), s["Resource"]) for s in claims] == [
        (["s3:GetObject", "s3:PutObject"], {"Fn::Sub": "${FilesBucket.Arn}/claims/*"}),
        (["s3:DeleteObject"], {"Fn::Sub": "${FilesBucket.Arn}/claims/requests/*"}),  # a job's body when it ends
    ]
    assert translated["Resources"]["Gpu"]["Properties"]["Parameters"]["FilesBucket"] == {"Ref": "FilesBucket"}
    gpu = load(NESTED["gpu"])
    resolver = Resolver(gpu, overrides={"RedisUrl": "rediss://cache:6379/0", "FilesBucket": "files"})
    task_role = resolver.value(gpu["Resources"]["TaskRole"])
    statements = [s for _, s in role_statements({"Resources": {"TaskRole": task_role}})]
    s3 = [s for s in statements if any(a.startswith("s3:") for a in as_list(s["Action"]))]
    assert s3 == [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
                   "Resource": "arn:aws:s3:::files/claims/*"},
                  {"Effect": "Allow", "Action": "s3:DeleteObject", "Resource": "arn:aws:s3:::files/claims/requests/*"},
                  # S3's 404 for an expired body (tests/infra/test_iam_flows.py): no listing beyond claims/
                  {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::files",
                   "Condition": {"StringLikeIfExists": {"s3:prefix": "claims/*"}}}]
    env = {e["Name"]: e["Value"] for e in resolver.value(containers(gpu, "")["worker"]["Environment"])}
    assert Settings.from_env(env).files_bucket == "files"
    rules = {r.get("Prefix"): r for r in
             translated["Resources"]["FilesBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]}
    assert rules["claims/"]["ExpirationInDays"] == 7  # more than a queueing time plus the one-day result TTL
    # results live as long as their record: INFERQ_RESULT_TTL_S in whole days (S3 counts days from creation)
    assert rules["claims/results/"]["ExpirationInDays"] == -(-Settings().result_ttl_s // 86400)
    assert rules["claims/results/"]["Status"] == "Enabled"
    # stored files: FileRetentionDays (0 disables the rule)
    files = rules["files/"]
    assert files["Status"] == {"Fn::If": ["HasFileRetention", "Enabled", "Disabled"]}
    assert files["ExpirationInDays"] == {"Fn::If": ["HasFileRetention", {"Ref": "FileRetentionDays"}, 1]}
    assert translated["Parameters"]["FileRetentionDays"]["Default"] == 30
    scaler = translated["Resources"]["ScalerFunction"]["Properties"]["Role"]["Fn::GetAtt"][0]
    scaler_claims = [(s["Action"], s["Resource"]) for owner, s in role_statements(translated)
                     if owner == scaler and "claims/" in json.dumps(s["Resource"])]
    # the batch driver claim-checks a line's large body, as a submit does, and reads results back into output files;
    # it deletes a line's body when its batch's cancel ends the line's job
    assert scaler_claims == [(["s3:GetObject", "s3:PutObject"], {"Fn::Sub": "${FilesBucket.Arn}/claims/*"}),
                             ("s3:DeleteObject", {"Fn::Sub": "${FilesBucket.Arn}/claims/requests/*"})]


def test_sam_local_env_names_the_bucket_and_only_variables_the_gateway_declares(translated: dict[str, Any]) -> None:
    local = json.loads((ROOT / "emulator" / "sam-env.json").read_text())["GatewayFunction"]
    assert local["INFERQ_FILES_BUCKET"] == ""  # no S3 under sam local: files and claim checks off, never real AWS
    declared = set(translated["Resources"]["GatewayFunction"]["Properties"]["Environment"]["Variables"])
    assert set(local) - declared == set()


def test_each_fleet_downloads_what_its_engine_loads_and_a_fleet_without_one_nothing(generated: Path) -> None:
    """Issue 47, M2: the engine has no route to download weights, so each boot of an instance downloads its model's
    (the user data, single-quoted); a fleet whose model runs no engine there (mock) downloads nothing."""
    gpu = load(generated / "infra" / "models.generated.yaml")

    def user_data(suffix: str) -> str:
        data = gpu["Resources"]["LaunchTemplate" + suffix]["Properties"]["LaunchTemplateData"]["UserData"]
        return str(data["Fn::Base64"]["Fn::Sub"])

    assert "download 'Qwen/Qwen2.5-1.5B-Instruct'" in user_data("Chat")
    embed = user_data("EmbedSmall")
    assert "download ''" in embed and "[ -n '' ] || break" in embed and "${ModelId}" not in embed
