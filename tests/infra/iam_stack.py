"""The deployed stack's roles, resolved from the templates and stood up on moto, for the IAM flows
(tests/infra/test_iam_flows.py).

Everything a role's process sees comes from the templates, resolved with the values of real moto resources: the
files bucket, the secrets (API keys, webhook key, one cache credential per role), the ECS cluster and service.
Each role gets

- its **policies**: the inline policies of the role the template gives it (the SAM functions' ``Policies``, the GPU
  task's ``TaskRole`` and ``TaskExecutionRole`` in infra/gpu.yaml), every ``!Sub``/``!Ref``/``!GetAtt``/``!If``
  resolved with those values, and the resource policies AWS also applies (the files bucket's policy);
- its **environment**: the variables the template gives its process (``Globals`` then the function's, or the
  worker container's ``Environment`` plus the ``Secrets`` ECS injects), the cache URL pointed at the test's Valkey;
- its **credentials**: an IAM user of moto's whose policy is the role's, so that moto enforces what it can
  evaluate (see :func:`moto_policy`) while :mod:`.iam_policy` evaluates every call.

AWS managed policies the template attaches (Lambda's basic and VPC execution roles, X-Ray, ECS task execution) cover
what the runtimes do on a role's behalf (logs, ENIs, traces, image pulls), never a call of our code: they are not
part of any role here.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from botocore.awsrequest import AWSResponse
from botocore.handlers import BUILTIN_HANDLERS

from emulator.valkey import ValkeyProcess
from inferq.redis import acl
from inferq.scaling.capacity import fallback_service
from inferq.webhooks import envelope

from .cfn import NESTED, NO_VALUE, TEMPLATE, Resolver, load
from .iam_calls import ACCOUNT, REGION, Names, Recorder
from .iam_policy import Policy

BUCKET = "inferq-files-iam"
CLUSTER, SERVICE = "inferq", "gpu-workers"
FALLBACK = fallback_service(SERVICE)
SPOT_TASK = f"arn:aws:ecs:us-east-1:123456789012:task/{CLUSTER}/spot-waiting"
SCALER_FUNCTION = "inferq-ScalerFunction-IAMTEST"
API_KEY, TENANT = "key-tenant-a-0001", "tenant-a"
WEBHOOK_KEY = "whsec_dGVzdCBzaWduaW5nIGtleQ=="
EDGE_ORIGIN = "edge-origin-value-0123456789abcdef"
"""The stack is built with its edge on (EdgeProtection waf): the authorizer reads the origin secret too."""
TASK_ID = "0123456789abcdef0123456789abcdef"

ROLES = {
    "gateway": "GatewayFunction",
    "scaler": "ScalerFunction",
    "authorizer": "AuthorizerFunction",
    "worker": "TaskRole",
    "task-execution": "TaskExecutionRole",
}
"""Role -> the template resource whose policies it has (the first three in template.yaml, the others in
infra/gpu.yaml)."""


@dataclass
class Role:
    name: str
    principal: str
    policies: list[Policy]
    env: dict[str, str]
    credentials: tuple[str, str] = ("", "")


@dataclass
class Stack:
    """The resolved stack on moto and Valkey: roles, resource policies, names, the recorder."""

    valkey: ValkeyProcess
    roles: dict[str, Role]
    bucket_policy: Policy
    key_policies: dict[str, Policy]
    """KMS key ARN -> its key policy."""
    names: Names
    recorder: Recorder
    admin: tuple[str, str]
    values: dict[str, str] = field(default_factory=dict)
    receiver: Any = None
    """The webhook receiver (tests.support.tls.HttpsReceiver): what it was sent."""

    sessions: dict[str | None, Any] = field(default_factory=dict)

    def session(self, role: str | None) -> Any:
        """The boto3 session of ``role`` (made once: a session loads its services' models anew)."""
        if role not in self.sessions:
            import boto3

            key, secret = self.roles[role].credentials if role else self.admin
            self.sessions[role] = boto3.Session(aws_access_key_id=key, aws_secret_access_key=secret,
                                                region_name=REGION)
        return self.sessions[role]

    @contextmanager
    def acting(self, role: str | None) -> Iterator[None]:
        """Run as ``role``: its calls recorded under it, its credentials (moto enforces its policy), its
        environment in ``os.environ`` (what its code reads). ``None``: the test's own set-up and checks, as an
        administrator, unrecorded."""
        import boto3

        # the whole environment, given back as it was: a role's variables (POWERTOOLS_SERVICE_NAME among them) left
        # behind would reach every later test's processes (the gateway's and worker's lines named 'inferq-scaler')
        saved_env = dict(os.environ)
        saved_session = boto3.DEFAULT_SESSION
        key, secret = self.roles[role].credentials if role else self.admin
        for name in list(os.environ):
            if name.startswith("INFERQ_"):
                del os.environ[name]
        if role:
            os.environ.update(self.roles[role].env)
        # clients made from here on take the role's credentials: through boto3's default session, or from the
        # environment for code that makes its own session
        os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"] = key, secret
        boto3.DEFAULT_SESSION = self.session(role)
        envelope.reset()  # each role is its own process: no data key one unwrapped is another's
        try:
            with self.recorder.acting(role):
                yield
        finally:
            os.environ.clear()
            os.environ.update(saved_env)
            boto3.DEFAULT_SESSION = saved_session


# ---------------------------------------------------------------------- the templates, resolved


def _secret(client: Any, name: str, value: str) -> str:
    return str(client.create_secret(Name=name, SecretString=value)["ARN"])


def _valkey_users(server: ValkeyProcess) -> dict[str, str]:
    """One cache user per role with inferq.redis.acl's rules (as infra/cache.yaml creates them); the default user
    off, as in AWS: a process that does not read its role's secret reaches nothing."""
    import redis

    tokens = {role: uuid.uuid4().hex for role in acl.ROLES}
    admin = redis.Redis(host=server.host, port=server.port, decode_responses=True)
    for role in acl.ROLES:
        admin.execute_command("ACL", "SETUSER", f"inferq-{role}", *acl.access_string(role).split(),
                              f">{tokens[role]}")
    admin.execute_command("ACL", "SETUSER", "admin", "on", ">admin-pass", "~*", "&*", "+@all")
    admin.execute_command("ACL", "SETUSER", "default", "off")
    admin.close()
    return tokens


def resolve_values(valkey: ValkeyProcess) -> tuple[dict[str, str], Names]:
    """moto's resources for the stack, and the template values (``Ref``/``GetAtt``) they give."""
    import boto3

    tokens = _valkey_users(valkey)
    secrets = boto3.client("secretsmanager", region_name=REGION)
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    digest = hashlib.sha256(API_KEY.encode()).hexdigest()
    values = {
        "FilesBucket": BUCKET,
        "FilesBucket.Arn": f"arn:aws:s3:::{BUCKET}",
        "ApiKeysSecret": _secret(secrets, "inferq-api-keys", json.dumps({digest: TENANT})),
        "WebhookSecret": _secret(secrets, "inferq-webhook", WEBHOOK_KEY),
        "EdgeOriginSecret": _secret(secrets, "inferq-edge-origin", json.dumps({"current": EDGE_ORIGIN})),
        "ScalerFunction": SCALER_FUNCTION,
        "ScalerFunction.Arn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{SCALER_FUNCTION}",
        "AuthorizerFunction.Arn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:inferq-AuthorizerFunction-IAMTEST",
        "Cache.Outputs.RedisUrl": valkey.url,
        "Gpu.Outputs.ClusterName": CLUSTER,
        "Gpu.Outputs.ClusterArn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{CLUSTER}",
        "Gpu.Outputs.ServiceName": SERVICE,
        "Gpu.Outputs.ServiceArn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:service/{CLUSTER}/{SERVICE}",
        "Gpu.Outputs.FallbackServiceArn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:service/{CLUSTER}/{FALLBACK}",
        "Gpu.Outputs.TaskDefinitionArn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:task-definition/inferq-worker:1",
        "Gpu.Outputs.CapacityProviderName": "inferq-gpu",
        "Network.Outputs.PrivateSubnetIds": "subnet-0a,subnet-0b",
        "Network.Outputs.ClientSecurityGroupId": "sg-0client",
        "Network.Outputs.VpcId": "vpc-0iam",
        "LogsKey.Arn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/00000000-0000-0000-0000-00000000logs",
        # infra/gpu.yaml
        "Cluster": CLUSTER,
        "Cluster.Arn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{CLUSTER}",
        "WorkerRepository.RepositoryUri": f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/inferq-worker",
    }
    for role in acl.ROLES:
        arn = _secret(secrets, f"inferq-cache-{role}",
                      json.dumps({"username": f"inferq-{role}", "token": tokens[role]}))
        values[f"Cache.Outputs.{role.capitalize()}AuthSecretArn"] = arn
    key = boto3.client("kms", region_name=REGION).create_key(Description="inferq webhook secrets (test)")
    values["WebhookSecretsKey"] = values["WebhookSecretsKey.Arn"] = key["KeyMetadata"]["Arn"]
    ecs = boto3.client("ecs", region_name=REGION)
    ecs.create_cluster(clusterName=CLUSTER)
    ecs.register_task_definition(family="inferq-worker",
                                 containerDefinitions=[{"name": "worker", "image": "w", "memory": 512}])
    for service in (SERVICE, FALLBACK):  # the Spot service and its on-demand fallback (the stack's default)
        ecs.create_service(cluster=CLUSTER, serviceName=service, taskDefinition="inferq-worker", desiredCount=0)
    return values, Names()


def _statements(resolver: Resolver, policies: Any) -> list[dict[str, Any]]:
    resolved = resolver.value(policies)
    if resolved is NO_VALUE:
        return []
    documents = [p.get("PolicyDocument", p) for p in resolved]
    return [s for d in documents for s in (d["Statement"] if isinstance(d["Statement"], list) else [d["Statement"]])]


def _function_env(template: dict[str, Any], resolver: Resolver, logical_id: str) -> dict[str, str]:
    env = dict(template["Globals"]["Function"]["Environment"]["Variables"])
    env.update(template["Resources"][logical_id]["Properties"].get("Environment", {}).get("Variables", {}))
    return {k: str(v) for k, v in resolver.value(env).items()}


def build(valkey: ValkeyProcess, recorder: Recorder, *, overrides: Mapping[str, str] | None = None) -> Stack:
    """The stack on moto (inside an active ``mock_aws``): resources, the roles resolved from the templates."""
    import boto3

    values, names = resolve_values(valkey)
    root = load(TEMPLATE)
    gpu = load(NESTED["gpu"])
    vllm = "vllm/vllm-openai@sha256:" + "ab" * 32
    resolver = Resolver(root, overrides={"VllmImage": vllm, "EdgeProtection": "waf", **(overrides or {})},
                        attributes=values)
    nested = {k: ",".join(v) if isinstance(v, list) else str(v)
              for k, v in resolver.value(root["Resources"]["Gpu"]["Properties"]["Parameters"]).items()}
    gpu_resolver = Resolver(gpu, overrides=nested, attributes=values)

    roles: dict[str, Role] = {}
    for role, logical_id in ROLES.items():
        if logical_id in root["Resources"]:
            props = root["Resources"][logical_id]["Properties"]
            statements = _statements(resolver, props.get("Policies", []))
            env = _function_env(root, resolver, logical_id)
        else:
            props = gpu["Resources"][logical_id]["Properties"]
            statements = _statements(gpu_resolver, props.get("Policies", []))
            env = {}
        principal = f"arn:aws:iam::{ACCOUNT}:role/inferq-{logical_id}-IAMTEST"
        roles[role] = Role(role, principal, [Policy.of(logical_id, {"Statement": statements})], env)

    # the worker's process: its container's environment and the secrets ECS injects (the execution role's flow
    # reads them: tests/infra/iam_flows.py)
    task = gpu_resolver.value(gpu["Resources"]["TaskDefinition"]["Properties"])
    worker = next(c for c in task["ContainerDefinitions"] if c["Name"] == "worker")
    roles["worker"].env = {e["Name"]: str(e["Value"]) for e in worker["Environment"]}
    values["worker.Secrets"] = json.dumps(worker.get("Secrets", []))
    values["TaskDefinition"] = json.dumps(task)

    bucket_statements = resolver.value(root["Resources"]["FilesBucketPolicy"]["Properties"]["PolicyDocument"])
    bucket_policy = Policy.of("FilesBucketPolicy", bucket_statements)
    key_policies = {values[f"{key}.Arn"]: Policy.of(key, resolver.value(
        root["Resources"][key]["Properties"]["KeyPolicy"])) for key in ("WebhookSecretsKey",)}

    iam = boto3.client("iam", region_name=REGION)
    for each in roles.values():
        iam.create_user(UserName=each.name)
        iam.put_user_policy(UserName=each.name, PolicyName="role",
                            PolicyDocument=json.dumps(moto_policy(each.policies)))
        key = iam.create_access_key(UserName=each.name)["AccessKey"]
        each.credentials = (key["AccessKeyId"], key["SecretAccessKey"])
    iam.create_user(UserName="test-admin")
    iam.put_user_policy(UserName="test-admin", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    admin = iam.create_access_key(UserName="test-admin")["AccessKey"]
    return Stack(valkey, roles, bucket_policy, key_policies, names, recorder,
                 (admin["AccessKeyId"], admin["SecretAccessKey"]), values)


# ---------------------------------------------------------------------- what moto can enforce

MOTO_FAITHFUL = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject")
"""The calls whose authorization moto (5.x) decides as AWS does for these templates: moto names an S3 call after
its *operation* (``s3:HeadObject``, ``s3:ListObjectsV2``, ``s3:CreateMultipartUpload``), compares a resource only
for S3, and cannot evaluate a ``Condition``. Operations named as their IAM action, on object ARNs, in statements
without a condition: PutObject, GetObject, DeleteObject. For those moto enforces the role's own statements."""


def moto_policy(policies: list[Policy]) -> dict[str, Any]:
    """The role's policy as moto can hold it: its unconditional statements' :data:`MOTO_FAITHFUL` actions on their
    S3 resources, and every other operation allowed (``NotAction``), left to :mod:`.iam_policy`."""
    statements: list[dict[str, Any]] = [{"Effect": "Allow", "NotAction": list(MOTO_FAITHFUL), "Resource": "*"}]
    for policy in policies:
        for statement in policy.statements:
            actions = [a for a in _list(statement.get("Action", [])) if a in MOTO_FAITHFUL]
            if actions and "Condition" not in statement:
                statements.append({"Effect": statement["Effect"], "Action": actions,
                                   "Resource": _list(statement["Resource"])})
    return {"Version": "2012-10-17", "Statement": statements}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# ---------------------------------------------------------------------- calls no local service answers


STUBBED: dict[str, dict[str, Any]] = {
    # moto would run the scaler in Docker; Lambda answers an asynchronous invoke 202 with no payload
    "before-call.lambda.Invoke": {"StatusCode": 202},
    # moto has no task protection; what ECS answers (UpdateTaskProtection / GetTaskProtection)
    "before-call.ecs.UpdateTaskProtection": {"protectedTasks": [], "failures": []},
    "before-call.ecs.GetTaskProtection": {"protectedTasks": [], "failures": []},
    # moto starts no task for a service, and none of its own waits for an instance: a Spot task ECS has been trying
    # to place since long ago (the scaler asks only while the service counts a task starting)
    "before-call.ecs.ListTasks": {"taskArns": [SPOT_TASK]},
    "before-call.ecs.DescribeTasks": {"tasks": [{"taskArn": SPOT_TASK, "lastStatus": "PROVISIONING",
                                                  "createdAt": datetime(2026, 1, 1, tzinfo=UTC)}], "failures": []},
}


def _stub(event_name: str, **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
    """botocore's ``before-call``: a handler's (response, parsed) answer replaces the request (after the recorder
    has seen the call, on ``provide-client-params``)."""
    if Recorder.active is None or event_name not in STUBBED:
        return None
    parsed = STUBBED[event_name]
    return AWSResponse("https://stub.invalid/", int(parsed.get("StatusCode", 200)), {}, None), dict(parsed)


if ("before-call", _stub) not in BUILTIN_HANDLERS:
    BUILTIN_HANDLERS.append(("before-call", _stub))
