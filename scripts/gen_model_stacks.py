"""Writes the AWS deployment of a model registry: one ECS service, task definition, capacity provider and GPU Auto
Scaling group per model, all in the stack's one cluster, from the registry file every process reads.

    .venv/bin/python -m scripts.gen_model_stacks models.yaml     # writes the three files below, next to template.yaml
    sam validate --lint -t template.models.yaml
    sam build -t template.models.yaml && sam deploy

Without a registry nothing of this is used: ``template.yaml`` deploys one queue and one service, as it always has.
The files are derived from the hand-written templates, so a change there reaches every model at the next run:

- ``template.models.yaml``: ``template.yaml`` with the GPU stack below; both functions read the registry from a
  Lambda layer (``INFERQ_MODELS=/opt/inferq/models.json``); the scaler may describe and update exactly the models'
  services; three alarms per model (dead letters, oldest job age, a silent scaler); no single-queue alarms.
- ``infra/models.generated.yaml``: ``infra/gpu.yaml`` with its one fleet (launch template, on-demand and Spot Auto
  Scaling groups and capacity providers, task definition, service and on-demand fallback service) repeated per
  model; ``deploy.spot: false`` leaves a model on on-demand alone, ``deploy.spot_instance_types`` names its Spot
  types (default: its ``instance_type`` when it names one, else the stack's SpotInstanceTypes),
  ``deploy.on_demand_base`` the tasks it keeps on on-demand.
- ``infra/registry/inferq/models.json``: the registry as deployed, the layer's content. A model served by the vLLM
  sidecar appears there as an ``openai`` backend on localhost:8000. Each worker gets its own entry of it in its
  task definition, written to ``INFERQ_MODELS`` before the worker starts, with ``INFERQ_MODEL`` naming it: the
  entry alone, so that adding or changing one model leaves the other fleets' task definitions (and their running
  GPU tasks) as they are.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from inferq.scaling.capacity import fallback_service
from scripts.cfn_template import (
    drop_parameters,
    drop_unused_conditions,
    dump,
    read_template,
    unused_parameters,
    write,
)
from scripts.deploy_registry import Model, Registry, RegistryError, load

ROOT = Path(__file__).resolve().parent.parent
ROOT_TEMPLATE = "template.models.yaml"
GPU_TEMPLATE = "infra/models.generated.yaml"
LAYER_DIR = "infra/registry"
LAYER_FILE = "inferq/models.json"
LAMBDA_REGISTRY = f"/opt/{LAYER_FILE}"  # a layer's files land under /opt
WORKER_REGISTRY = "/tmp/inferq-models.json"
SIDECAR_URL = "http://127.0.0.1:8000"  # vLLM listens on loopback only
FLEET = ("LaunchTemplate", "AutoScalingGroup", "WarmPool", "CapacityProvider", "TaskDefinition", "Service",
         "SpotAutoScalingGroup", "SpotCapacityProvider", "FallbackService")
SPOT = ("SpotAutoScalingGroup", "SpotCapacityProvider", "FallbackService")
"""A model's Spot capacity and its on-demand fallback service (infra/gpu.yaml), left out with ``deploy.spot: false``."""
GROUP_NAME = "${AWS::StackName}-gpu"  # infra/gpu.yaml's Auto Scaling group; each model's is GROUP_NAME-<model>


# --- the registry as deployed ---


def logical_id(model: Model) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", model.name) if part)


def spot(model: Model) -> bool:
    return bool(model.deploy.get("spot", True))


def deployed_registry(registry: Registry) -> dict[str, Any]:
    """The registry the processes read in AWS: queue and service written out, and a sidecar-served model as the
    OpenAI-compatible server on localhost that the worker calls (its vLLM args are the sidecar's command line)."""
    document = copy.deepcopy(registry.document)
    entries = []
    for model in registry.models:
        entry = {**copy.deepcopy(model.entry), "queue": model.queue, "service": model.service}
        if not spot(model):  # no fallback service for the scaler to size
            entry["scale"] = {**(entry.get("scale") or {}), "spot_fallback_s": 0}
        if model.sidecar:
            entry["backend"] = {"kind": "openai", "base_url": SIDECAR_URL, "served_model": model.served_model}
        entries.append(entry)
    document["models"] = entries
    return document


