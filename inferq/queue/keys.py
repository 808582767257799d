"""Every Redis key name of a queue, in one place (docs/data-model.md).

All keys of queue ``Q`` start with ``inferq:{Q}:``: the hash tag puts one queue in one cluster slot, so every
script touches a single slot and runs on ElastiCache Serverless (always cluster mode).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GROUP = "workers"
"""The consumer group every worker reads through."""

LANE_KEYS = ("normal", "high", "low")
"""The order in which a script that may touch any lane takes the lane streams through ``KEYS`` (the Lua prelude
defines ``LANE_KEYS`` from this)."""

WEBHOOK_GROUP = "webhooks"
"""The consumer group that delivers webhooks from the terminal events stream."""


TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""What a tenant name may be, wherever it comes from (the API keys secret or ``INFERQ_API_KEYS``), so a tenant that
works locally works deployed. It names keys (``idem:<tenant>:…``) and logs: no separators, spaces or controls."""

TENANT_RULE = "1-64 ASCII letters, digits, '_', '.' or '-'"

USAGE_ROWS = 64
"""Rows (lane and model) one tenant may have in one hour's usage bucket; past them its jobs count into model
``(other)`` (``includes/meter.lua``): a tenant naming ever new models cannot make a bucket grow without bound."""
USAGE_OTHER = "(other)"


