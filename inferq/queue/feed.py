"""The results feed (``GET /v1/events``, docs/api.md): a tenant's terminal jobs in the order they ended.

Read from the queue's terminal events stream (``inferq:{Q}:events``), which every terminal transition appends to
(``job``, ``status``, ``tenant``) and which all tenants share. A read's position is the id of the last entry it
looked at, so the feed needs no state of its own and survives any restart; each call scans at most ``SCAN_MAX``
entries (other tenants' included) and says ``has_more`` when it stopped early. Retention: the stream's length cap
and the result TTL (older entries are skipped; a job whose record has expired is left out).

The cursor a client holds is that position (one per queue with a model registry) sealed for its tenant
(:func:`seal`): encrypted with a fresh random nonce and authenticated together with the tenant's name. A stream id
moves with every tenant's terminal jobs; sealed, two cursors of one position look unrelated, so a tenant learns
nothing about other tenants' traffic from its cursors, and a cursor works for the tenant it was given to only. The
key is one random secret per deployment kept in Redis (``inferq:{Q}:feed:key`` of the primary queue, written once
with ``SET NX``): every gateway, Lambda or not, finds the same key without a setting, and the cursor stays valid
across restarts and scale-out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import struct
import time
import weakref
from dataclasses import dataclass

from inferq.queue.core import entry_key
from inferq.queue.jobs import Job
from inferq.queue.protocol import Queue

SCAN_MAX = 2000
"""Events stream entries one read looks at, whoever's they are."""
SEALED_RE = re.compile(r"^[A-Za-z0-9_-]{44,8192}$")
_VERSION = b"\x01"
_NONCE_BYTES = 16
_TAG_BYTES = 16
_U64 = 2**64


@dataclass(frozen=True)
class Page:
    jobs: list[Job]
    cursor: str
    has_more: bool


def _later(a: str, b: str) -> str:
    """The later of two stream ids."""
    return a if entry_key(a) >= entry_key(b) else b


async def read(queue: Queue, tenant: str, after: str | None, limit: int, wait_s: float = 0.0) -> Page:
    """Up to ``limit`` of the tenant's terminal jobs that ended after the entry ``after``. With ``wait_s``, waits
    (blocking in Redis, in slices shorter than the socket timeout) until one arrives or the time is over."""
    redis = queue.redis
    key = queue.keys.events
    floor = f"{max(0, int(time.time() * 1000) - queue.settings.result_ttl_s * 1000)}-0"
    cursor = _later(after, floor) if after else floor
    deadline = time.monotonic() + wait_s
    slice_s = max(0.1, queue.settings.redis_timeout_s * 0.5)
    while True:
        entries = await redis.xrange(key, min="(" + cursor, max="+", count=SCAN_MAX)
        matched: list[tuple[str, str]] = []
        stopped_early = len(entries) == SCAN_MAX
        for entry_id, fields in entries:
            if fields.get("tenant") == tenant:
                if len(matched) == limit:
                    stopped_early = True
                    break
                matched.append((entry_id, fields.get("job", "")))
            cursor = entry_id
        jobs: list[Job] = []
        if matched:
            pipe = redis.pipeline(transaction=False)
            for _, job_id in matched:
                pipe.hgetall(queue.keys.job(job_id))
            for record in await pipe.execute():
                if record and "status" in record:
                    jobs.append(Job.from_hash(record))
        remaining = deadline - time.monotonic()
        if jobs or stopped_early or remaining <= 0.01:
            return Page(jobs, cursor, stopped_early)
        # nothing for this tenant yet: block until the stream grows past the cursor, then look again
        await redis.xread({key: cursor}, count=1, block=max(1, int(min(remaining, slice_s) * 1000)))


# ---------------------------------------------------------------------- sealed cursors

_key_cache: weakref.WeakKeyDictionary[Queue, bytes] = weakref.WeakKeyDictionary()


async def cursor_key(queue: Queue, *, fresh: bool = False) -> bytes:
    """The deployment's cursor key, kept in ``queue``'s ``feed:key`` (made by the first gateway that needs it; ``SET
    NX GET`` answers the one already there) and cached per queue object. ``fresh`` reads it again (Redis lost it
    and another gateway made a new one)."""
    if not fresh and queue in _key_cache:
        return _key_cache[queue]
    made = secrets.token_hex(32)
    kept = await queue.redis.set(queue.keys.feed_key, made, nx=True, get=True)
    key = bytes.fromhex(kept or made)
    _key_cache[queue] = key
    return key


def _derived(key: bytes, purpose: bytes) -> bytes:
    return hmac.new(key, b"inferq feed cursor " + purpose, hashlib.sha256).digest()


def _keystream(key: bytes, nonce: bytes, size: int) -> bytes:
    """HMAC-SHA256 in counter mode (a PRF as a stream cipher): ``size`` bytes for one nonce."""
    enc = _derived(key, b"encrypt")
    blocks = (hmac.new(enc, nonce + struct.pack(">I", i), hashlib.sha256).digest() for i in range((size + 31) // 32))
    return b"".join(blocks)[:size]


def _tag(key: bytes, tenant: str, nonce: bytes, sealed: bytes) -> bytes:
    name = tenant.encode()
    message = _VERSION + struct.pack(">H", len(name)) + name + nonce + sealed
    return hmac.new(_derived(key, b"authenticate"), message, hashlib.sha256).digest()[:_TAG_BYTES]


def seal(key: bytes, tenant: str, positions: dict[str, str | None]) -> str:
    """The cursor for ``positions`` (queue name -> stream id, None: not read yet), for ``tenant`` alone. Its length
    depends on the queue names only (the configuration), never on the positions."""
    payload = b""
    for queue, position in positions.items():
        name = queue.encode()
        ms, seq = entry_key(position) if position else (0, 0)
        payload += struct.pack(">H", len(name)) + name + struct.pack(">QQ", ms % _U64, seq % _U64)
    nonce = secrets.token_bytes(_NONCE_BYTES)
    sealed = bytes(a ^ b for a, b in zip(payload, _keystream(key, nonce, len(payload)), strict=True))
    token = _VERSION + nonce + sealed + _tag(key, tenant, nonce, sealed)
    return base64.urlsafe_b64encode(token).decode().rstrip("=")


def unseal(key: bytes, tenant: str, cursor: str) -> dict[str, str | None] | None:
    """The positions a cursor of :func:`seal` holds, or None when it is not one made for ``tenant`` with ``key``."""
    if not SEALED_RE.match(cursor):
        return None
    try:
        token = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except ValueError:
        return None
    if len(token) < 1 + _NONCE_BYTES + _TAG_BYTES or token[:1] != _VERSION:
        return None
    nonce, sealed, tag = token[1:1 + _NONCE_BYTES], token[1 + _NONCE_BYTES:-_TAG_BYTES], token[-_TAG_BYTES:]
    if not hmac.compare_digest(tag, _tag(key, tenant, nonce, sealed)):
        return None
    payload = bytes(a ^ b for a, b in zip(sealed, _keystream(key, nonce, len(sealed)), strict=True))
    positions: dict[str, str | None] = {}
    at = 0
    while at < len(payload):
        (size,) = struct.unpack_from(">H", payload, at)
        name = payload[at + 2:at + 2 + size].decode()
        ms, seq = struct.unpack_from(">QQ", payload, at + 2 + size)
        positions[name] = f"{ms}-{seq}" if (ms, seq) != (0, 0) else None
        at += 2 + size + 16
    return positions
