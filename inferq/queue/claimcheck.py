"""The claim check (docs/api.md, "Large payloads"): a request body or a result body larger than
``INFERQ_INLINE_MAX_BYTES`` is kept as an object in S3 (``INFERQ_FILES_BUCKET``, under ``claims/``), and the job
record holds a small reference in its place, so a job's Redis memory stays bounded whatever its payload.

This module is the shape of those references and of their keys, shared by the gateway and the worker; it does no
I/O (the S3 reads and writes are ``functions/gateway/claim_check.py``'s and ``gpu_worker/claim_check.py``'s).

- A claimed request body is stored in the record as ``{"inferq_claim": {"key", "bytes", "sha256"}}`` under
  ``claims/requests/<tenant>/<sha256>/<submission>.json``: ``<submission>`` is derived from the request's
  idempotency key when it has one (a resent submit, or a batch line's job made again, writes the same object and
  the same reference, so the request digest an idempotency key is checked against is the same both times), else
  random: two jobs never share an object, so one job's end can delete its own.
- A claimed result is stored as ``{"status_code": 200, "body_ref": {"key", "bytes", "sha256"}}`` under
  ``claims/results/<tenant>/<job id>/<sha256>.json``: a duplicate completion of the same job (a reclaimed
  attempt that also finished) writes its own object and never overwrites the one the record points to.

What is kept, and for how long (issue 40): a job's request object is deleted when the job ends (by the worker
that ends it, the gateway that cancels it while queued, or the batch driver whose batch's cancel ends it), except
a dead-lettered job's, which a redrive needs; a result object lives as long as the record that points to it, by
the bucket's lifecycle rule on ``claims/results/`` (a day, the default ``INFERQ_RESULT_TTL_S``); a second rule on
``claims/`` removes what no job ends for (the body of a refused submit, a dead letter never redriven) after a
week. Records written before this layout point to ``claims/<tenant>/requests/...`` and
``claims/<tenant>/results/...``: still read, and removed by that second rule.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from inferq import fastjson
from inferq.queue.jobs import Job

PREFIX = "claims/"
REQUESTS = PREFIX + "requests/"
"""Request bodies: deleted when their job ends, but for a dead letter's (a redrive reads it again); the lifecycle
rule on :data:`PREFIX` removes what no end deletes."""
RESULTS = PREFIX + "results/"
"""Result bodies: the bucket's lifecycle rule on this prefix expires them with the result TTL."""
MARKER = "inferq_claim"
"""The one field of a request body that was replaced by its claim."""
RESULT_REF = "body_ref"
"""The field of a result that holds its body's claim instead of ``body``."""
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_REQUEST_REST = re.compile(r"[0-9a-f]{64}/[0-9a-f]{32}\.json")


def encode(value: Any) -> bytes:
    """A request body as it is stored and measured: compact JSON, UTF-8 (what the record would have held), by the
    standard library, whose bytes stay the same from one version to the next: the key of a claimed request is
    their SHA-256, and the request digest an idempotency key is checked against holds that key."""
    return fastjson.STABLE.encode(value).encode()


def encode_result(value: Any) -> bytes:
    """A result body as it is stored and measured: :func:`inferq.fastjson.dumps`, as the record's inline results."""
    return fastjson.dumps(value)


def tenant_prefix(tenant: str) -> str:
    """The tenant's part of a prefix, percent-encoded: one tenant's never contains another's."""
    return f"{quote(tenant, safe='')}/"


def request_prefix(tenant: str) -> str:
    return f"{REQUESTS}{tenant_prefix(tenant)}"


def result_prefix(tenant: str, job_id: str) -> str:
    return f"{RESULTS}{tenant_prefix(tenant)}{job_id}/"


