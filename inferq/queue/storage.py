"""What each tenant stores in the files bucket, counted in the cache: the file quotas (``INFERQ_TENANT_MAX_FILES``,
``INFERQ_TENANT_MAX_FILE_BYTES``) are checked against counters, never an S3 LIST, so a check costs one round trip to
the cache whatever the tenant stores (docs/api.md, "Files, Uploads, Batches").

Kept in the primary queue's slot, per tenant (:meth:`~inferq.queue.keys.Keys.storage`): each file's bytes by its id
and each open upload's parts' bytes by its id, with the totals ``#files``, ``#bytes`` (files), ``#parts`` (parts of
open uploads) and ``#v`` (the version of the file entries: the token of the last call that counted or dropped a
file). Every transition that adds or removes what a tenant stores updates them in the same script, within the quotas
there (racing writers cannot pass a bound together), safe to resend (G9): a file is counted under its id once, and a
resent copy writes the version its first copy wrote.

- ``addfile.lua``: a file written (``POST /v1/files``, checked; a batch's output and error files, never refused);
- ``dropfile.lua``: a file deleted (after S3's delete);
- ``addpart.lua``: an upload's part (checked against the bytes bound), charged until the upload ends;
- ``completeupload.lua``: the parts become a file (counted once, checked) and their charge goes;
- ``moveupload.lua`` to ``cancelled``: the parts' charge goes.

**Expiry, exact.** An upload's record lives an hour: :meth:`~inferq.queue.keys.Keys.storage_open` holds when each
upload with parts expires, and every script above first gives back the charge of those whose record has expired.

**Drift, corrected.** What no transition sees: a file the bucket's lifecycle rule deleted (``FileRetentionDays``), a
file written or deleted by a process that died before it counted it, counts lost with the cache (a failover's last
writes). :class:`Recount`, in the scaler, recounts each tenant from a LIST of its files at most once per
``INFERQ_FILE_RECOUNT_S``, off the request path, applied only if no file was counted or dropped meanwhile
(``#v``, ``recountfiles.lua``), and looks for tenants whose files S3 holds and no count does once per interval too.
The parts of an upload whose process died between S3's write and the count stay uncounted until the bucket's
lifecycle rule removes them (two days): one part per such death, and an upload holds at most its declared bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from inferq.queue.core import new_token, now_ms
from inferq.queue.keys import Keys

log = logging.getLogger(__name__)

RECOUNTS_PER_PASS = 50
"""Tenants recounted at most per pass (the scaler's invocation): a LIST per 1,000 files each."""
SWEEP_READ = 100
"""Expired uploads a read of the counts takes off itself (as ``includes/storageSweep.lua`` gives back)."""


@dataclass(frozen=True)
class Stored:
    """What a tenant stores, as counted: its files, their bytes, and the bytes of its open uploads' parts."""

    files: int
    bytes: int
    parts: int


class Listing(Protocol):
    """What a recount reads of the bucket (``functions/storage.py``; blocking: run in a thread)."""

    def file_sizes(self, tenant: str) -> dict[str, int]: ...
    def file_tenants(self) -> list[str]: ...


class Storage:
    """The counts of the primary queue ``queue`` (its ``redis``, ``keys`` and ``scripts``)."""

    def __init__(self, queue: Any) -> None:
        self.redis = queue.redis
        self.keys: Keys = queue.keys
        self.scripts = queue.scripts

    def _keys(self, tenant: str) -> list[str]:
        return [self.keys.storage(tenant), self.keys.storage_open(tenant), self.keys.storage_due]

    async def stored(self, tenant: str, now: int | None = None) -> Stored:
        """The tenant's counts, less the parts of uploads expired by ``now`` (ms) and not yet given back: reads
        only, one round trip (two when some expired)."""
        now = now_ms() if now is None else now
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(self.keys.storage(tenant), "#files", "#bytes", "#parts")
        pipe.zrangebyscore(self.keys.storage_open(tenant), "-inf", now, start=0, num=SWEEP_READ)
        (files, stored, parts), expired = await pipe.execute()
        parts = int(parts or 0)
        if expired:
            parts -= sum(int(b or 0) for b in await self.redis.hmget(self.keys.storage(tenant), expired))
        return Stored(int(files or 0), int(stored or 0), parts)

    async def add_file(self, tenant: str, file_id: str, size: int, max_files: int = 0,
                       max_bytes: int = 0) -> Stored | None:
        """Count a file just written, unless it takes the tenant past a bound (0: none): None when counted, else
        what the tenant stores (``parts`` folded into ``bytes``)."""
        reply = await self.scripts("addfile", self._keys(tenant),
                                   [tenant, file_id, size, now_ms(), max_files, max_bytes, new_token()])
        return None if int(reply[0]) == 1 else Stored(int(reply[1]), int(reply[2]), 0)

    async def drop_file(self, tenant: str, file_id: str) -> None:
        """Stop counting a file once S3 has deleted it."""
        await self.scripts("dropfile", [self.keys.storage(tenant)], [file_id, new_token()])

    async def complete_upload(self, tenant: str, upload_key: str, file_id: str, size: int, token: str,
                              max_files: int = 0, max_bytes: int = 0) -> tuple[int, Any]:
        """``completeupload.lua``: its code (1 completed, 0 refused at a bound: the files and bytes stored follow,
        2 not ``completing`` for ``token``: its status follows, -1 expired) and the rest of its reply."""
        reply = await self.scripts("completeupload", [upload_key, *self._keys(tenant)],
                                   [tenant, file_id, size, now_ms(), max_files, max_bytes, token])
        return int(reply[0]), reply[1:]

    async def recount(self, tenant: str, listing: Listing) -> bool | None:
        """Recount the tenant's files from a LIST: True when the counts changed, False when they were right, None
        when a file was counted or dropped during the LIST (left for a later pass)."""
        storage = self.keys.storage(tenant)
        version, counted, totals = await self._entries(storage)
        listed = await asyncio.to_thread(listing.file_sizes, tenant)
        gone = [f for f in counted if f not in listed]
        added = [(f, size) for f, size in listed.items() if counted.get(f) != size]
        args: list[Any] = [tenant, version, now_ms(), len(listed), sum(listed.values()), len(gone), *gone]
        args += [x for pair in added for x in pair]
        reply = await self.scripts("recountfiles", self._keys(tenant), args)
        if int(reply[0]) != 1:
            return None
        changed = bool(gone or added) or totals != (len(listed), sum(listed.values()))
        if changed:
            log.info("file counts recounted", extra={"tenant": tenant, "files": len(listed),
                                                     "counted_files": totals[0], "bytes": sum(listed.values()),
                                                     "counted_bytes": totals[1]})
        return changed

    async def _entries(self, storage: str) -> tuple[str, dict[str, int], tuple[int, int]]:
        """The index's version, its file entries (``file-…`` fields) and its file totals, read together."""
        fields = await self.redis.hgetall(storage)
        counted = {k: int(v) for k, v in fields.items() if k.startswith("file-")}
        return str(fields.get("#v", "")), counted, (int(fields.get("#files", 0)), int(fields.get("#bytes", 0)))

    async def recount_due(self, listing: Listing, interval_s: float, budget_s: float) -> int:
        """One pass: first (at most once per interval, by whichever scaler gets there first) the tenants whose files
        S3 holds and no count does, then the tenants not recounted for ``interval_s``, oldest first, until
        ``budget_s`` or :data:`RECOUNTS_PER_PASS`; how many were recounted."""
        deadline = time.monotonic() + budget_s
        now = now_ms()
        if await self.redis.set(self.keys.storage_scan, now, nx=True, px=max(1, int(interval_s * 1000))):
            await self._discover(await asyncio.to_thread(listing.file_tenants))
        due = await self.redis.zrangebyscore(self.keys.storage_due, "-inf", now - int(interval_s * 1000),
                                             start=0, num=RECOUNTS_PER_PASS)
        done = 0
        for tenant in due:
            if time.monotonic() >= deadline:
                break
            await self.recount(tenant, listing)
            done += 1
        return done

    async def _discover(self, tenants: Iterable[str]) -> None:
        """Tenants whose files S3 holds join the schedule, due now (those in it keep their place)."""
        found = list(tenants)
        for start in range(0, len(found), 1000):
            await self.redis.zadd(self.keys.storage_due, dict.fromkeys(found[start:start + 1000], 0), nx=True)
