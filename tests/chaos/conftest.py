from __future__ import annotations

import pytest

from inferq.config.settings import Settings


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Short leases: a killed worker's jobs come back after one second."""
    return settings.replace(claim_idle_ms=1000, metrics_port=0, job_timeout_s=30, drain_s=5)
