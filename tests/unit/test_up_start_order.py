"""``inferq up`` starts its S3 (moto) and creates the files bucket before the gateway listens, so no client reaches
a gateway whose Files, Uploads and Batches would answer 503 for want of a bucket (the readiness probe checks the
bucket too: tests/integration/gateway/test_tenant_limits.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from emulator import up
from inferq.settings import Settings


class Stop(Exception):
    """Ends the start once the gateway is spawned: the order up to there is what this test checks."""


async def test_the_gateway_is_spawned_only_after_the_files_bucket_exists(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    args = up.parse_args(["--data-dir", str(tmp_path), "--redis-url", "redis://127.0.0.1:1/0", "--port", "0"])
    supervisor = up.Supervisor(args, Settings(), {})
    steps: list[str] = []

    def start_moto() -> None:
        steps.append("s3")

    def create_bucket(endpoint: str, bucket: str) -> None:
        assert steps == ["s3"], "the bucket is made on the S3 that was started"
        steps.append(f"bucket {bucket}")

    async def spawn(role: str, argv: list[str], env: dict[str, str] | None = None) -> Any:
        steps.append(role)
        raise Stop

    monkeypatch.setattr(supervisor.ecs, "start", start_moto)
    monkeypatch.setattr(up, "create_bucket", create_bucket)
    monkeypatch.setattr(supervisor, "_spawn", spawn)
    with pytest.raises(Stop):
        await supervisor._start()
    assert steps == ["s3", "bucket inferq-files", "gateway"]
