"""Every AWS call a flow makes, recorded, and what AWS authorizes for it (tests/infra/test_iam_flows.py).

The recorder is a botocore event handler on ``provide-client-params``, the event every client method emits before
it builds a request, presigned URLs included (``generate_presigned_url`` emits it with ``is_presign_request``): it
sees the service, the operation and its parameters of every call any code makes, through whatever client. It is
registered in botocore's ``BUILTIN_HANDLERS`` (as moto registers its own stubber), so every session made after
this module is imported carries it; it records only while a :class:`Recorder` is active.

:data:`AUTHORIZATION` turns one call into the authorizations AWS makes for it (actions, resource ARNs, condition
keys), transcribed from the Service Authorization Reference ("Actions, resources, and condition keys for Amazon
S3 / AWS Secrets Manager / AWS Lambda / Amazon ECS / AWS KMS") and the S3 API reference's permission notes. A call
with no entry fails the test: a flow that starts making a new call adds its rule here first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from botocore.handlers import BUILTIN_HANDLERS

from .iam_policy import Request

REGION = "us-east-1"
ACCOUNT = "123456789012"
"""moto's default account, and the Resolver's pseudo parameters (tests/infra/cfn.py)."""


@dataclass
class Call:
    """One AWS API call (or presigned URL) a role's code made, and the HTTP status it got (None: presigned, or
    answered without a request)."""

    role: str
    flow: str
    service: str
    operation: str
    params: Mapping[str, Any]
    presigned: bool = False
    status: int | None = None

    def __str__(self) -> str:
        shown = {k: v for k, v in self.params.items() if k in _SHOWN}
        kind = " (presigned)" if self.presigned else ""
        return f"{self.service}:{self.operation}{kind} {shown}"


_SHOWN = ("Bucket", "Key", "Prefix", "SecretId", "FunctionName", "cluster", "service", "services", "tasks", "KeyId")


# ---------------------------------------------------------------------- ARNs


def s3_object(params: Mapping[str, Any], key: str | None = None) -> str:
    return f"arn:aws:s3:::{params['Bucket']}/{key if key is not None else params['Key']}"


def s3_bucket(params: Mapping[str, Any]) -> str:
    return f"arn:aws:s3:::{params['Bucket']}"


def ecs_cluster(name: str) -> str:
    return name if name.startswith("arn:") else f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{name}"


def _cluster_name(params: Mapping[str, Any]) -> str:
    cluster = str(params.get("cluster") or "default")
    return cluster.rsplit("/", 1)[-1] if cluster.startswith("arn:") else cluster


def ecs_service(cluster: str, service: str) -> str:
    return service if service.startswith("arn:") else f"arn:aws:ecs:{REGION}:{ACCOUNT}:service/{cluster}/{service}"


def ecs_task(cluster: str, task: str) -> str:
    return task if task.startswith("arn:") else f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/{cluster}/{task}"


def lambda_function(name: str, qualifier: str | None) -> str:
    if name.startswith("arn:"):
        arn = name
    elif ":" in name:  # 123456789012:function:name or name:alias
        arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
    else:
        arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
    return f"{arn}:{qualifier}" if qualifier else arn


# ---------------------------------------------------------------------- what AWS authorizes per call

Rule = Callable[..., list[Request]]
"""(the call's parameters, :class:`Names`[, its HTTP status]) -> the authorizations AWS makes for it."""


@dataclass
class Names:
    """What turns a name into the ARN AWS authorizes: a secret named by name (not ARN) is looked up here."""

    secrets: dict[str, str] = field(default_factory=dict)
    """Secret name -> its ARN (AWS authorizes the secret's full ARN however a request names it)."""

    def secret(self, secret_id: str) -> str:
        if secret_id.startswith("arn:"):
            return secret_id
        if secret_id not in self.secrets:
            raise LookupError(f"secret {secret_id!r} named by name: give its ARN to iam_calls.Names")
        return self.secrets[secret_id]


SECURE = {"aws:SecureTransport": "true"}
"""Every SDK call in AWS goes over TLS (the bucket policy refuses any other)."""


def _s3_object(action: str) -> Rule:
    return lambda p, n: [Request(action, s3_object(p), SECURE)]


def _s3_read(p: Mapping[str, Any], n: Names, status: int | None) -> list[Request]:
    """GetObject/HeadObject: s3:GetObject on the object; and when the object does not exist, the 404 the code reads
    as "no such object" needs s3:ListBucket on the bucket too (without it S3 answers 403: "Permissions" of the
    GetObject and HeadObject API references). That check carries no prefix."""
    requests = [Request("s3:GetObject", s3_object(p), SECURE)]
    if status == 404:
        requests.append(Request("s3:ListBucket", s3_bucket(p), SECURE))
    return requests


def _s3_list(p: Mapping[str, Any], n: Names) -> list[Request]:
    # ListObjects(V2): s3:ListBucket on the bucket, the prefix (an empty one when none is given) as s3:prefix
    context = {**SECURE, "s3:prefix": str(p.get("Prefix", ""))}
    if "MaxKeys" in p:
        context["s3:max-keys"] = str(p["MaxKeys"])
    if p.get("Delimiter"):
        context["s3:delimiter"] = str(p["Delimiter"])
    return [Request("s3:ListBucket", s3_bucket(p), context)]


def _s3_delete_objects(p: Mapping[str, Any], n: Names) -> list[Request]:
    # DeleteObjects: s3:DeleteObject on every key it names
    return [Request("s3:DeleteObject", s3_object(p, o["Key"]), SECURE) for o in p["Delete"]["Objects"]]


def _s3_copy(p: Mapping[str, Any], n: Names) -> list[Request]:
    source = p["CopySource"]
    bucket, _, key = (source if isinstance(source, str) else f"{source['Bucket']}/{source['Key']}").partition("/")
    return [Request("s3:GetObject", f"arn:aws:s3:::{bucket}/{key}", SECURE),
            Request("s3:PutObject", s3_object(p), SECURE)]


def _secret(p: Mapping[str, Any], n: Names) -> list[Request]:
    return [Request("secretsmanager:GetSecretValue", n.secret(str(p["SecretId"])))]


def _invoke(p: Mapping[str, Any], n: Names) -> list[Request]:
    return [Request("lambda:InvokeFunction", lambda_function(str(p["FunctionName"]), p.get("Qualifier")))]


def _describe_services(p: Mapping[str, Any], n: Names) -> list[Request]:
    cluster = _cluster_name(p)
    return [Request("ecs:DescribeServices", ecs_service(cluster, s), {"ecs:cluster": ecs_cluster(cluster)})
            for s in p["services"]]


def _update_service(p: Mapping[str, Any], n: Names) -> list[Request]:
    cluster = _cluster_name(p)
    context: dict[str, Any] = {"ecs:cluster": ecs_cluster(cluster)}
    if p.get("taskDefinition"):
        context["ecs:task-definition"] = str(p["taskDefinition"])
    providers = [s["capacityProvider"] for s in p.get("capacityProviderStrategy") or []]
    if len(providers) == 1:
        context["ecs:capacity-provider"] = providers[0]
    elif providers:
        context["ecs:capacity-provider"] = providers  # multi-valued: the evaluator refuses to guess
    if "enableExecuteCommand" in p:
        context["ecs:enable-execute-command"] = str(bool(p["enableExecuteCommand"])).lower()
    return [Request("ecs:UpdateService", ecs_service(cluster, str(p["service"])), context)]


def _task_protection(action: str) -> Rule:
    def rule(p: Mapping[str, Any], n: Names) -> list[Request]:
        cluster = _cluster_name(p)
        return [Request(action, ecs_task(cluster, t), {"ecs:cluster": ecs_cluster(cluster)}) for t in p["tasks"]]

    return rule


def _list_tasks(p: Mapping[str, Any], n: Names) -> list[Request]:
    # ListTasks authorizes on the cluster's container instances, with the cluster as its condition key
    cluster = _cluster_name(p)
    return [Request("ecs:ListTasks", f"arn:aws:ecs:{REGION}:{ACCOUNT}:container-instance/{cluster}/*",
                    {"ecs:cluster": ecs_cluster(cluster)})]


def _kms(action: str) -> Rule:
    def rule(p: Mapping[str, Any], n: Names) -> list[Request]:
        key = str(p.get("KeyId") or "")
        if not key.startswith("arn:aws:kms:"):
            raise LookupError(f"kms:{action} must name its key by ARN (KeyId), got {key!r}")
        context = {f"kms:EncryptionContext:{k}": v for k, v in (p.get("EncryptionContext") or {}).items()}
        return [Request(f"kms:{action}", key, context)]

    return rule


AUTHORIZATION: dict[tuple[str, str], Rule] = {
    ("s3", "GetObject"): _s3_read,
    ("s3", "HeadObject"): _s3_read,
    ("s3", "PutObject"): _s3_object("s3:PutObject"),
    ("s3", "DeleteObject"): _s3_object("s3:DeleteObject"),
    ("s3", "DeleteObjects"): _s3_delete_objects,
    ("s3", "CopyObject"): _s3_copy,
    ("s3", "CreateMultipartUpload"): _s3_object("s3:PutObject"),
    ("s3", "UploadPart"): _s3_object("s3:PutObject"),
    ("s3", "CompleteMultipartUpload"): _s3_object("s3:PutObject"),
    ("s3", "AbortMultipartUpload"): _s3_object("s3:AbortMultipartUpload"),
    ("s3", "ListParts"): _s3_object("s3:ListMultipartUploadParts"),
    ("s3", "ListObjectsV2"): _s3_list,
    ("s3", "ListObjects"): _s3_list,
    # HeadBucket: "you must have permission to perform the s3:ListBucket action" (S3 API reference); no prefix
    ("s3", "HeadBucket"): lambda p, n: [Request("s3:ListBucket", s3_bucket(p), SECURE)],
    ("s3", "ListMultipartUploads"): lambda p, n: [Request("s3:ListBucketMultipartUploads", s3_bucket(p), SECURE)],
    ("secretsmanager", "GetSecretValue"): _secret,
    ("lambda", "Invoke"): _invoke,
    ("ecs", "DescribeServices"): _describe_services,
    ("ecs", "UpdateService"): _update_service,
    ("ecs", "UpdateTaskProtection"): _task_protection("ecs:UpdateTaskProtection"),
    ("ecs", "GetTaskProtection"): _task_protection("ecs:GetTaskProtection"),
    ("ecs", "ListTasks"): _list_tasks,
    ("ecs", "DescribeTasks"): _task_protection("ecs:DescribeTasks"),
    ("kms", "GenerateDataKey"): _kms("GenerateDataKey"),
    ("kms", "Decrypt"): _kms("Decrypt"),
    ("kms", "Encrypt"): _kms("Encrypt"),
    ("sts", "GetCallerIdentity"): lambda p, n: [],  # always allowed, needs no permission
}


def authorizations(call: Call, names: Names) -> list[Request]:
    rule = AUTHORIZATION.get((call.service, call.operation))
    if rule is None:
        raise LookupError(f"no authorization rule for {call.service}:{call.operation}: add it to "
                          "tests/infra/iam_calls.py AUTHORIZATION (from the Service Authorization Reference)")
    if rule in (_s3_read,):
        return _s3_read(call.params, names, call.status)
    return rule(call.params, names)


# ---------------------------------------------------------------------- the recorder


class Recorder:
    """Records the calls made while it is active, each under the role and flow then acting
    (:meth:`acting`). One at a time per process."""

    active: Recorder | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.role: str | None = None
        self.flow: str = ""

    @contextmanager
    def recording(self) -> Iterator[Recorder]:
        with Recorder._lock:
            assert Recorder.active is None, "a recorder is already active"
            Recorder.active = self
        try:
            yield self
        finally:
            Recorder.active = None

    @contextmanager
    def acting(self, role: str | None, flow: str | None = None) -> Iterator[None]:
        """Calls made inside are ``role``'s (None: the test's own set-up and checks, not recorded)."""
        saved = self.role, self.flow
        self.role, self.flow = role, flow if flow is not None else self.flow
        try:
            yield
        finally:
            self.role, self.flow = saved

    def record(self, service: str, operation: str, params: Mapping[str, Any], presigned: bool) -> Call | None:
        if self.role is None:
            return None
        call = Call(self.role, self.flow, service, operation, dict(params), presigned)
        self.calls.append(call)
        return call


CONTEXT_KEY = "inferq_iam_call"
"""Where the recorded :class:`Call` rides in botocore's per-call context, from the parameters to the answer."""


def _on_client_params(params: Mapping[str, Any], model: Any, context: dict[str, Any] | None = None,
                      **_: Any) -> None:
    recorder = Recorder.active
    if recorder is not None:
        call = recorder.record(model.service_model.service_name, model.name, params,
                               bool((context or {}).get("is_presign_request")))
        if call is not None and context is not None:
            context[CONTEXT_KEY] = call


def _on_answer(http_response: Any, context: dict[str, Any] | None = None, **_: Any) -> None:
    call = (context or {}).get(CONTEXT_KEY)
    if isinstance(call, Call) and http_response is not None:
        call.status = int(http_response.status_code)


for _handler in (("provide-client-params", _on_client_params), ("after-call", _on_answer)):
    if _handler not in BUILTIN_HANDLERS:
        BUILTIN_HANDLERS.append(_handler)
