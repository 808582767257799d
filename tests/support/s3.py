"""moto's S3 in server mode, on a loopback port: boto3 clients reach it through ``AWS_ENDPOINT_URL`` like any
endpoint, and presigned URLs it signs can be fetched over HTTP. The server can be stopped and started again on the
same port (its buckets and objects live in this process), to make S3 really unreachable for a while."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from emulator.valkey import free_port

REGION = "us-east-1"


class MotoS3:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        for name, value in (("AWS_ENDPOINT_URL", self.endpoint), ("AWS_ACCESS_KEY_ID", "testing"),
                            ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", REGION)):
            monkeypatch.setenv(name, value)
        self._server_class = ThreadedMotoServer
        self._server: Any = None
        self.start()

    def start(self) -> None:
        self._server = self._server_class(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        return [o["Key"] for o in self.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoS3]:
    """A moto S3 server for one test (import this fixture into the test module)."""
    server = MotoS3(monkeypatch)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(s3: MotoS3) -> str:
    """A fresh bucket on that server."""
    name = f"claims-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=name)
    return name


@contextlib.contextmanager
def in_process_bucket(monkeypatch: pytest.MonkeyPatch, bucket: str) -> Iterator[Any]:
    """moto's S3 mocked in this process (no server) with ``bucket`` created; yields an S3 client on it."""
    import boto3
    from moto import mock_aws

    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", REGION)):
        monkeypatch.setenv(name, value)
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=bucket)
        yield client