def _argument(value: Any) -> Any:
    """One command-line value: the stack's own default stays a reference; a mapping is JSON, as vLLM reads it."""
    if isinstance(value, dict) and set(value) == {"Ref"}:
        return value
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


LOG_FLAGS = ("--no-enable-log-requests", "--no-enable-log-outputs", "--max-log-len", "0",
             "--disable-uvicorn-access-log")
"""vLLM's logging flags of the single-model task (infra/gpu.yaml), on every model's server too."""


def vllm_command(model: Model) -> list[Any]:
    """``vllm serve`` for one model: ``args.model`` (default: the served name) is what it loads, every other arg
    ``key: value`` becomes ``--key value`` (``true``: the bare flag; ``false``/null: left out; a list: each value;
    a mapping: JSON)."""
    args = dict(model.backend.get("args") or {})
    gpus = int(model.deploy.get("gpus", 1))
    args.setdefault("max_model_len", {"Ref": "MaxModelLen"})
    args.setdefault("gpu_memory_utilization", "0.90")
    if gpus > 1:
        args.setdefault("tensor_parallel_size", gpus)  # one task spans the instance's GPUs
    command: list[Any] = ["serve", str(args.pop("model", model.served_model)), "--served-model-name",
                          model.served_model, "--host", "127.0.0.1", "--port", "8000"]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value is not False and value is not None:
            values = value if isinstance(value, list) else [value]
            command += [flag, *(_argument(v) for v in values)]
    # Last, so no registry argument turns them off: prompts and outputs stay out of the logs (infra/gpu.yaml).
    return [*command, *LOG_FLAGS]


# --- infra/gpu.yaml, one fleet per model ---


def _rename(node: Any, names: dict[str, str]) -> Any:
    """A copy of ``node`` whose references to the fleet's resources point at one model's copies."""
    if isinstance(node, list):
        return [_rename(item, names) for item in node]
    if isinstance(node, dict):
        if set(node) == {"Ref"} and node["Ref"] in names:
            return {"Ref": names[node["Ref"]]}
        if set(node) == {"Fn::GetAtt"} and node["Fn::GetAtt"][0] in names:
            return {"Fn::GetAtt": [names[node["Fn::GetAtt"][0]], *node["Fn::GetAtt"][1:]]}
        if set(node) == {"Fn::Sub"} and isinstance(node["Fn::Sub"], str):
            text = node["Fn::Sub"]
            for old, new in names.items():
                text = re.sub(r"\$\{" + old + r"([.}])", "${" + new + r"\1", text)
            return {"Fn::Sub": text}
        return {k: _rename(v, names) for k, v in node.items()}
    return node


def _capacity(copies: dict[str, Any], names: dict[str, str], model: Model, maximum: Any) -> None:
    """One model's Spot group, its provider and its fallback service, or none of them (``deploy.spot: false``)."""
    service = copies[names["Service"]]["Properties"]
    if not spot(model):
        for name in SPOT:
            copies.pop(names[name])
        service["CapacityProviderStrategy"] = service["CapacityProviderStrategy"]["Fn::If"][2]
        service["DeploymentConfiguration"]["MaximumPercent"] = 100
        return
    on_demand, _spot = service["CapacityProviderStrategy"]["Fn::If"][1]
    if "on_demand_base" in model.deploy:
        on_demand["Base"] = model.deploy["on_demand_base"]
    group = copies[names["SpotAutoScalingGroup"]]["Properties"]
    group["MaxSize"] = maximum
    group["Tags"][0]["Value"] = {"Fn::Sub": f"${{AWS::StackName}}-{model.name}-spot"}
    types = model.deploy.get("spot_instance_types") or (
        [model.deploy["instance_type"]] if "instance_type" in model.deploy else None)
    if types:  # else the stack's SpotInstanceTypes, as the one-model stack
        group["MixedInstancesPolicy"]["LaunchTemplate"]["Overrides"] = [{"InstanceType": t} for t in types]
    scaling = copies[names["SpotCapacityProvider"]]["Properties"]["AutoScalingGroupProvider"]["ManagedScaling"]
    scaling["MaximumScalingStepSize"] = maximum if model.scale_max is None else max(1, model.scale_max)
    copies[names["FallbackService"]]["Properties"]["ServiceName"] = fallback_service(model.service)


