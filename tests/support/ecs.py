"""The one moto ECS every test that needs ECS uses (the ``ecs`` fixture of tests/conftest.py): a cluster ``inferq``
with the worker's task definition and a service ``gpu-workers`` at desired count 0, in moto's in-process mock, with
test credentials and no endpoint variable that could send a call elsewhere."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

CLUSTER, SERVICE, TASK_FAMILY = "inferq", "gpu-workers", "inferq-worker"
REGION = "eu-west-1"


def use_test_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and a region; no endpoint or profile from the machine's environment."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_ECS", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def create_service(client: Any, service: str = SERVICE) -> None:
    """One more worker service at desired count 0 in the cluster (a model registry has one per model)."""
    client.create_service(cluster=CLUSTER, serviceName=service, taskDefinition=TASK_FAMILY, desiredCount=0)


@contextlib.contextmanager
def moto_ecs() -> Iterator[Any]:
    """moto's AWS mock with the cluster, the task definition and the service; yields an ECS client on it."""
    import boto3
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("ecs")
        client.create_cluster(clusterName=CLUSTER)
        client.register_task_definition(
            family=TASK_FAMILY, containerDefinitions=[{"name": "worker", "image": "inferq-worker", "memory": 512}]
        )
        create_service(client)
        yield client


def desired_count(client: Any, service: str = SERVICE) -> int:
    return int(client.describe_services(cluster=CLUSTER, services=[service])["services"][0]["desiredCount"])
