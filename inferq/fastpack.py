"""Pack Redis commands in C (hiredis) instead of Python, on every connection :func:`inferq.connection.connect` opens.

redis-py's asyncio client builds every command's bytes in Python, while its sync client uses hiredis when it is
installed. The worker sends two scripts of about fifteen arguments per job, so packing was its largest single
cost: hiredis cuts the worker's CPU per job by about a quarter (see bench/worker.py); the gateway's submit (a script
of ~20 arguments) and job reads (an HMGET of 21 fields) pay the same per argument. The bytes are identical;
arguments hiredis does not take (None, bool, ...) fall back to redis-py's packer and its usual error. Standalone
and cluster clients alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.asyncio.connection import Connection

_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:  # hiredis missing or too old: keep redis-py's packer
    _pack = None


class HiredisPacking:
    """Mixin for a redis-py asyncio connection class."""

    def pack_command(self, *args: Any) -> list[bytes]:
        # like redis-py: a first argument with a space ("CLIENT SETNAME") is several words
        first = args[0]
        if (isinstance(first, str) and " " in first) or (isinstance(first, bytes) and b" " in first):
            args = (*first.split(), *args[1:])
        assert _pack is not None
        try:
            return [_pack(args)]
        except TypeError:
            fallback: list[bytes] = super().pack_command(*args)  # type: ignore[misc]
            return fallback


def use_hiredis_packing(client: Any) -> bool:
    """Make the connections ``client`` opens from now on pack with hiredis: a standalone client's pool, or a
    cluster client's nodes (ElastiCache Serverless is always cluster mode), those it knows and those it finds
    later, which it builds from ``nodes_manager.connection_kwargs``. False when it cannot (no hiredis)."""
    if _pack is None:
        return False
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.connection_class = _packing(pool.connection_class)
        return True
    nodes_manager = client.nodes_manager
    kwargs = nodes_manager.connection_kwargs
    kwargs["connection_class"] = _packing(kwargs.get("connection_class") or Connection)
    for node in [*nodes_manager.startup_nodes.values(), *nodes_manager.nodes_cache.values()]:
        node.connection_class = _packing(node.connection_class)
    return True


def _packing(base: type) -> type:
    if issubclass(base, HiredisPacking):
        return base
    return type(f"HiredisPacking{base.__name__}", (HiredisPacking, base), {})