def worker_registry(document: dict[str, Any], model: Model) -> dict[str, Any]:
    """One model's registry, as its workers read it: its entry only (``default`` is the gateway's business)."""
    rest = {k: v for k, v in document.items() if k not in ("models", "default")}
    return {**rest, "models": [e for e in document["models"] if e["name"] == model.name]}


def _task(task: dict[str, Any], model: Model, document: dict[str, Any]) -> dict[str, Any]:
    properties = task["Properties"]
    vllm, worker = (next(c for c in properties["ContainerDefinitions"] if c["Name"] == n) for n in ("vllm", "worker"))
    if model.deploy.get("image"):
        worker["Image"] = model.deploy["image"]
    # The worker image holds no registry: the container writes the deployed one where INFERQ_MODELS points, then
    # becomes the worker (exec: it receives ECS's SIGTERM itself).
    worker["Command"] = ["sh", "-c", 'printf "%s" "$0" > "$INFERQ_MODELS" && exec python -m gpu_worker',
                         json.dumps(worker_registry(document, model), separators=(",", ":"), sort_keys=True)]
    from_registry = {"INFERQ_QUEUE", "INFERQ_BACKEND", "INFERQ_OPENAI_BASE_URL"}
    worker["Environment"] = [
        {"Name": "INFERQ_MODELS", "Value": WORKER_REGISTRY},
        {"Name": "INFERQ_MODEL", "Value": model.name},
        *(e for e in worker["Environment"] if e.get("Name") not in from_registry),
    ]
    if model.sidecar:
        vllm["Command"] = vllm_command(model)
        vllm["ResourceRequirements"] = [{"Type": "GPU", "Value": str(model.deploy.get("gpus", 1))}]
        if "memory_mib" in model.deploy:
            vllm["MemoryReservation"] = model.deploy["memory_mib"]
    else:  # the model server is elsewhere (openai) or none (mock): the worker alone, no GPU reserved
        properties["ContainerDefinitions"] = [worker]
        properties.pop("Volumes", None)
        worker.pop("DependsOn", None)
        if "memory_mib" in model.deploy:
            worker["MemoryReservation"] = model.deploy["memory_mib"]
    return task


