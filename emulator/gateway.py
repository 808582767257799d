"""The emulator's gateway process: ``python -m emulator.gateway uvicorn functions.gateway.app:app ...`` imports the
gateway, waits until the files bucket exists, then runs uvicorn with the arguments after ``uvicorn``.

``inferq up`` starts the gateway and moto side by side (each takes seconds): the gateway's imports run while moto
starts, and uvicorn opens its port only once ``INFERQ_FILES_BUCKET`` answers a ``HeadBucket`` on moto's S3. No
client ever reaches a gateway whose Files, Uploads and Batches would fail for want of a bucket.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

BUCKET_WAIT_S = 60.0
POLL_S = 0.05


def wait_for_bucket(client: Any, bucket: str, timeout_s: float = BUCKET_WAIT_S) -> None:
    """Return once ``bucket`` answers; raise TimeoutError after ``timeout_s`` (S3 down or no such bucket)."""
    from botocore.exceptions import BotoCoreError, ClientError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.head_bucket(Bucket=bucket)
            return
        except (BotoCoreError, ClientError) as exc:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the files bucket {bucket} did not answer within {timeout_s:g}s: {exc}") from None
        time.sleep(POLL_S)


def main(argv: list[str]) -> None:
    """``argv``: ``uvicorn`` and its arguments."""
    if not argv or argv[0] != "uvicorn":
        raise SystemExit("usage: python -m emulator.gateway uvicorn APP [uvicorn options]")
    import functions.gateway.app  # noqa: F401 - the slow part, done while moto starts

    bucket = os.environ.get("INFERQ_FILES_BUCKET")
    if bucket:
        import boto3
        from botocore.config import Config

        print(f"gateway: waiting for the files bucket {bucket}", flush=True)
        # one try per poll (the loop is the retry), path-style as the gateway's own client on an endpoint
        client = boto3.client("s3", config=Config(s3={"addressing_style": "path"}, connect_timeout=1, read_timeout=2,
                                                  retries={"mode": "standard", "total_max_attempts": 1}))
        try:
            wait_for_bucket(client, bucket)
        except TimeoutError as exc:
            raise SystemExit(f"inferq gateway: {exc}") from None
    from uvicorn.main import main as uvicorn_main

    sys.argv = argv
    uvicorn_main()


if __name__ == "__main__":
    main(sys.argv[1:])