@dataclass(frozen=True)
class Keys:
    queue: str

    @property
    def prefix(self) -> str:
        return f"inferq:{{{self.queue}}}:"

    @property
    def stream(self) -> str:
        """The ``normal`` lane's stream."""
        return self.prefix + "stream"

    def stream_of(self, lane: str) -> str:
        """The stream of a lane (``high``, ``normal``, ``low``): a job's entries are always in its lane's."""
        return self.prefix + "stream" if lane == "normal" else f"{self.prefix}stream:{lane}"

    @property
    def lane_streams(self) -> list[str]:
        """The three lane streams in :data:`LANE_KEYS` order, as scripts that may touch any lane take them."""
        return [self.stream_of(lane) for lane in LANE_KEYS]

    # fair share (G10, inferq/queue/fairshare.py): per lane, the jobs waiting for admission and the tenants' turns

    def fair_jobs(self, lane: str) -> str:
        """Sorted set: the lane's jobs waiting for admission into its stream, one member ``<tenant>|<attempt>|<job
        id>`` each, scored by minus the job's virtual start tag (the lowest tag, the highest score, is admitted
        next)."""
        return f"{self.prefix}fair:{lane}:jobs"

    def fair_tags(self, lane: str) -> str:
        """Hash: ``<tenant>`` -> the virtual finish tag of its last job placed, ``<tenant>:n`` -> its jobs waiting
        (while it has some), ``:clock`` -> the lane's virtual time (the start tag of the last job admitted)."""
        return f"{self.prefix}fair:{lane}:tags"

    def fair_lane(self, lane: str) -> list[str]:
        """A lane's stream and its two fair-share keys, in the order the scripts take them (the ``fairLane``
        include): stream, waiting jobs, tags."""
        return [self.stream_of(lane), self.fair_jobs(lane), self.fair_tags(lane)]

    @property
    def fair_lanes(self) -> list[str]:
        """:meth:`fair_lane` of every lane, in :data:`LANE_KEYS` order (9 keys), for scripts that may touch any
        lane."""
        return [key for lane in LANE_KEYS for key in self.fair_lane(lane)]

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def idem(self, tenant: str, digest: str) -> str:
        return f"{self.prefix}idem:{tenant}:{digest}"

    def done(self, job_id: str) -> str:
        """A one-element list pushed when the job turns terminal: long-poll waiters block on it (BLMOVE)."""
        return f"{self.prefix}done:{job_id}"

    def out(self, job_id: str) -> str:
        """Stream: the job's output as it is made (the text of its first choice), one entry per delta written by the
        worker that holds the job (``appendoutput.lua``), closed when the job ends (``closeoutput.lua``):
        :mod:`inferq.queue.output`."""
        return f"{self.prefix}out:{job_id}"

    @property
    def dlq(self) -> str:
        return self.prefix + "dlq"

    @property
    def dlq_index(self) -> str:
        """Sorted set, all scores 0, ordered by member: ``<tenant>|<9999999999999 - ms>|<9999999999 - seq>|<job
        id>`` per dead letter (ms and seq of its ``dlq`` entry), so one tenant's dead letters, newest first, are one
        ``ZRANGE BYLEX`` (``GET /v1/dlq``), never a scan of every tenant's. A tenant's members older than the
        result TTL are trimmed when it dead-letters again."""
        return self.prefix + "dlq:index"

    @property
    def delayed(self) -> str:
        return self.prefix + "delayed"

    @property
    def expiry(self) -> str:
        """Sorted set of jobs with a ``ttl_s``, scored by when they expire unless an attempt has started."""
        return self.prefix + "expiry"

    @property
    def events(self) -> str:
        return self.prefix + "events"

    @property
    def stats(self) -> str:
        return self.prefix + "stats"

    @property
    def tenants(self) -> str:
        """Hash tenant -> its unfinished jobs (``INFERQ_TENANT_MAX_DEPTH``); a tenant leaves it at zero."""
        return self.prefix + "tenants"

    @property
    def history(self) -> str:
        """Capped list of the scaler's samples of the counters, newest first (the console's charts)."""
        return self.prefix + "history"

    @property
    def workers(self) -> str:
        return self.prefix + "workers"

    @property
    def scale(self) -> str:
        return self.prefix + "scale"

    @property
    def fleet(self) -> str:
        """Hash worker id -> ``"<started ms> <attempts run> <their backend seconds>"``: the order the drain target
        follows (newest drain first) and the run time the scaler sizes by."""
        return self.prefix + "fleet"

    @property
    def feed_key(self) -> str:
        """The deployment's secret that seals the results feed's cursors (:mod:`inferq.queue.feed`); the primary queue's
        only. Written once (``SET NX``), never expires."""
        return self.prefix + "feed:key"

    @property
    def wake(self) -> str:
        """``SET NX EX`` guard that rate-limits wake-on-enqueue calls to the scaler."""
        return self.prefix + "wake"

    def rate(self, tenant: str) -> str:
        """String: a tenant's rate-limit bucket (``INFERQ_RATE_LIMIT_PER_S``), the next request's due time (ms)."""
        return f"{self.prefix}rate:{tenant}"

    def rate_call(self, tenant: str, token: str) -> str:
        """String: one rate-limit call's answer, kept a few seconds so a resent copy answers the same."""
        return f"{self.prefix}rate:{tenant}:call:{token}"

    def usage_hour(self, label: str) -> str:
        """Hash: one UTC hour's usage (``inferq.usage.periods.hour_label``: ``2025-12-06T14``), a row per tenant, lane
        and model (``includes/meter.lua``); expires ``INFERQ_USAGE_RETENTION_DAYS`` after the hour."""
        return f"{self.prefix}usage:{label}"

    def usage_month(self, label: str) -> str:
        """Hash: each tenant's tokens and GPU ms of one UTC month (``2025-12``), what budgets are checked against;
        expires a week into the next month."""
        return f"{self.prefix}usage:month:{label}"

    @property
    def usage_exported(self) -> str:
        """String: the last hour whose usage the scaler exported (S3, CloudWatch); the primary queue's only."""
        return self.prefix + "usage:exported"
    @property
    def bounds(self) -> str:
        """Hash: what each tenant holds in the queue after its jobs end (bytes of retained records, by the hour they
        expire) and the engine deaths its jobs caused, with its cool-off (:mod:`inferq.queue.holds`)."""
        return self.prefix + "bounds"

    def waits(self, tenant: str) -> str:
        """Sorted set: a tenant's long-poll slots (``INFERQ_TENANT_MAX_WAITS``), slot token -> when the slot lapses
        (ms): a slot its holder never gave back (a Lambda sandbox that died mid-wait) is free from then. The primary
        queue's only: one bound per tenant for the whole deployment. Expires with its last slot."""
        return f"{self.prefix}waits:{tenant}"

    @property
    def mock_calls(self) -> str:
        return self.prefix + "mock:calls"

    def batch(self, batch_id: str) -> str:
        """Hash: one batch's record (status, times, counts, the driver's progress through the input file)."""
        return f"{self.prefix}batch:{batch_id}"

    def batch_lines(self, batch_id: str) -> str:
        """Hash: input line number -> job id, written with the driver's progress in one transaction."""
        return f"{self.prefix}batch:{batch_id}:lines"

    @property
    def batches_active(self) -> str:
        """Sorted set of the batches the driver still has work on (score: created, ms)."""
        return self.prefix + "batches:active"

    def batches_of(self, tenant: str) -> str:
        """Sorted set of a tenant's batches (score: created, ms), for ``GET /v1/batches``."""
        return f"{self.prefix}batches:tenant:{tenant}"

    def batch_lock(self, batch_id: str) -> str:
        """``SET NX PX`` lease: one driver at a time works on a batch."""
        return f"{self.prefix}batch:{batch_id}:lock"

    def upload(self, upload_id: str) -> str:
        """Hash: an open Uploads API upload (expires with it)."""
        return f"{self.prefix}upload:{upload_id}"

    def storage(self, tenant: str) -> str:
        """Hash: what a tenant stores, counted (the file quotas, :mod:`inferq.queue.storage`): each file's bytes by
        file id, each open upload's parts' bytes by upload id, and the totals. The primary queue's only."""
        return f"{self.prefix}storage:{tenant}"

    def storage_open(self, tenant: str) -> str:
        """Sorted set: a tenant's uploads with parts charged, by when their record expires (ms)."""
        return f"{self.prefix}storage-open:{tenant}"

    @property
    def storage_due(self) -> str:
        """Sorted set: the tenants whose files are counted, by when they were last recounted from S3 (ms)."""
        return self.prefix + "storage-due"

    @property
    def storage_scan(self) -> str:
        """String, ``SET NX PX``: the last look for tenants whose files S3 holds and no count does."""
        return self.prefix + "storage-scan"


def tenant_webhook_secret(tenant: str) -> str:
    """Hash: a tenant's webhook signing secret (and the one it replaced, while that stays valid). Not a queue's key:
    one secret signs the tenant's webhooks from every queue (model) of the deployment; the tenant is its hash tag."""
    return f"inferq:tenant:{{{tenant}}}:webhook-secret"