def gpu_template(registry: Registry, document: dict[str, Any]) -> dict[str, Any]:
    gpu = read_template(ROOT / "infra" / "gpu.yaml")
    resources = gpu["Resources"]
    fleet = {name: resources.pop(name) for name in FLEET}
    gpu["Description"] = (
        f"inferq GPU fleets, one per model of the registry ({', '.join(m.name for m in registry.models)}): "
        + gpu["Description"]
    )
    outputs = gpu["Outputs"]
    for name in ("ServiceName", "ServiceArn", "AutoScalingGroupName", "CapacityProviderName", "TaskDefinitionArn",
                 "SpotCapacityProviderName", "FallbackServiceName", "FallbackServiceArn", "SpotAutoScalingGroupName"):
        outputs.pop(name)
    for model in registry.models:
        suffix = logical_id(model)
        names = {name: name + suffix for name in FLEET}
        copies = {names[name]: _rename(copy.deepcopy(fleet[name]), names) for name in FLEET}
        template_data = copies[names["LaunchTemplate"]]["Properties"]["LaunchTemplateData"]
        if "instance_type" in model.deploy:
            template_data["InstanceType"] = model.deploy["instance_type"]
        template_data["TagSpecifications"][0]["Tags"][0]["Value"] = {"Fn::Sub": f"${{AWS::StackName}}-{model.name}"}
        group = copies[names["AutoScalingGroup"]]["Properties"]
        maximum: Any = {"Ref": "MaxInstances"} if model.scale_max is None else str(model.scale_max)
        group["MaxSize"] = maximum
        group["Tags"][0]["Value"] = {"Fn::Sub": f"${{AWS::StackName}}-{model.name}"}
        # each group its own name: the warm pool's launch hook call (user data) and the instance role name it
        group_name = f"{GROUP_NAME}-{model.name}"
        group["AutoScalingGroupName"] = {"Fn::Sub": group_name}
        user_data = template_data["UserData"]["Fn::Base64"]
        text = user_data["Fn::Sub"].replace(f"--auto-scaling-group-name {GROUP_NAME} ",
                                            f"--auto-scaling-group-name {group_name} ")
        # each boot downloads what this model's engine loads (a registry id: inferq/config/registry.py MODEL_RE);
        # a model with no engine on the instance (mock, or a server elsewhere) downloads nothing
        loads = str((model.backend.get("args") or {}).get("model", model.served_model)) if model.sidecar else ""
        text = text.replace("${ModelId}", loads)
        user_data["Fn::Sub"] = text
        scaling = copies[names["CapacityProvider"]]["Properties"]["AutoScalingGroupProvider"]["ManagedScaling"]
        scaling["MaximumScalingStepSize"] = maximum if model.scale_max is None else max(1, model.scale_max)
        _task(copies[names["TaskDefinition"]], model, document)
        copies[names["Service"]]["Properties"]["ServiceName"] = model.service
        _capacity(copies, names, model, maximum)
        resources.update(copies)
        outputs[f"Service{suffix}Name"] = {"Value": {"Fn::GetAtt": [names["Service"], "Name"]}}
        outputs[f"Service{suffix}Arn"] = {"Value": {"Ref": names["Service"]}}
        outputs[f"TaskDefinition{suffix}Arn"] = {"Value": {"Ref": names["TaskDefinition"]}}
        outputs[f"CapacityProvider{suffix}Name"] = {"Value": {"Ref": names["CapacityProvider"]}}
        if spot(model):
            outputs[f"FallbackService{suffix}Arn"] = {
                "Value": {"Fn::If": ["UseSpot", {"Ref": names["FallbackService"]}, ""]}}
    lifecycle = next(p for p in resources["InstanceRole"]["Properties"]["Policies"]
                     if p["PolicyName"] == "warm-pool-lifecycle")
    lifecycle["PolicyDocument"]["Statement"][0]["Resource"] = [
        {"Fn::Sub": "arn:${AWS::Partition}:autoscaling:${AWS::Region}:${AWS::AccountId}:autoScalingGroup:*:"
                    f"autoScalingGroupName/{GROUP_NAME}-{m.name}"} for m in registry.models]
    providers = [{"Ref": "CapacityProvider" + logical_id(m)} for m in registry.models]
    spot_providers = [{"Fn::If": ["UseSpot", {"Ref": "SpotCapacityProvider" + logical_id(m)}, {"Ref": "AWS::NoValue"}]}
                      for m in registry.models if spot(m)]
    associations = resources["ClusterCapacityProviders"]["Properties"]
    associations["CapacityProviders"] = providers + spot_providers
    associations["DefaultCapacityProviderStrategy"] = [{"CapacityProvider": providers[0], "Weight": 1}]
    outputs["ServiceNames"] = {
        "Description": "The models' ECS services, comma-separated, in registry order.",
        "Value": {"Fn::Join": [",", [{"Fn::GetAtt": ["Service" + logical_id(m), "Name"]} for m in registry.models]]},
    }
    drop_unused_conditions(gpu)  # the Spot types' when every model names its own
    drop_parameters(gpu, unused_parameters(gpu))  # ModelId, QueueName, and what every model overrides
    return gpu


# --- template.yaml around it ---


