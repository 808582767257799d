"""Files in S3 (``INFERQ_FILES_BUCKET``): what the gateway's Files and Uploads routes and the batch driver read
and write (docs/api.md, "Files, Uploads, Batches").

Layout: ``files/<tenant>/<file id>`` holds a file's bytes, with its filename, purpose and creation time as the
object's user metadata, so a file is one object and no second store can disagree with it; ``uploads/<tenant>/
<upload id>/<part id>`` holds the parts of an open upload until it is completed or cancelled. The tenant is
percent-encoded into the key, so one tenant's prefix never contains another's.

boto3 is synchronous: async callers run these methods in a thread. The client is :func:`inferq.aws.s3_client` (the
worker's claim checks use the same one), made on first use: boto3 is imported then, never at import time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import quote, unquote

from inferq.aws import s3_client

PART_BYTES = 8 * 1024 * 1024
"""Size of one multipart part the writer sends (S3's minimum is 5 MiB but for the last): the most it holds."""
READ_CHUNK_BYTES = 256 * 1024


@dataclass(frozen=True)
class FileInfo:
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str

    def to_api(self) -> dict[str, Any]:
        """OpenAI's file object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": None,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def _tenant(tenant: str) -> str:
    return quote(tenant, safe="")


def _meta(filename: str, purpose: str, created_at: int) -> dict[str, str]:
    # S3 user metadata is ASCII: the filename travels percent-encoded
    return {"filename": quote(filename, safe=""), "purpose": purpose, "created-at": str(created_at)}


class Bucket:
    """One bucket. ``client`` is made on first use unless injected (tests)."""

    def __init__(self, bucket: str, client: Any = None) -> None:
        self.bucket = bucket
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = s3_client()
        return self._client

    def ready(self) -> None:
        """Raise unless the bucket exists and answers (``/readyz``): one HEAD."""
        self.client.head_bucket(Bucket=self.bucket)


class FileStore(Bucket):
    """Files and upload parts, under ``files/`` and ``uploads/``."""

    def file_key(self, tenant: str, file_id: str) -> str:
        return f"files/{_tenant(tenant)}/{file_id}"

    def part_key(self, tenant: str, upload_id: str, part_id: str) -> str:
        return f"uploads/{_tenant(tenant)}/{upload_id}/{part_id}"

    # ------------------------------------------------------------------ files

    def put(self, tenant: str, file_id: str, body: bytes | BinaryIO, filename: str, purpose: str) -> FileInfo:
        created_at = int(time.time())
        self.client.put_object(
            Bucket=self.bucket, Key=self.file_key(tenant, file_id), Body=body,
            Metadata=_meta(filename, purpose, created_at), ContentType="application/jsonl",
        )
        info = self.head(tenant, file_id)
        assert info is not None
        return info

    def head(self, tenant: str, file_id: str) -> FileInfo | None:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.file_key(tenant, file_id))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        meta = head.get("Metadata") or {}
        return FileInfo(
            id=file_id,
            bytes=int(head["ContentLength"]),
            created_at=int(meta.get("created-at") or head["LastModified"].timestamp()),
            filename=unquote(meta.get("filename", file_id)),
            purpose=meta.get("purpose", "batch"),
        )

    def list_files(
        self, tenant: str, *, after: str | None, limit: int, purpose: str | None
    ) -> tuple[list[FileInfo], bool]:
        """The tenant's files in id order from ``after``; whether more follow."""
        prefix = f"files/{_tenant(tenant)}/"
        found: list[FileInfo] = []
        start = prefix + after if after else ""
        while True:
            page = self.client.list_objects_v2(
                Bucket=self.bucket, Prefix=prefix, StartAfter=start, MaxKeys=min(1000, limit + 1)
            )
            contents = page.get("Contents") or []
            for item in contents:
                start = item["Key"]
                info = self.head(tenant, item["Key"][len(prefix):])
                if info is None or (purpose and info.purpose != purpose):
                    continue
                if len(found) == limit:
                    return found, True
                found.append(info)
            if not page.get("IsTruncated"):
                return found, False

    def file_sizes(self, tenant: str) -> dict[str, int]:
        """The tenant's files and their bytes, from keys and sizes alone (one LIST per 1,000 files, no HEAD): what
        the scaler recounts the tenant's file quotas from (:mod:`inferq.queue.storage`), never a request."""
        prefix = f"files/{_tenant(tenant)}/"
        return {item["Key"][len(prefix):]: int(item["Size"]) for item in self._objects(prefix)}

    def file_tenants(self) -> list[str]:
        """Every tenant with files stored (one LIST per 1,000 tenants)."""
        found: list[str] = []
        token = None
        while True:
            kwargs: dict[str, str] = {"ContinuationToken": token} if token else {}
            page = self.client.list_objects_v2(Bucket=self.bucket, Prefix="files/", Delimiter="/", MaxKeys=1000,
                                               **kwargs)
            found += [unquote(p["Prefix"][len("files/"):-1]) for p in page.get("CommonPrefixes") or []]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return found

    def _objects(self, prefix: str) -> Iterator[dict[str, Any]]:
        token = None
        while True:
            kwargs: dict[str, str] = {"ContinuationToken": token} if token else {}
            page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix, MaxKeys=1000, **kwargs)
            yield from page.get("Contents") or []
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def delete(self, tenant: str, file_id: str) -> bool:
        if self.head(tenant, file_id) is None:
            return False
        self.client.delete_object(Bucket=self.bucket, Key=self.file_key(tenant, file_id))
        return True

    def chunks(self, tenant: str, file_id: str, start: int = 0) -> Iterator[bytes]:
        """The file's bytes from ``start``, a chunk at a time (a ranged GET: never the whole file in memory)."""
        from botocore.exceptions import ClientError

        extra = {"Range": f"bytes={start}-"} if start else {}
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.file_key(tenant, file_id), **extra)["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "InvalidRange":  # start is the end: nothing left
                return
            raise
        try:
            yield from body.iter_chunks(READ_CHUNK_BYTES)
        finally:
            body.close()

    def writer(self, tenant: str, file_id: str, filename: str, purpose: str) -> MultipartWriter:
        return MultipartWriter(self, self.file_key(tenant, file_id), _meta(filename, purpose, int(time.time())))

    def claimed(self, key: str) -> bytes:
        """A claim-checked payload (``claims/``, :mod:`inferq.queue.claimcheck`): the batch driver reads large results
        back into output files."""
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()

    def put_claim(self, key: str, data: bytes) -> None:
        """Store a claim-checked request body (:mod:`inferq.queue.claimcheck`): a batch line over
        ``INFERQ_INLINE_MAX_BYTES``, as the gateway stores a large submit."""
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="application/json")

    def delete_claim(self, key: str) -> None:
        """Delete a claim-checked request body whose job ended (a batch line its batch's cancel ended)."""
        self.client.delete_object(Bucket=self.bucket, Key=key)

    def discard_uploads(self, tenant: str, file_id: str) -> int:
        """Abort every multipart upload still open on the file's key (a writer killed before it completed or
        aborted); how many."""
        key = self.file_key(tenant, file_id)
        page = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=key)
        uploads = [u for u in page.get("Uploads") or [] if u.get("Key") == key]
        for upload in uploads:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload["UploadId"])
        return len(uploads)

    # ------------------------------------------------------------------ upload parts

    def put_part(self, tenant: str, upload_id: str, part_id: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.part_key(tenant, upload_id, part_id), Body=body)

    def part_chunks(self, tenant: str, upload_id: str, part_id: str) -> Iterator[bytes]:
        body = self.client.get_object(Bucket=self.bucket, Key=self.part_key(tenant, upload_id, part_id))["Body"]
        try:
            yield from body.iter_chunks(READ_CHUNK_BYTES)
        finally:
            body.close()

    def delete_parts(self, tenant: str, upload_id: str, part_ids: Sequence[str]) -> None:
        for start in range(0, len(part_ids), 1000):
            objects = [{"Key": self.part_key(tenant, upload_id, p)} for p in part_ids[start:start + 1000]]
            if objects:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})


