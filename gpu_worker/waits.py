"""Waiting for the first of several things: a slot or a stop, a backoff or a stop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def first(*aws: Awaitable[Any]) -> None:
    """Wait until the first of ``aws`` completes, cancelling the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