def _alarms(model: Model) -> dict[str, Any]:
    """The queue alarms of infra/observability.yaml for one model's queue, on the stack's alarm topic: dead
    letters, the oldest job's age, and a scaler that no longer decides for it."""
    topic = {"Fn::GetAtt": ["Observability", "Outputs.AlarmTopicArn"]}
    common = {"TreatMissingData": "notBreaching", "AlarmActions": [topic], "OKActions": [topic],
              "ComparisonOperator": "GreaterThanThreshold"}

    def query(aggregate: str) -> str:
        return f"SELECT {aggregate} FROM inferq WHERE queue = '{model.queue}'"  # noqa: S608 - a checked name

    suffix = logical_id(model)
    return {
        f"DlqNotEmptyAlarm{suffix}": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
            "AlarmDescription": f"inferq model {model.name} (queue {model.queue}): jobs were dead-lettered. Inspect "
                                "them with GET /v1/dlq and redrive with POST /v1/dlq/{id}/redrive.",
            "Metrics": [{"Id": "dlq", "Expression": query("MAX(Dlq)"), "Period": 60, "ReturnData": True}],
            "Threshold": 0, "EvaluationPeriods": 1, "DatapointsToAlarm": 1, **common}},
        f"OldestJobAgeAlarm{suffix}": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
            "AlarmDescription": f"inferq model {model.name} (queue {model.queue}): the oldest unfinished job is "
                                f"older than 900 s. Check that service {model.service} scales and its GPU "
                                "instances launch (quota, capacity).",
            "Metrics": [{"Id": "age", "Expression": query("MAX(OldestJobAgeSeconds)"), "Period": 60,
                         "ReturnData": True}],
            "Threshold": 900, "EvaluationPeriods": 3, "DatapointsToAlarm": 3, **common}},
        # Missing data is the failure: the scaler does not run, or cannot observe this model's queue.
        f"ScalerSilentAlarm{suffix}": {"Type": "AWS::CloudWatch::Alarm", "Properties": {
            "AlarmDescription": f"The inferq scaler has made no decision for model {model.name} (queue "
                                f"{model.queue}) for five minutes: it does not run, or cannot reach Redis or ECS.",
            "Metrics": [{"Id": "ticks", "Expression": query("COUNT(Desired)"), "Period": 60, "ReturnData": True}],
            **common, "ComparisonOperator": "LessThanThreshold", "Threshold": 1, "EvaluationPeriods": 5,
            "DatapointsToAlarm": 5, "TreatMissingData": "breaching"}},
    }


