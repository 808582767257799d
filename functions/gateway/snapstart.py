"""Lambda SnapStart runtime hooks of the gateway (template.yaml: ``SnapStart: ApplyOn: PublishedVersions``).

With SnapStart, Lambda runs the init (the import of ``functions.gateway.app``) once per published version, takes a
snapshot of the sandbox's memory, and starts every new sandbox of that version from a copy of it. Two things of
an initialized process must not be shared by copies:

- **connections**: a socket open in the snapshot is dead in every copy. The init opens none (clients are made on
  first use), but whatever is open is closed before the snapshot and dropped again after a restore: the Redis
  client (the next request connects anew) and the lazily made boto3 clients (Secrets Manager for the API keys, the
  scaler's Lambda client, S3 for files and claim checks), whose pooled connections and credentials belong to the
  sandbox that made them.
- **randomness**: every copy starts with the same state of ``random``, of the retry jitter (``inferq.redis.faults``) and
  of the request-id prefix (``edge.RequestIds``); after a restore each is reseeded from ``os.urandom``, so copies
  draw differently. Job ids, lease tokens and batch ids come from ``secrets`` (the kernel's random source, which a
  restore reseeds) and are unique across copies without help.

The hooks are registered with ``snapshot_restore_py``, which only the Lambda runtime has: elsewhere (uvicorn,
``sam local``, tests) :func:`register` finds no such module and does nothing; the hooks themselves are plain
functions of the app, which tests run.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from inferq.redis import faults
from inferq.redis.connection import provider_for

from . import edge

log = logging.getLogger("inferq.gateway.snapstart")


def drop_connections(app: Any) -> None:
    """Close the Redis client and forget every lazily made boto3 client; the next request makes new ones."""
    gw = app.state.gateway
    gw.queues.close_now()
    for wake in gw.wakes.values():
        _forget_client(wake.waker)
    _forget_client(gw.keys)
    for store in (getattr(gw, "file_store", None), getattr(gw.claim_check, "store", None)):
        _forget_client(store)
    if gw.settings.redis_auth_secret:  # the cache token's reader (the token in hand is kept)
        _forget_client(provider_for(gw.settings.redis_auth_secret))


def _forget_client(holder: Any) -> None:
    """Our own lazily made clients: a holder of a cached secret (auth.SecretKeys, connection.SecretCredentialProvider)
    drops it with ``forget_client()``; the others (wake.LambdaWaker, storage.Bucket) keep theirs in ``_client``.
    Either is made again on next use."""
    if holder is None:
        return
    forget = getattr(holder, "forget_client", None)
    if callable(forget):
        forget()
    elif getattr(holder, "_client", None) is not None:
        holder._client = None


def reseed() -> None:
    """Fresh seeds from ``os.urandom`` for what a snapshot would otherwise give every copy alike."""
    random.seed()
    faults.reseed_jitter()
    edge.reseed_request_ids()


def before_snapshot(app: Any) -> None:
    app.complete_routes()  # the snapshot holds every route: a restored sandbox builds none on its first request
    drop_connections(app)
    app.state.telemetry.flush()  # nothing counted is left in the snapshot to be flushed by every copy


def after_restore(app: Any) -> None:
    reseed()
    drop_connections(app)
    log.debug("restored from a SnapStart snapshot: seeds renewed, connections dropped")


def register(app: Any) -> bool:
    """Register the hooks with the Lambda runtime's ``snapshot_restore_py``; False where there is none."""
    try:
        from snapshot_restore_py import register_after_restore, register_before_snapshot
    except ImportError:
        return False
    register_before_snapshot(before_snapshot, app)
    register_after_restore(after_restore, app)
    return True
