"""The scaler's view of an ECS service: its counts, and the one change it makes (the desired count)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

ECS_ERRORS: tuple[type[BaseException], ...] = (BotoCoreError, ClientError)


class EcsUnavailable(Exception):
    """The service cannot be read or updated (API error, missing or inactive service)."""


@dataclass(frozen=True)
class ServiceCounts:
    desired: int
    running: int
    pending: int  # tasks still starting: provisioning an instance, pulling the image, loading the model


class EcsService:
    """The one GPU service the scaler sizes."""

    def __init__(self, client: Any, cluster: str, service: str) -> None:
        self.client = client
        self.cluster = cluster
        self.service = service

    def counts(self) -> ServiceCounts:
        try:
            reply = self.client.describe_services(cluster=self.cluster, services=[self.service])
        except ECS_ERRORS as exc:
            raise EcsUnavailable(f"DescribeServices failed: {exc}") from exc
        services = reply.get("services") or []
        if not services:
            reasons = ", ".join(f.get("reason", "?") for f in reply.get("failures") or []) or "not found"
            raise EcsUnavailable(f"service {self.service} in cluster {self.cluster}: {reasons}")
        found = services[0]
        if found.get("status", "ACTIVE") != "ACTIVE":
            raise EcsUnavailable(f"service {self.service} is {found.get('status')}")
        return ServiceCounts(
            desired=int(found.get("desiredCount", 0)),
            running=int(found.get("runningCount", 0)),
            pending=int(found.get("pendingCount", 0)),
        )

    def set_desired(self, count: int) -> None:
        try:
            self.client.update_service(cluster=self.cluster, service=self.service, desiredCount=count)
        except ECS_ERRORS as exc:
            raise EcsUnavailable(f"UpdateService failed: {exc}") from exc