class MultipartWriter:
    """Writes one object as an S3 multipart upload, a part whenever ``PART_BYTES`` are buffered: a file of any
    size costs at most one part of memory. Nothing is visible until :meth:`close`; :meth:`abort` leaves nothing
    (and the bucket's lifecycle rule cleans up after a writer that died before either)."""

    def __init__(self, store: FileStore, key: str, metadata: dict[str, str]) -> None:
        self.store = store
        self.key = key
        self.upload_id: str = store.client.create_multipart_upload(
            Bucket=store.bucket, Key=key, Metadata=metadata, ContentType="application/jsonl"
        )["UploadId"]
        self.parts: list[dict[str, Any]] = []
        self.buffer = bytearray()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.buffer += data
        self.size += len(data)
        if len(self.buffer) >= PART_BYTES:
            self._flush()

    def _flush(self) -> None:
        number = len(self.parts) + 1
        reply = self.store.client.upload_part(
            Bucket=self.store.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=bytes(self.buffer)
        )
        self.parts.append({"PartNumber": number, "ETag": reply["ETag"]})
        self.buffer.clear()

    def close(self) -> int:
        """Complete the object; its size in bytes."""
        if self.buffer or not self.parts:
            self._flush()
        self.store.client.complete_multipart_upload(
            Bucket=self.store.bucket, Key=self.key, UploadId=self.upload_id, MultipartUpload={"Parts": self.parts}
        )
        return self.size

    def abort(self) -> None:
        self.store.client.abort_multipart_upload(Bucket=self.store.bucket, Key=self.key, UploadId=self.upload_id)



# ---------------------------------------------------------------------- claim checks


class StorageUnavailable(Exception):
    """S3 could not be reached or refused a claim-check read or write (a fault to retry, never a 500)."""


class ClaimStore(Bucket):
    """Claim-checked payloads (:mod:`inferq.queue.claimcheck`) in one bucket, under ``claims/``: the gateway writes a
    large request body, reads or presigns a large result, and deletes the body of a job it cancels while queued.
    Encrypted as files are, by the bucket's default encryption; what no job's end deletes is removed by the
    bucket's lifecycle rules (:mod:`inferq.queue.claimcheck`)."""

    def put(self, key: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="application/json")
        except (BotoCoreError, ClientError) as exc:
            raise StorageUnavailable(f"could not store {key}: {type(exc).__name__}") from exc

    def get(self, key: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()
        except (BotoCoreError, ClientError) as exc:
            raise StorageUnavailable(f"could not read {key}: {type(exc).__name__}") from exc

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except (BotoCoreError, ClientError) as exc:
            raise StorageUnavailable(f"could not delete {key}: {type(exc).__name__}") from exc

    def url(self, key: str, ttl_s: int) -> str:
        """A presigned GET of ``key``, valid ``ttl_s`` (signed locally: no request to S3)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            url: str = self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=ttl_s
            )
        except (BotoCoreError, ClientError) as exc:  # no credentials to sign with
            raise StorageUnavailable(f"could not sign {key}: {type(exc).__name__}") from exc
        return url
