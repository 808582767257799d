"""The worker's half of the claim check (docs/api.md, "Large payloads"): before the backend is called, a claimed
request body is read back from S3; after it answers, a result larger than ``INFERQ_INLINE_MAX_BYTES`` is stored in
S3 and the record gets its reference (:mod:`inferq.queue.claimcheck`), so the job's Redis memory stays bounded.

S3 trouble is a transient fault: each read or write is tried :data:`inferq.aws.S3_ATTEMPTS` times by botocore
(standard retry mode, with backoff), then the attempt fails with a :class:`RetryableError`, which the worker
retries with its usual backoff, bounded by ``INFERQ_MAX_ATTEMPTS`` (and a job that ran out is dead-lettered and
can be redriven): a job is never lost to S3.
A claimed body that is gone (its object expired) or does not match its reference fails the job at once.

boto3 is synchronous: its calls run in a thread. The client is made on first use by :func:`inferq.aws.s3_client`,
the one the gateway's ``functions/storage.py`` uses too.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from inferq import aws
from inferq.config.settings import Settings
from inferq.queue import claimcheck
from inferq.queue.jobs import Job

from .backends.base import FatalError, RetryableError

log = logging.getLogger(__name__)

T = TypeVar("T")

DELETE_TIMEOUT_S = 5.0
"""Longest wait for S3 to delete an ended job's request body (the worker moves on; the lifecycle rule is the net)."""
URL_TTL_S = 3600
"""How long a webhook's ``body_url`` is valid: a receiver may take a while to read what it was sent."""


class _Missing(Exception):
    pass


class ClaimCheck:
    """One worker's claim check. ``client`` is an S3 client (tests inject one); without ``INFERQ_FILES_BUCKET``
    every result stays inline."""

    def __init__(self, settings: Settings, client: Any = None) -> None:
        self.bucket = settings.files_bucket
        self.inline_max = settings.inline_max_bytes
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = aws.s3_client()
        return self._client

    async def request_body(self, job: Job) -> dict[str, Any]:
        """The body to send to the model server: the record's, or the claimed one read back."""
        claim = claimcheck.claim_of_body(job.body, job.tenant)
        if claim is None:
            return job.body
        if not self.bucket:
            raise FatalError("the request body is in S3 but this worker has no INFERQ_FILES_BUCKET")
        data = await self._s3(f"read the request body ({claim.bytes} bytes)", lambda: self._get(claim.key))
        if not claimcheck.verify(claim, data):
            raise FatalError("the stored request body does not match its reference")
        body: dict[str, Any] = json.loads(data)
        return body

    async def result(self, job: Job, status_code: int, body: Any) -> dict[str, Any]:
        """The job's ``result`` for the record: inline, or the reference to a large body stored in S3."""
        if not self.bucket:
            return {"status_code": status_code, "body": body}
        data = claimcheck.encode_result(body)
        if len(data) <= self.inline_max:
            return {"status_code": status_code, "body": body}
        claim = claimcheck.result_claim(job.tenant, job.id, data)
        await self._s3(f"store the result ({claim.bytes} bytes)", lambda: self._put(claim.key, data))
        return claimcheck.claimed_result(status_code, claim)

    async def drop_request_body(self, job: Job) -> None:
        """Delete the job's claimed request body, once the job has ended (not dead-lettered: a redrive reads it
        again). One try: a failure is logged, and the bucket's lifecycle rule on ``claims/`` removes it later."""
        claim = claimcheck.claim_of_body(job.body, job.tenant)
        if claim is None or not self.bucket:
            return
        try:
            async with asyncio.timeout(DELETE_TIMEOUT_S):  # the job's outcome is written: never hold it up long
                await asyncio.to_thread(self._delete, claim.key)
        except Exception as exc:  # best effort (TimeoutError included): the lifecycle rule is the net
            log.warning("could not delete an ended job's request body (%s); the lifecycle rule will",
                        type(exc).__name__)

    def job_api(self, job: Job) -> dict[str, Any]:
        """The job object a webhook carries: a claimed result by presigned URL (docs/api.md, "Webhooks")."""
        return claimcheck.job_by_url(job, self.sign)

    def sign(self, key: str) -> str | None:
        """A presigned GET of ``key``, valid :data:`URL_TTL_S` (signed locally; None if it cannot be)."""
        if not self.bucket:
            return None
        try:
            url: str = self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=URL_TTL_S)
        except Exception as exc:  # no credentials to sign with: the receiver reads the job instead
            log.error("cannot sign a claimed result's URL: %s", type(exc).__name__)
            return None
        return url

    # ------------------------------------------------------------------ S3

    def _get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            stream = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise _Missing(key) from None
            raise
        try:
            return bytes(stream.read())
        finally:
            stream.close()

    def _delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def _put(self, key: str, data: bytes) -> None:
        # encrypted by the bucket's default encryption, as files are
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="application/json")

    async def _s3(self, what: str, call: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(call)  # botocore has retried it (inferq.aws.S3_ATTEMPTS)
        except _Missing:
            raise FatalError("the request body is gone from S3 (its object expired before the job ran)") from None
        except Exception as exc:  # botocore's errors, a dropped connection, credentials: the job's retry
            log.warning("S3 call failed after %d tries: %s", aws.S3_ATTEMPTS, type(exc).__name__)
            raise RetryableError(f"could not {what} in S3: {type(exc).__name__}") from exc
