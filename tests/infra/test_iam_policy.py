"""The policy evaluator the IAM flows rely on (tests/infra/iam_policy.py) decides as AWS documents: the cases
below are the IAM User Guide's ("Policy evaluation logic", "IAM JSON policy elements: Condition operators")."""

from __future__ import annotations

import pytest

from .iam_policy import Policy, Request, Unsupported, arn_matches, evaluate

ROOT = "arn:aws:iam::123456789012:root"
ROLE = "arn:aws:iam::123456789012:role/gateway"
BUCKET = "arn:aws:s3:::files"


def decide(request: Request, *statements: dict, resource_policy: Policy | None = None,
           key_policy: bool = False) -> bool:
    policy = Policy.of("p", {"Statement": list(statements)})
    return evaluate(request, [policy], principal=ROLE, account_root=ROOT, resource_policy=resource_policy,
                    key_policy=key_policy).allowed


def allow(action: object, resource: object, **condition: dict) -> dict:
    statement: dict = {"Effect": "Allow", "Action": action, "Resource": resource}
    if condition:
        statement["Condition"] = condition
    return statement


def test_actions_match_with_wildcards_and_without_case() -> None:
    get = Request("s3:GetObject", f"{BUCKET}/files/a")
    assert decide(get, allow("s3:Get*", f"{BUCKET}/*"))
    assert decide(get, allow("S3:getobject", f"{BUCKET}/*"))
    assert decide(get, allow("s3:?etObject", f"{BUCKET}/*"))
    assert not decide(get, allow("s3:GetObjectAcl", f"{BUCKET}/*"))
    assert not decide(get, allow(["s3:PutObject", "s3:List*"], "*"))
    assert decide(get, {"Effect": "Allow", "NotAction": "s3:Put*", "Resource": "*"})
    assert not decide(get, {"Effect": "Allow", "NotAction": "s3:Get*", "Resource": "*"})


def test_resources_match_segment_by_segment() -> None:
    assert arn_matches("arn:aws:s3:::files/claims/*", "arn:aws:s3:::files/claims/requests/t/x.json")
    assert not arn_matches("arn:aws:s3:::files/claims/*", "arn:aws:s3:::files/files/t/x")
    assert not arn_matches("arn:aws:s3:::files/*", "arn:aws:s3:::files")  # the bucket is not one of its objects
    assert arn_matches("arn:aws:ecs:*:123456789012:task/inferq/*", "arn:aws:ecs:eu-west-1:123456789012:task/inferq/t1")
    # a wildcard in one segment never spans a colon into the next
    assert not arn_matches("arn:aws:ecs:us-east-1*:task/x", "arn:aws:ecs:us-east-1:123456789012:task/x")
    assert arn_matches("*", "arn:aws:lambda:us-east-1:123456789012:function:f")
    assert arn_matches("arn:aws:secretsmanager:us-east-1:123456789012:secret:keys-??????",
                       "arn:aws:secretsmanager:us-east-1:123456789012:secret:keys-AbCdEf")


