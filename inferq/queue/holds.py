"""What one tenant holds in a queue after its jobs end, and the engine deaths its jobs caused: the per-tenant
bounds a submit must pass (G11), kept in one hash per queue (:meth:`~inferq.queue.keys.Keys.bounds`).

**Retained records.** A job's record outlives the job by the result TTL (a batch line's, by its batch's end): what
a tenant's ended jobs leave behind is charged to the tenant in bytes when each job ends (the ``terminate`` include:
:data:`RECORD_OVERHEAD_BYTES` plus the bytes of what the record keeps that the tenant chose: metadata, webhook URL,
result, errors, a dead letter's body), in the hour its record expires, and given back when that hour is over. A
submit is refused (429 ``quota_exceeded``) while the tenant's charge is at ``INFERQ_TENANT_MAX_RETAINED_BYTES``: so
no tenant can fill a ``noeviction`` cache with records, whatever it submits and cancels at its rate limit.
:data:`RECORD_OVERHEAD_BYTES` covers what a record costs beyond those bytes -- its fixed fields, the hash's own
overhead, its idempotency key, its terminal event, its dead-letter entries -- and tests/integration/protocol/
test_tenant_memory.py holds it above what a real Valkey reports (``MEMORY USAGE``) for records at every bound.

**Ended batches.** A batch's record and its lines outlive the batch by the result TTL: when the driver retires a
batch (``retirebatch.lua``) they are charged to its tenant the same way, until its tenant's index of batches forgets
it, and a tenant at its quota creates no batch (:func:`retained_full`), so creating and cancelling batches at the rate
limit leaves no more behind than the quota.

**Open uploads.** An upload's record lives an hour: ``openupload.lua`` charges it (and ``addpart.lua`` each part)
in the hour it expires in, and refuses a tenant at its quota.

**Engine deaths.** A job dead-lettered because the model server died running it (``engine_died``, ``retry.lua``) is
a strike against its tenant; ``INFERQ_ENGINE_STRIKES`` of them within ``INFERQ_ENGINE_STRIKE_WINDOW_S`` and the
tenant's submits to that queue (model) are refused for ``INFERQ_ENGINE_COOLOFF_S`` (429 ``engine_cooloff``): one
tenant's poison requests cannot keep every worker of a model restarting its engine.

Fields of the hash, per tenant ``t`` (a tenant name has no ``|``): ``t|kept`` (bytes charged now), ``t|<hour>``
(bytes whose records expire in that hour, hours since the epoch), ``t|from`` and ``t|to`` (the first and last hour
charged), ``t|deaths`` (the times of its last engine deaths, ms, space-separated), ``t|cool`` (when its cool-off
ends, ms).
"""

from __future__ import annotations

from typing import Any

from inferq.queue.keys import Keys

BUCKET_MS = 3_600_000
"""The charge of a record is given back when the hour its record expires in is over: at most an hour late."""

RECORD_OVERHEAD_BYTES = 3072
"""What one ended job costs the cache beyond the bytes it is charged for (see the module's docstring)."""

HOURS_READ = 1000
"""The most hours of a charge :func:`retained_full` reads back: more than any record or batch is charged for."""


async def retained_full(redis: Any, keys: Keys, tenant: str, max_kept: int, now_ms: int) -> float | None:
    """Seconds until some of the tenant's charge goes, when what its ended jobs and batches left behind holds
    ``max_kept`` bytes or more (0: no bound); None while under it. Reads only: the hours that are over are taken
    off as ``holdsAdmit`` (the next submit) gives them back, so a tenant that never submits is not refused for a
    charge whose records have expired."""
    if not max_kept:
        return None
    prefix = tenant + "|"
    kept, first = await redis.hmget(keys.bounds, prefix + "kept", prefix + "from")
    if kept is None or int(kept) < max_kept:
        return None
    hour = now_ms // BUCKET_MS
    start = max(int(first if first is not None else hour), hour - HOURS_READ)
    if start < hour:
        over = await redis.hmget(keys.bounds, [f"{prefix}{h}" for h in range(start, hour)])
        if int(kept) - sum(int(b or 0) for b in over) < max_kept:
            return None
    return ((hour + 1) * BUCKET_MS - now_ms) / 1000