def root_template(registry: Registry, gpu: dict[str, Any], out: Path) -> dict[str, Any]:
    template = read_template(ROOT / "template.yaml")
    resources = template["Resources"]

    def relative(path: Path) -> str:
        return os.path.relpath(path, out).replace(os.sep, "/")

    for stack in ("Network", "Cache", "Observability"):
        name = stack.lower()
        resources[stack]["Properties"]["TemplateURL"] = relative(ROOT / "infra" / f"{name}.yaml")
    for function in ("GatewayFunction", "ScalerFunction", "AuthorizerFunction"):
        resources[function]["Properties"]["CodeUri"] = relative(ROOT)
    stack = resources["Gpu"]["Properties"]
    stack["TemplateURL"] = GPU_TEMPLATE
    stack["Parameters"] = {k: v for k, v in stack["Parameters"].items() if k in gpu["Parameters"]}
    # No single-queue alarms: each model has its own below.
    resources["Observability"]["Properties"]["Parameters"]["QueueName"] = ""

    functions = template["Globals"]["Function"]
    # the queue's clients read the registry; the API key authorizer has no queue and needs none
    for function in ("GatewayFunction", "ScalerFunction"):
        properties = resources[function]["Properties"]
        properties["Environment"]["Variables"].pop("INFERQ_QUEUE")
        properties["Environment"]["Variables"]["INFERQ_MODELS"] = LAMBDA_REGISTRY
        properties["Layers"] = [{"Ref": "ModelRegistry"}]
    resources["ModelRegistry"] = {
        "Type": "AWS::Serverless::LayerVersion",
        "Properties": {
            "Description": f"inferq model registry ({', '.join(m.name for m in registry.models)}) at "
                           f"{LAMBDA_REGISTRY}",
            "ContentUri": LAYER_DIR,
            "CompatibleRuntimes": [functions["Runtime"]],
            "CompatibleArchitectures": functions["Architectures"],
            "RetentionPolicy": "Delete",
        },
    }

    scaler = resources["ScalerFunction"]["Properties"]
    scaler["Environment"]["Variables"].pop("INFERQ_ECS_SERVICE")  # each model names its service
    services = [{"Fn::GetAtt": ["Gpu", f"Outputs.Service{logical_id(m)}Arn"]} for m in registry.models] + [
        {"Fn::If": ["UseSpot", {"Fn::GetAtt": ["Gpu", f"Outputs.FallbackService{logical_id(m)}Arn"]},
                    {"Ref": "AWS::NoValue"}]} for m in registry.models if spot(m)]
    task_definitions = [{"Fn::GetAtt": ["Gpu", f"Outputs.TaskDefinition{logical_id(m)}Arn"]} for m in registry.models]
    providers = [{"Fn::GetAtt": ["Gpu", f"Outputs.CapacityProvider{logical_id(m)}Name"]} for m in registry.models]
    for statement in scaler["Policies"][0]["Statement"]:
        actions = statement.get("Action", []) if isinstance(statement, dict) else []
        if any(action.startswith("ecs:") for action in ([actions] if isinstance(actions, str) else actions)):
            statement["Resource"] = services
            condition = statement.get("Condition", {})
            if "ecs:task-definition" in condition.get("ArnEqualsIfExists", {}):
                condition["ArnEqualsIfExists"]["ecs:task-definition"] = task_definitions
            if "ecs:capacity-provider" in condition.get("StringEqualsIfExists", {}):
                condition["StringEqualsIfExists"]["ecs:capacity-provider"] = providers
    for model in registry.models:
        resources.update(_alarms(model))

    outputs = template["Outputs"]
    outputs.pop("EcsServiceName")
    outputs["EcsServiceNames"] = {"Description": "The models' ECS services, comma-separated.",
                                  "Value": {"Fn::GetAtt": ["Gpu", "Outputs.ServiceNames"]}}
    template["Description"] = (
        f"{template['Description']} Generated from the model registry {registry.source.name}: one GPU fleet per model."
    )
    drop_parameters(template, unused_parameters(template))  # QueueName, ModelId: the registry decides them
    return template


def generate(registry_path: Path, out: Path = ROOT) -> list[Path]:
    """Write the three files for a registry under ``out``; returns their paths."""
    registry = load(registry_path)
    owners: dict[str, str] = {}
    for model in registry.models:  # resource names keep a model name's letters and digits only
        suffix = logical_id(model)
        if suffix in owners:
            raise RegistryError(f"{registry_path}: models {owners[suffix]!r} and {model.name!r} both make the "
                                f"resource names *{suffix}; rename one")
        owners[suffix] = model.name
    document = deployed_registry(registry)
    gpu = gpu_template(registry, document)
    root = root_template(registry, gpu, out)
    source = registry_path.name
    files = {
        out / ROOT_TEMPLATE: dump(root, source),
        out / GPU_TEMPLATE: dump(gpu, source),
        out / LAYER_DIR / LAYER_FILE: json.dumps(document, indent=2) + "\n",
    }
    for path, text in files.items():
        write(path, text)
    return list(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("registry", type=Path, nargs="?", help="the model registry (default: $INFERQ_MODELS)")
    parser.add_argument("--out", type=Path, default=ROOT, help="directory of template.models.yaml (default: root)")
    args = parser.parse_args(argv)
    path = args.registry or (Path(os.environ["INFERQ_MODELS"]) if os.environ.get("INFERQ_MODELS") else None)
    if path is None:
        parser.error("no registry given (nor INFERQ_MODELS): without one, deploy template.yaml as it is")
    try:
        written = generate(path, args.out.resolve())
    except (RegistryError, OSError, yaml.YAMLError, json.JSONDecodeError) as exc:
        print(f"gen_model_stacks: {exc}", file=sys.stderr)
        return 1
    for file in written:
        print(f"wrote {os.path.relpath(file)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