def test_an_explicit_deny_wins_over_any_allow() -> None:
    put = Request("s3:PutObject", f"{BUCKET}/files/a", {"aws:SecureTransport": "false"})
    tls_only = Policy.of("bucket", {"Statement": [{
        "Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": [BUCKET, f"{BUCKET}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]})
    assert not decide(put, allow("s3:*", "*"), resource_policy=tls_only)
    assert decide(Request(put.action, put.resource, {"aws:SecureTransport": "true"}), allow("s3:*", "*"),
                  resource_policy=tls_only)
    assert not decide(put, allow("s3:*", "*"), {"Effect": "Deny", "Action": "s3:PutObject", "Resource": "*"})


def test_nothing_allowed_is_an_implicit_deny() -> None:
    assert not decide(Request("lambda:InvokeFunction", "arn:aws:lambda:us-east-1:123456789012:function:f"))


@pytest.mark.parametrize(("condition", "context", "allowed"), [
    ({"StringLike": {"s3:prefix": "files/*"}}, {"s3:prefix": "files/t/"}, True),
    ({"StringLike": {"s3:prefix": "files/*"}}, {"s3:prefix": "uploads/t/"}, False),
    ({"StringLike": {"s3:prefix": "files/*"}}, {}, False),  # a key the request lacks matches nothing
    ({"StringLikeIfExists": {"s3:prefix": ["files/*", "uploads/*"]}}, {}, True),  # ... unless IfExists
    ({"StringLikeIfExists": {"s3:prefix": ["files/*", "uploads/*"]}}, {"s3:prefix": "uploads/t/"}, True),
    ({"StringLikeIfExists": {"s3:prefix": ["files/*", "uploads/*"]}}, {"s3:prefix": ""}, False),
    ({"StringEquals": {"S3:Prefix": "a"}}, {"s3:prefix": "a"}, True),  # keys are case-insensitive ...
    ({"StringEquals": {"s3:prefix": "A"}}, {"s3:prefix": "a"}, False),  # ... values are not
    ({"ArnEquals": {"ecs:cluster": "arn:aws:ecs:us-east-1:1:cluster/inferq"}},
     {"ecs:cluster": "arn:aws:ecs:us-east-1:1:cluster/inferq"}, True),
    ({"ArnEquals": {"ecs:cluster": "arn:aws:ecs:us-east-1:1:cluster/inferq"}},
     {"ecs:cluster": "arn:aws:ecs:us-east-1:1:cluster/other"}, False),
    ({"ArnEqualsIfExists": {"ecs:task-definition": "arn:aws:ecs:us-east-1:1:task-definition/w:1"}}, {}, True),
    ({"ArnEqualsIfExists": {"ecs:task-definition": "arn:aws:ecs:us-east-1:1:task-definition/w:1"}},
     {"ecs:task-definition": "arn:aws:ecs:us-east-1:1:task-definition/w:2"}, False),
    ({"BoolIfExists": {"ecs:enable-execute-command": "false"}}, {"ecs:enable-execute-command": "true"}, False),
    ({"BoolIfExists": {"ecs:enable-execute-command": "false"}}, {}, True),
    ({"StringNotEquals": {"aws:SourceAccount": "1"}}, {"aws:SourceAccount": "2"}, True),
    ({"NumericLessThanEquals": {"s3:max-keys": "1000"}}, {"s3:max-keys": "1000"}, True),
    ({"NumericLessThanEquals": {"s3:max-keys": "1000"}}, {"s3:max-keys": "1001"}, False),
    ({"Null": {"s3:prefix": "true"}}, {}, True),
    ({"Null": {"s3:prefix": "true"}}, {"s3:prefix": ""}, False),
    # two operators, or two keys: all must hold
    ({"StringLike": {"s3:prefix": "files/*"}, "StringEquals": {"s3:delimiter": "/"}}, {"s3:prefix": "files/"},
     False),
])
def test_condition_operators(condition: dict, context: dict, allowed: bool) -> None:
    request = Request("s3:ListBucket", BUCKET, context)
    assert decide(request, allow("s3:ListBucket", BUCKET, **condition)) is allowed


@pytest.mark.parametrize("statement", [
    allow("s3:ListBucket", BUCKET, **{"ForAnyValue:StringLike": {"s3:prefix": "a*"}}),
    allow("s3:ListBucket", BUCKET, DateGreaterThan={"aws:CurrentTime": "2020-01-01T00:00:00Z"}),
    allow("s3:GetObject", "arn:aws:s3:::files/${aws:username}/*"),
    allow("s3:GetObject", {"Fn::GetAtt": ["FilesBucket", "Arn"]}),
    {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*", "NotPrincipal": {"AWS": ROOT}},
])
def test_grammar_it_does_not_implement_is_refused_not_guessed(statement: dict) -> None:
    with pytest.raises(Unsupported):
        decide(Request("s3:ListBucket", BUCKET, {"s3:prefix": "a"}), statement)


def test_a_key_policy_must_allow_or_delegate_to_iam() -> None:
    key = "arn:aws:kms:us-east-1:123456789012:key/k"
    decrypt = Request("kms:Decrypt", key)
    delegating = Policy.of("key", {"Statement": [{"Effect": "Allow", "Principal": {"AWS": ROOT}, "Action": "kms:*",
                                                  "Resource": "*"}]})
    closed = Policy.of("key", {"Statement": [{"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::1:role/other"},
                                              "Action": "kms:*", "Resource": "*"}]})
    assert decide(decrypt, allow("kms:Decrypt", key), resource_policy=delegating, key_policy=True)
    assert not decide(decrypt, resource_policy=delegating, key_policy=True)  # delegated, but IAM grants nothing
    assert not decide(decrypt, allow("kms:Decrypt", key), resource_policy=closed, key_policy=True)
