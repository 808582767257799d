"""Clients a Valkey server holds blocked in a command (``CLIENT LIST``: its ``cmd`` and the ``b`` flag): the event a
test waits for before it makes the change that a blocked read must wake for, instead of sleeping and hoping the
read got there first."""

from __future__ import annotations

from typing import Any


async def blocked_in(redis: Any, command: str) -> int:
    """How many clients of the server ``redis`` talks to are blocked in ``command`` (``xread``, ``blmove``, ...)."""
    return sum(1 for client in await redis.client_list() if client["cmd"] == command and "b" in client["flags"])