def submission(idempotency_key: str | None) -> str:
    """The last part of a request object's key: the same for every submit with ``idempotency_key`` (its
    SHA-256, so the key itself is not written into object names), else random (no two jobs share an object)."""
    if idempotency_key is None:
        return secrets.token_hex(16)
    return hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Claim:
    """Where one payload lives, its size and its SHA-256 (checked when it is read back)."""

    key: str
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "bytes": self.bytes, "sha256": self.sha256}

    @classmethod
    def from_json(cls, value: Any, prefix: str) -> Claim | None:
        """The claim in ``value``, or None when it is not one, or points outside ``prefix`` (a client cannot make
        a worker read another tenant's objects by sending a body that looks like a claim)."""
        if not isinstance(value, dict) or set(value) != {"key", "bytes", "sha256"}:
            return None
        key, size, digest = value["key"], value["bytes"], value["sha256"]
        if not (isinstance(key, str) and key.startswith(prefix) and ".." not in key):
            return None
        if not (isinstance(size, int) and size >= 0 and isinstance(digest, str) and _SHA256_RE.match(digest)):
            return None
        return cls(key, size, digest)


def request_claim(tenant: str, data: bytes, idempotency_key: str | None) -> Claim:
    """Where a request body is stored: one object per job (:func:`submission`), the same for a resent submit."""
    digest = hashlib.sha256(data).hexdigest()
    return Claim(f"{request_prefix(tenant)}{digest}/{submission(idempotency_key)}.json", len(data), digest)


def result_claim(tenant: str, job_id: str, data: bytes) -> Claim:
    digest = hashlib.sha256(data).hexdigest()
    return Claim(f"{result_prefix(tenant, job_id)}{digest}.json", len(data), digest)


def claimed_body(claim: Claim) -> dict[str, Any]:
    """The request body the record holds in place of a claimed one."""
    return {MARKER: claim.to_json()}


def claim_of_body(body: Any, tenant: str) -> Claim | None:
    """The claim a record's request body stands for, or None when the body is the request itself."""
    if not isinstance(body, dict) or len(body) != 1 or MARKER not in body:
        return None
    # a client can send a body shaped like a claim: only a key of the tenant's own request objects, in their exact
    # shape (named by the body's own digest), is one
    prefix = request_prefix(tenant)
    claim = Claim.from_json(body[MARKER], prefix)
    if claim is not None and _REQUEST_REST.fullmatch(claim.key[len(prefix):]) and \
            claim.key[len(prefix):][:64] == claim.sha256:
        return claim
    return None


def claimed_result(status_code: int, claim: Claim) -> dict[str, Any]:
    return {"status_code": status_code, RESULT_REF: claim.to_json()}


def claim_of_result(result: Any, tenant: str, job_id: str) -> Claim | None:
    """The claim a record's result holds, or None when the result is inline."""
    if not isinstance(result, dict) or RESULT_REF not in result:
        return None
    return Claim.from_json(result[RESULT_REF], result_prefix(tenant, job_id))


def verify(claim: Claim, data: bytes) -> bool:
    """The bytes read back are the ones the claim was made for."""
    return len(data) == claim.bytes and hashlib.sha256(data).hexdigest() == claim.sha256


def result_by_url(job: Job, url: str | None) -> dict[str, Any] | None:
    """The public ``result`` of a job whose result is claimed (docs/api.md): ``{"status_code", "body_url",
    "body_bytes"}``, ``url`` a presigned GET of it (None where nothing can sign one); None for an inline result."""
    claim = claim_of_result(job.result, job.tenant, job.id)
    if claim is None:
        return None
    return {"status_code": int((job.result or {}).get("status_code", 200)), "body_url": url,
            "body_bytes": claim.bytes}


def job_by_url(job: Job, sign: Callable[[str], str | None] | None = None) -> dict[str, Any]:
    """The job object, a claimed result given by URL (``sign(key)`` presigns one), never the internal
    reference: what pages of jobs and webhooks carry."""
    api = job.to_api()
    claim = claim_of_result(job.result, job.tenant, job.id)
    if claim is not None:
        api["result"] = result_by_url(job, sign(claim.key) if sign is not None else None)
    return api
