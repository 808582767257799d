"""The claim-check references (inferq.queue.claimcheck): one object per job (the same for a resent submit), scoped
to their tenant and job, under a prefix per kind (the lifecycle rules' unit), and never shown to a client as they
are stored."""

from __future__ import annotations

import pytest

from inferq.config.settings import Settings, SettingsError
from inferq.queue import claimcheck
from inferq.queue.jobs import Job, JobStatus

DATA = claimcheck.encode({"model": "m", "messages": [{"role": "user", "content": "é \"x\""}]})


def job(tenant: str, result: dict[str, object]) -> Job:
    return Job(id="job_a", tenant=tenant, status=JobStatus.SUCCEEDED, url="/v1/chat/completions", body={},
               attempts=1, deliveries=1, created_at=1.0, result=result)


def test_a_request_claim_is_one_jobs_and_the_same_for_a_resend_with_its_idempotency_key() -> None:
    first, again = claimcheck.request_claim("t", DATA, "idem-1"), claimcheck.request_claim("t", DATA, "idem-1")
    assert first == again and first.key.startswith("claims/requests/t/") and first.bytes == len(DATA)
    assert "idem-1" not in first.key  # the key's digest names the object, not the key
    assert claimcheck.request_claim("t", DATA, "idem-2").key != first.key
    # without an idempotency key every job gets its own object: one job's end never deletes another's body
    assert claimcheck.request_claim("t", DATA, None).key != claimcheck.request_claim("t", DATA, None).key
    assert claimcheck.request_claim("u", DATA, "idem-1").key != first.key
    assert claimcheck.verify(first, DATA) and not claimcheck.verify(first, DATA + b" ")
    assert claimcheck.result_claim("t", "job_a", DATA).key.startswith("claims/results/t/job_a/")


def test_a_body_is_a_claim_only_when_it_points_into_its_own_tenants_requests() -> None:
    claim = claimcheck.request_claim("t", DATA, None)
    body = claimcheck.claimed_body(claim)
    assert claimcheck.claim_of_body(body, "t") == claim
    assert claimcheck.claim_of_body(body, "u") is None  # another tenant's object is never read for this job
    assert claimcheck.claim_of_body({**body, "model": "m"}, "t") is None  # a real body with that field is a body
    forged = {claimcheck.MARKER: {**claim.to_json(), "key": "claims/requests/t/../../u/x.json"}}
    assert claimcheck.claim_of_body(forged, "t") is None
    assert claimcheck.claim_of_body({claimcheck.MARKER: {**claim.to_json(), "bytes": -1}}, "t") is None


def test_only_a_key_in_the_exact_shape_of_a_request_object_named_by_its_digest_is_a_claim() -> None:
    """Under the tenant's request prefix, only ``<sha256>/<submission>.json`` of the body's own digest is a claim:
    a forged body cannot make a worker read any other object there."""
    other_shape = claimcheck.Claim(f"claims/requests/t/job_x/{'a' * 64}.json", 10, "a" * 64)
    assert claimcheck.claim_of_body(claimcheck.claimed_body(other_shape), "t") is None
    other_digest = claimcheck.Claim(f"claims/requests/t/{'b' * 64}/{'c' * 32}.json", 10, "a" * 64)
    assert claimcheck.claim_of_body(claimcheck.claimed_body(other_digest), "t") is None  # named by its digest


def test_a_tenant_prefix_never_contains_another_tenants() -> None:
    assert not claimcheck.request_prefix("a/b").startswith(claimcheck.request_prefix("a"))
    assert not claimcheck.result_prefix("a/b", "j").startswith(claimcheck.result_prefix("a", "j"))


def test_a_claimed_result_is_shown_by_url_never_by_its_reference() -> None:
    claim = claimcheck.result_claim("t", "job_a", DATA)
    stored = job("t", claimcheck.claimed_result(200, claim))
    assert claimcheck.job_by_url(stored, lambda key: f"https://signed/{key}")["result"] == {
        "status_code": 200, "body_url": f"https://signed/{claim.key}", "body_bytes": len(DATA)}
    assert claimcheck.job_by_url(stored)["result"] == {"status_code": 200, "body_url": None, "body_bytes": len(DATA)}
    inline = job("t", {"status_code": 200, "body": {"ok": True}})
    assert claimcheck.job_by_url(inline, lambda key: "unused") == inline.to_api()
    assert claimcheck.claim_of_result(stored.result, "t", "job_b") is None  # another job's object: not this one's


def test_inline_max_bytes_is_validated_at_start_naming_the_variable() -> None:
    assert Settings.from_env({}).inline_max_bytes == 65536
    assert Settings.from_env({"INFERQ_INLINE_MAX_BYTES": "1048576"}).inline_max_bytes == 1048576
    for bad in ("10", "lots", str(128 * 1024 * 1024)):
        with pytest.raises(SettingsError, match="INFERQ_INLINE_MAX_BYTES"):
            Settings.from_env({"INFERQ_INLINE_MAX_BYTES": bad})
