"""Settings: the contract names and defaults of docs/configuration.md, and a clear stop on any bad value."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inferq.config.settings import Settings, SettingsError


def test_defaults_match_the_design() -> None:
    s = Settings.from_env({})
    assert s.redis_url == "redis://127.0.0.1:6379/0" and s.queue == "default"
    assert (s.claim_idle_ms, s.max_attempts, s.max_deliveries, s.job_timeout_s) == (30000, 3, 5, 600)
    assert (s.max_queue_depth, s.max_body_bytes, s.result_ttl_s, s.window, s.drain_s) == (10000, 262144, 86400, 8, 25)
    assert (s.backend, s.openai_base_url, s.metrics_port) == ("mock", "http://127.0.0.1:8000", 9100)
    assert (s.scale_min, s.scale_max, s.target_per_worker) == (0, 4, 8)
    assert (s.scale_down_cooldown_s, s.scale_to_zero_after_s, s.scaler_interval_s) == (120, 300, 60.0)
    assert s.api_keys is None and s.api_keys_secret is None and s.ecs_cluster is None


def test_every_variable_is_read_with_its_prefix() -> None:
    s = Settings.from_env({"INFERQ_WINDOW": "32", "INFERQ_QUEUE": "gpu-a", "INFERQ_BACKEND": "OpenAI",
                           "INFERQ_API_KEYS": "acme:k-12345678,b:k-87654321", "INFERQ_SCALE_TARGET_PER_WORKER": "5"})
    assert s.window == 32 and s.queue == "gpu-a" and s.backend == "openai" and s.target_per_worker == 5
    assert s.api_keys == {"k-12345678": "acme", "k-87654321": "b"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("INFERQ_WINDOW", "eight"),
        ("INFERQ_WINDOW", "0"),
        ("INFERQ_MAX_ATTEMPTS", "-1"),
        ("INFERQ_REDIS_URL", "http://localhost"),
        ("INFERQ_QUEUE", "has space"),
        ("INFERQ_QUEUE", "{brace}"),
        ("INFERQ_BACKEND", "tensorrt"),
        ("INFERQ_API_KEYS", "nocolon"),
        ("INFERQ_API_KEYS", "team b:k2"),  # the same tenant rule as the API keys secret (inferq.queue.keys.TENANT)
        ("INFERQ_OPENAI_BASE_URL", "localhost:8000"),
        ("INFERQ_JOB_TIMEOUT_S", "3601"),
        ("INFERQ_SCALER_INTERVAL_S", "nan"),
        ("INFERQ_LOG_PAYLOADS", "maybe"),
        ("INFERQ_SCALE_MIN", "9"),
    ],
)
def test_a_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: value})
    assert info.value.variable == name and name in str(info.value)


def test_permissive_where_nothing_breaks() -> None:
    s = Settings.from_env({"INFERQ_API_KEYS": "a:k1,team-b:k2", "INFERQ_MAX_BODY_BYTES": "512",
                           "INFERQ_CLAIM_IDLE_MS": "50", "INFERQ_QUEUE": "gpu:a100"})
    assert s.api_keys == {"k1": "a", "k2": "team-b"} and s.max_body_bytes == 512 and s.claim_idle_ms == 50
    assert s.queue == "gpu:a100"


def test_a_process_with_a_bad_value_stops_at_start_naming_the_variable() -> None:
    code = "from inferq.config.settings import load_or_exit; load_or_exit()"
    proc = subprocess.run([sys.executable, "-c", code], env={"INFERQ_CLAIM_IDLE_MS": "soon"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "INFERQ_CLAIM_IDLE_MS" in proc.stderr and "Traceback" not in proc.stderr
