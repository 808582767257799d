"""The stack's IAM policies proven by its flows (issue 47): each role's real flows (tests/infra/iam_flows.py) run
against AWS APIs (moto) with the role's policy, taken from template.yaml and infra/*.yaml, enforced, and every
AWS call they make is evaluated against that policy.

Two enforcers, each where it is faithful (tests/infra/iam_stack.py says why): moto itself refuses a role's
PutObject, GetObject and DeleteObject outside its statements (the flow then fails on a real AccessDenied); the
evaluator of tests/infra/iam_policy.py decides every call as AWS would (actions, ARNs with wildcards, the condition
operators, explicit denies, the bucket policy), from the authorizations tests/infra/iam_calls.py derives per call.

- :func:`test_each_flow_is_allowed_everything_it_does` fails on a call a role makes and its policy does not allow,
  naming the call, the authorization and why;
- :func:`test_no_role_holds_a_grant_no_flow_uses` fails on a grant no flow used (least privilege), but for the
  ones :data:`UNEXERCISED` names with the reason no offline flow can use them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from emulator.valkey import ValkeyProcess
from inferq.webhooks import guarded_http
from tests.support.tls import HttpsReceiver, private_ca

from .iam_calls import ACCOUNT, Call, Recorder, authorizations
from .iam_flows import FLOWS, Flow
from .iam_policy import Decision, Grant, Request, evaluate
from .iam_stack import Stack, build

TEST_ENV = {
    "INFERQ_INLINE_MAX_BYTES": "1024",  # small payloads are claim-checked: the S3 paths run without megabytes
    "INFERQ_RETRY_BASE_MS": "0",
    "INFERQ_WEBHOOK_ALLOW_PRIVATE": "true",  # the webhook receiver is on loopback
    "INFERQ_REDIS_TIMEOUT_S": "10",  # moto answering a loaded machine's KMS calls inside a request's bound
}
"""What the tests change in every role's environment: sizes, timings and the receiver's address, never which AWS
calls are made."""

UNEXERCISED: dict[str, str] = {}
"""Grant (as :class:`Grant` prints) -> why no flow here can use it. Empty: every grant is used by a flow."""


@dataclass
class Verdict:
    call: Call
    request: Request | None
    decision: Decision | None
    error: str | None = None


@dataclass
class Results:
    stack: Stack
    failures: dict[str, BaseException] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)

    def of(self, flow: Flow) -> list[Verdict]:
        return [v for v in self.verdicts if v.call.flow == flow.id]


def judge(stack: Stack, call: Call) -> list[Verdict]:
    try:
        requests = authorizations(call, stack.names)
    except LookupError as exc:
        return [Verdict(call, None, None, str(exc))]
    role = stack.roles[call.role]
    verdicts = []
    for request in requests:
        key_policy = stack.key_policies.get(request.resource) if request.action.startswith("kms:") else None
        if request.action.startswith("kms:") and key_policy is None:
            verdicts.append(Verdict(call, request, None, f"no key policy known for {request.resource}"))
            continue
        resource_policy = stack.bucket_policy if request.action.startswith("s3:") else key_policy
        decision = evaluate(request, role.policies, principal=role.principal,
                            account_root=f"arn:aws:iam::{ACCOUNT}:root", resource_policy=resource_policy,
                            key_policy=key_policy is not None)
        verdicts.append(Verdict(call, request, decision))
    return verdicts


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Results]:
    """Every flow of :data:`FLOWS`, run once on one stack (a flow's failure is kept for its own test)."""
    from moto import mock_aws
    from moto.core import enable_iam_authentication

    before = dict(os.environ)
    mp = pytest.MonkeyPatch()
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_ECS", "AWS_PROFILE",
                 "AWS_SESSION_TOKEN", "ECS_AGENT_URI"):
        mp.delenv(name, raising=False)
    for name, value in (("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ACCESS_KEY_ID", "testing"),
                        ("AWS_SECRET_ACCESS_KEY", "testing")):
        mp.setenv(name, value)
    valkey = ValkeyProcess(tmp_path_factory.mktemp("valkey-iam")).start()
    recorder = Recorder()
    receiver = webhook_receiver(tmp_path_factory.mktemp("tls"), mp)
    try:
        with mock_aws():
            stack = build(valkey, recorder)
            for role in stack.roles.values():
                role.env.update(TEST_ENV)
            results = Results(stack)
            stack.values["webhook_url"] = f"https://127.0.0.1:{receiver.port}/hook"
            stack.receiver = receiver
            with recorder.recording(), enable_iam_authentication():
                for flow in FLOWS:
                    with recorder.acting(None, flow.id):
                        try:
                            asyncio.run(flow.run(stack))
                        except Exception as exc:  # kept: the flow's own test reports it
                            results.failures[flow.id] = exc
            for call in recorder.calls:
                results.verdicts += judge(stack, call)
            yield results
    finally:
        receiver.close()
        valkey.stop()
        mp.undo()
        guarded_http._verifying_context.cache_clear()
    # the roles' environments stayed in their flows: a variable left behind reaches every later test's processes
    after = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    before.pop("PYTEST_CURRENT_TEST", None)
    assert after == before, set(after.items()) ^ set(before.items())


def webhook_receiver(directory: Path, mp: pytest.MonkeyPatch) -> HttpsReceiver:
    """A loopback HTTPS receiver whose private CA the senders trust through SSL_CERT_FILE."""
    ca_path, server_tls = private_ca(directory)
    mp.setenv("SSL_CERT_FILE", str(ca_path))
    guarded_http._verifying_context.cache_clear()  # read once per process
    return HttpsReceiver(server_tls)


def _report(verdicts: list[Verdict]) -> str:
    lines = []
    for v in verdicts:
        if v.error:
            lines.append(f"  {v.call.role}: {v.call} -> {v.error}")
        elif v.decision is not None and not v.decision.allowed:
            lines.append(f"  {v.call.role}: {v.call}\n      needs {v.request}: {v.decision.reason}")
    return "\n".join(dict.fromkeys(lines))


@pytest.mark.parametrize("flow", FLOWS, ids=[f.id for f in FLOWS])
def test_each_flow_is_allowed_everything_it_does(results: Results, flow: Flow) -> None:
    verdicts = results.of(flow)
    refused = _report(verdicts)
    failure = results.failures.get(flow.id)
    assert not refused and failure is None, (
        f"{flow.id}: the role's policy refuses what the flow does\n{refused}"
        + (f"\nthe flow failed: {type(failure).__name__}: {failure}" if failure else ""))
    assert verdicts, f"{flow.id} made no AWS call"


def test_no_role_holds_a_grant_no_flow_uses(results: Results) -> None:
    used: set[Grant] = {g for v in results.verdicts if v.decision and v.decision.allowed for g in v.decision.grants}
    unused = []
    for role in results.stack.roles.values():
        for policy in role.policies:
            for grant in policy.grants():
                if grant not in used and str(grant) not in UNEXERCISED:
                    unused.append(f"  {role.name}: {grant}")
    assert not unused, "grants no flow uses (remove them, or add the flow that needs them):\n" + "\n".join(unused)


def test_every_role_has_a_flow() -> None:
    from .iam_stack import ROLES

    roles = {call for call in ROLES}
    covered = {f.role for f in FLOWS} | {"worker", "task-execution"}  # run inside the flows that queue work
    assert roles <= covered, roles - covered
