"""What ``inferq up`` prepares on the host before it starts anything: the ports it checks are free, the data
directory it locks, the development API key it keeps there, and the AWS environment its children get (moto's, with
credentials that reach nothing real)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import socket
from pathlib import Path
from typing import Any

_KEY_RE = re.compile(r"^[A-Za-z0-9_.~-]{8,256}$")


def bind_error(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now, or None: checked before starting, so a second ``inferq up`` on the same
    port fails at once with a clear message instead of probing the first one's gateway and calling itself ready."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return "is already in use (another inferq up?)" if exc.errno == errno.EADDRINUSE else exc.strerror
    return None


def lock_data_dir(data_dir: Path) -> Any:
    """Hold ``data_dir/lock`` for this process's life, or None when another ``inferq up`` holds it: two Valkeys
    writing one AOF directory would corrupt it. The lock goes with the process, however it ends."""
    import fcntl

    data_dir.mkdir(parents=True, exist_ok=True)
    handle = (data_dir / "lock").open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def dev_api_key(data_dir: Path) -> str:
    """The development key kept in ``data_dir/dev-api-key``: created once, reused by every later ``inferq up``."""
    path = data_dir / "dev-api-key"
    with contextlib.suppress(FileNotFoundError):
        key = path.read_text().strip()
        if _KEY_RE.match(key):
            return key
    key = "iq_dev_" + secrets.token_urlsafe(24)
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key + "\n")
    return key


def aws_env(endpoint: str) -> dict[str, str]:
    """Every AWS SDK call of a child goes to moto, with credentials that can reach nothing real."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }


def _moto_client(service: str, endpoint: str) -> Any:
    import boto3

    credentials = aws_env(endpoint)  # the children's: moto's test credentials
    return boto3.client(service, endpoint_url=endpoint, region_name=credentials["AWS_REGION"],
                        aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"])


def create_bucket(endpoint: str, bucket: str) -> None:
    """The files bucket (Files, Uploads, batch output) in moto's S3, on the same server as ECS."""
    _moto_client("s3", endpoint).create_bucket(Bucket=bucket)


def create_key_alias(endpoint: str, alias: str) -> None:
    """A KMS key under ``alias`` (``alias/<name>``) in moto, unless it is there: the key that seals the tenants'
    webhook secrets when ``INFERQ_WEBHOOK_SECRETS_KEY`` names one (`make sam-local`: the Lambda containers and this
    stack's processes share it, where a local key file would be on this machine only)."""
    kms = _moto_client("kms", endpoint)
    if alias not in [a["AliasName"] for a in kms.list_aliases()["Aliases"]]:
        key = kms.create_key(Description="inferq tenant webhook secrets (emulator)")["KeyMetadata"]["KeyId"]
        kms.create_alias(AliasName=alias, TargetKeyId=key)
