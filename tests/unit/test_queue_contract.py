"""The queue's client side without a server: the settings of the tenant quota and the replica wait, the failure
codes shared with the scripts, and the call tokens that make a resent call recognisable (G9)."""

from __future__ import annotations

import pytest
from redis import exceptions as redis_errors

from inferq.config.settings import Settings, SettingsError
from inferq.queue.jobs import Job, JobStatus
from inferq.queue.protocol import Delivery, QueueFull, ReplicationLag, TenantQuotaFull, settle_token
from inferq.redis.scripting import Code, load


def test_tenant_quota_and_replica_wait_are_off_by_default_and_read_from_the_environment() -> None:
    assert (Settings.from_env({}).tenant_max_depth, Settings.from_env({}).redis_wait_replicas) == (0, 0)
    s = Settings.from_env({"INFERQ_TENANT_MAX_DEPTH": "50", "INFERQ_REDIS_WAIT_REPLICAS": "2"})
    assert (s.tenant_max_depth, s.redis_wait_replicas) == (50, 2)


BAD = [("INFERQ_TENANT_MAX_DEPTH", "-1"), ("INFERQ_TENANT_MAX_DEPTH", "many"), ("INFERQ_REDIS_WAIT_REPLICAS", "-1"),
       ("INFERQ_REDIS_WAIT_REPLICAS", "17")]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_a_bad_quota_or_replica_count_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: value})
    assert info.value.variable == name


def test_a_tenant_at_its_quota_is_a_full_queue_and_replication_lag_is_transient() -> None:
    assert issubclass(TenantQuotaFull, QueueFull) and TenantQuotaFull(3).unfinished == 3  # the gateway's 429
    assert issubclass(ReplicationLag, redis_errors.ConnectionError)  # the gateway's 503, the worker's retry
    assert "1 of 2 replicas" in str(ReplicationLag(1, 2))


def test_every_failure_code_a_script_returns_is_in_the_code_enum() -> None:
    for name, codes in {"finish": (-1, -4, -8), "retry": (-1, -4, -7, -8), "release": (-1, -4, -8),
                        "enqueue": (-3, -9), "start": (-1, -4, -5, -7), "redrive": (-1, -6, -3, -9)}.items():
        header = load(name).source.split("]]", 1)[0]
        for code in codes:
            assert f"{code} {Code(code).name}" in header, f"{name}.lua does not document {Code(code).name}"


def _delivery(lease: str) -> Delivery:
    job = Job(id="job_x", tenant="t", status=JobStatus.RUNNING, url="/v1/chat/completions", body={}, attempts=1,
              deliveries=1, created_at=0.0)
    return Delivery("1-0", job, lease=lease)


def test_the_same_write_of_one_delivery_has_one_token_and_any_other_write_another() -> None:
    d = _delivery("lease-a")
    assert settle_token(d, "finish", "succeeded", "{}", "") == settle_token(d, "finish", "succeeded", "{}", "")
    tokens = {settle_token(d, "finish", "succeeded", "{}", ""), settle_token(d, "finish", "failed", "", "{}"),
              settle_token(d, "retry", "{}"), settle_token(d, "release"), settle_token(_delivery("lease-b"), "release")}
    assert len(tokens) == 5
    assert settle_token(_delivery(""), "release") != settle_token(_delivery(""), "release")  # no lease: random
