"""``inferq up``'s gateway opens its port only once its S3 bucket exists (emulator/gateway.py): a real uvicorn
process with the emulator's command line, on real Valkey and a moto S3 server that has no bucket yet."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import pytest

from emulator.gateway import wait_for_bucket
from emulator.valkey import ValkeyProcess, free_port
from tests.support.s3 import MotoS3
from tests.support.s3 import s3 as s3_server  # noqa: F401  (the moto server fixture, used by name)
from tests.support.waiting import eventually

BUCKET = "inferq-up-bucket"


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_wait_for_bucket_returns_once_the_bucket_answers(s3_server: MotoS3) -> None:  # noqa: F811
    client = s3_server.client()
    with pytest.raises(TimeoutError, match=BUCKET):
        wait_for_bucket(client, BUCKET, timeout_s=0.2)
    client.create_bucket(Bucket=BUCKET)
    wait_for_bucket(client, BUCKET, timeout_s=5)


def test_the_gateway_opens_its_port_only_once_the_bucket_exists(s3_server: MotoS3,  # noqa: F811
                                                                valkey: ValkeyProcess) -> None:
    port = free_port()
    env = {**os.environ, "INFERQ_REDIS_URL": valkey.url, "INFERQ_API_KEYS": "t:key-emulator-gateway-01",
           "INFERQ_FILES_BUCKET": BUCKET, "INFERQ_QUEUE": f"upgw{port}", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "emulator.gateway", "uvicorn", "functions.gateway.app:app",
         "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:  # the app is imported and the factory waits
            if f"waiting for the files bucket {BUCKET}" in line:
                break
        else:
            pytest.fail(f"the gateway exited with {process.wait()} before waiting for its bucket")
        assert not listening(port), "the port opened before the bucket exists"
        s3_server.client().create_bucket(Bucket=BUCKET)
        def opened() -> bool:
            assert process.poll() is None, f"the gateway exited with {process.returncode}"
            return listening(port)

        eventually(opened, what="the gateway to open its port once the bucket exists", timeout=60)
        assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
    finally:
        process.terminate()
        process.wait(10)
