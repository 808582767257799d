"""The gateway's half of the claim check (docs/api.md, "Large payloads"): a submitted ``body`` larger than
``INFERQ_INLINE_MAX_BYTES`` is stored in S3 before the job is enqueued, and a claimed result is given back inline
when it fits one response, else as a short-lived presigned URL. The reference format is :mod:`inferq.queue.claimcheck`.

Without ``INFERQ_FILES_BUCKET`` nothing is claimed: every body stays inline, bounded by ``INFERQ_MAX_BODY_BYTES``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any

from inferq.config.settings import Settings
from inferq.queue import claimcheck
from inferq.queue.jobs import Job, JobRequest

from .errors import ApiError

if TYPE_CHECKING:
    from functions.storage import ClaimStore

log = logging.getLogger(__name__)

RESPONSE_INLINE_MAX_BYTES = 5 * 1024 * 1024 // 2
"""Largest claimed result given inline by ``GET /v1/jobs/{id}``. A Lambda response carries at most 6 MB, and
the job object travels in it as a JSON string, where escaping can nearly double it: 2.5 MiB leaves that room."""
URL_TTL_S = 900
"""How long a presigned ``body_url`` is valid (never longer than the credentials that signed it)."""
RETRY_AFTER_S = "1"
STORE_TIMEOUT_S = 20.0
"""Longest wait for S3 to take a claimed body on submit (5 MB) before answering 503."""
READ_TIMEOUT_S = 5.0
"""Longest wait for S3 to give a claimed result to inline before answering its URL instead."""


class ClaimCheck:
    def __init__(self, settings: Settings, store: ClaimStore | None = None) -> None:
        self.inline_max = settings.inline_max_bytes
        self._store = store
        self._bucket = settings.files_bucket
        self.response_inline_max = RESPONSE_INLINE_MAX_BYTES

    @property
    def store(self) -> ClaimStore | None:
        """The S3 store, built on first use (so a sandbox that claims nothing never imports it); None without a
        bucket."""
        if self._store is None and self._bucket:
            from functions.storage import ClaimStore

            self._store = ClaimStore(self._bucket)
        return self._store

    async def check_in(self, tenant: str, request: JobRequest, raw_bytes: int) -> JobRequest:
        """``request`` with a large body replaced by its claim, the body stored first. ``raw_bytes`` (the HTTP
        body's size) spares small requests the measuring: compact JSON outgrows the raw text only where numbers are
        spelled out (``1e9``), so a body under a quarter of the threshold is never worth measuring."""
        if self.store is None or raw_bytes <= self.inline_max // 4:
            return request
        data = claimcheck.encode(request.body)
        if len(data) <= self.inline_max:
            return request
        claim = claimcheck.request_claim(tenant, data, request.idempotency_key)  # one object per job
        from functions.storage import StorageUnavailable

        try:
            async with asyncio.timeout(STORE_TIMEOUT_S):  # the thread runs on; a retry writes the same object
                await asyncio.to_thread(self.store.put, claim.key, data)
        except (StorageUnavailable, TimeoutError) as exc:
            log.warning("claim check failed: %s", str(exc) or "timed out")
            raise ApiError(503, "the payload store is unavailable: retry with the same Idempotency-Key",
                           headers={"Retry-After": RETRY_AFTER_S}) from None
        return dataclasses.replace(request, body=claimcheck.claimed_body(claim))

    async def drop_request_body(self, job: Job) -> None:
        """Delete the claimed request body of ``job`` (as it was before it ended: the terminal transition drops the
        record's ``body``), now that it has ended here (a cancel while queued). One try: a failure is logged, and
        the bucket's lifecycle rule on ``claims/`` removes it later."""
        claim = claimcheck.claim_of_body(job.body, job.tenant)
        if claim is None or self.store is None:
            return
        from functions.storage import StorageUnavailable

        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                await asyncio.to_thread(self.store.delete, claim.key)
        except (StorageUnavailable, TimeoutError) as exc:
            log.warning("could not delete a cancelled job's request body: %s", str(exc) or "timed out")

    async def present(self, job: Job) -> dict[str, Any]:
        """The job object, a claimed result inline when it fits one response (else by URL, also when S3 cannot
        be read right now: the URL is signed locally)."""
        api = job.to_api()
        claim = claimcheck.claim_of_result(job.result, job.tenant, job.id)
        if claim is None:
            return api
        if self.store is not None and claim.bytes <= self.response_inline_max:
            from functions.storage import StorageUnavailable

            try:
                async with asyncio.timeout(READ_TIMEOUT_S):
                    data = await asyncio.to_thread(self.store.get, claim.key)
            except (StorageUnavailable, TimeoutError) as exc:
                log.warning("claimed result unreadable, answering its URL: %s", str(exc) or "timed out")
            else:
                if claimcheck.verify(claim, data):
                    api["result"] = {"status_code": _status(job), "body": json.loads(data)}
                    return api
                log.error("claimed result %s does not match its reference; answering its URL", claim.key)
        api["result"] = claimcheck.result_by_url(job, self.sign(claim.key))
        return api

    def by_url(self, job: Job) -> dict[str, Any]:
        """The job object, a claimed result always by URL: for pages of jobs (the events feed) and conflicts,
        which must stay small whatever the results."""
        return claimcheck.job_by_url(job, self.sign)

    def sign(self, key: str) -> str | None:
        """A presigned GET of ``key``; None without a bucket here (one at the worker only is a misconfiguration,
        shown as a missing URL rather than a 500) or without credentials to sign with."""
        store = self.store
        if store is None:
            return None
        from functions.storage import StorageUnavailable

        try:
            return store.url(key, URL_TTL_S)
        except StorageUnavailable as exc:
            log.error("cannot sign a claimed result's URL: %s", exc)
            return None


def _status(job: Job) -> int:
    return int((job.result or {}).get("status_code", 200))
