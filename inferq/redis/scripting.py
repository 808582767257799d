"""Loads the Lua scripts of ``inferq/queue/scripts/`` once and calls them by SHA.

Each script's header declares its keys (``KEYS[i]``, ``KEYS[i..n]`` for a variable tail, ``(optional)`` for a
key that may be left out); every call is checked against it, so a caller can never pass the wrong keys.
``--- @include "name"`` pulls in ``scripts/includes/name.lua`` (one ``local function`` per file, after BullMQ).
Every script starts with a generated prelude that defines the names it shares with Python (the group name, the
failure codes, the terminal statuses) from the Python definitions, so none is typed twice.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from pathlib import Path
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.exceptions import AskError, MovedError, NoScriptError, TryAgainError

from inferq.queue.fairshare import FAIR_BUFFER
from inferq.queue.holds import BUCKET_MS, RECORD_OVERHEAD_BYTES
from inferq.queue.jobs import DEFAULT_EXPECTED_TOKENS, TERMINAL
from inferq.queue.keys import GROUP, LANE_KEYS, USAGE_OTHER, USAGE_ROWS, WEBHOOK_GROUP
from inferq.redis.connection import pipelined

SCRIPTS_DIR = Path(__file__).parent.parent / "queue" / "scripts"
_INCLUDE = re.compile(r'^--- @include "([A-Za-z]+)"\s*$', re.MULTILINE)
_KEY = re.compile(r"^\s*KEYS\[(\d+)(?:\.\.(n|\d+))?\][^\n]*?(\(optional\))?\s*$", re.MULTILINE)
"""A key's line in a script's header: ``KEYS[i]``, ``KEYS[i..j]`` (a fixed run), ``KEYS[i..n]`` (any number from i
up), with ``(optional)`` at the end of the line for a key that may be left out."""

NAMES = ("enqueue", "start", "finish", "retry", "release", "renew", "cancel", "promote", "redrive", "expire", "observe",
         "requeue", "skipevents", "webhooksecret", "ratelimit", "takewait", "givewait", "admit", "appendoutput",
         "closeoutput", "watchoutput", "fenceoutput")


class Code(IntEnum):
    """The small negative codes scripts return on failure."""

    NOT_FOUND = -1
    QUEUE_FULL = -3
    TERMINAL = -4
    STALE = -5
    NOT_DEAD_LETTERED = -6
    ENDED = -7
    STALE_OWNER = -8  # finish/retry/release by a caller that no longer holds the delivery: counted, nothing changed
    TENANT_FULL = -9  # enqueue past INFERQ_TENANT_MAX_DEPTH
    MISPLACED = -10  # appendoutput: the delta does not start where the kept output ends
    OUTPUT_FULL = -11  # appendoutput: the output stream holds INFERQ_OUTPUT_MAX_BYTES
    RETAINED_FULL = -12  # enqueue past INFERQ_TENANT_MAX_RETAINED_BYTES
    COOLING_OFF = -13  # enqueue while the tenant's jobs killed the engine too often (INFERQ_ENGINE_STRIKES)
    OPERATOR_ONLY = -14  # redrive of an engine_died dead letter by a tenant that is not an operator
    FENCED = -15  # appendoutput, fenced: the stream's last entry is not the writer's; write it owner-checked


def reply_code(reply: Any) -> int:
    """The code a script answered: a plain number (the hot transitions' success, the cheapest reply for the server
    to convert) or the first element of a table (``{code, ...}``). Records written before those transitions
    answered a number keep ``{0}`` as the answer a resent copy replays: both read the same."""
    return reply if isinstance(reply, int) else int(reply[0])


class ReplicationLag(redis_errors.ConnectionError):
    """Fewer replicas than ``INFERQ_REDIS_WAIT_REPLICAS`` acknowledged a write within the wait. The write is on the
    primary but a failover now could lose it, so callers treat it like an unreachable Redis (503 with
    ``Retry-After``, or try again): every script is safe to resend, and a resent copy waits for the first copy's
    write as well (see ``includes/replay.lua``)."""

    def __init__(self, acknowledged: int, wanted: int) -> None:
        super().__init__(f"only {acknowledged} of {wanted} replicas acknowledged the write in time")
        self.acknowledged = acknowledged
        self.wanted = wanted


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str
    min_keys: int
    max_keys: int | None  # None: any number from min_keys up

    def check_keys(self, keys: list[str]) -> None:
        n = len(keys)
        if n < self.min_keys or (self.max_keys is not None and n > self.max_keys):
            bound = "or more" if self.max_keys is None else f"to {self.max_keys}"
            raise TypeError(f"script {self.name} takes {self.min_keys} {bound} keys, got {n}")


def _expand(source: str, seen: frozenset[str] = frozenset()) -> str:
    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return ""
        return _expand((SCRIPTS_DIR / "includes" / f"{name}.lua").read_text(), seen | {name})

    return _INCLUDE.sub(include, source)


_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)


@cache
def prelude(source: str | None = None) -> str:
    """The Lua locals every script starts with: ``GROUP``, ``CODE_<NAME>`` per :class:`Code`, ``TERMINAL``,
    ``WEBHOOK_GROUP``, ``LANE_KEYS`` (the lanes in the order a script that may touch any lane takes their streams),
    ``USAGE_ROWS`` with ``USAGE_OTHER`` (:data:`inferq.queue.keys.USAGE_ROWS`), ``HOLD_BUCKET_MS`` with
    ``HOLD_RECORD_BYTES`` (:mod:`inferq.queue.holds`), ``DEFAULT_WORK`` (the work of a job whose record has none:
    :data:`~inferq.queue.jobs.DEFAULT_EXPECTED_TOKENS`) and ``FAIR_BUFFER``
    (:data:`~inferq.queue.fairshare.FAIR_BUFFER`). The two tables are built on every run of a script (garbage for
    the server to collect afterwards), so with ``source`` (a script's expanded source) each of the last eight is
    defined only when its code, comments left out, uses it."""
    used = _COMMENT.sub("", source) if source is not None else None
    codes = "\n".join(f"local CODE_{code.name} = {code.value}" for code in Code)
    out = f"local GROUP = '{GROUP}'\n{codes}\n"
    if used is None or re.search(r"\bTERMINAL\b", used):
        terminal = ", ".join(f"{status.value} = true" for status in sorted(TERMINAL))
        out += f"local TERMINAL = {{{terminal}}}\n"
    if used is None or re.search(r"\bWEBHOOK_GROUP\b", used):
        out += f"local WEBHOOK_GROUP = '{WEBHOOK_GROUP}'\n"
    if used is None or re.search(r"\bLANE_KEYS\b", used):
        lanes = ", ".join(f"'{lane}'" for lane in LANE_KEYS)
        out += f"local LANE_KEYS = {{{lanes}}}\n"
    if used is None or re.search(r"\bHOLD_BUCKET_MS\b", used):
        out += f"local HOLD_BUCKET_MS, HOLD_RECORD_BYTES = {BUCKET_MS}, {RECORD_OVERHEAD_BYTES}\n"
    if used is None or re.search(r"\bUSAGE_ROWS\b", used):
        out += f"local USAGE_ROWS, USAGE_OTHER = {USAGE_ROWS}, '{USAGE_OTHER}'\n"
    if used is None or re.search(r"\bDEFAULT_WORK\b", used):
        out += f"local DEFAULT_WORK = {DEFAULT_EXPECTED_TOKENS}\n"
    if used is None or re.search(r"\bFAIR_BUFFER\b", used):
        out += f"local FAIR_BUFFER = {FAIR_BUFFER}\n"
    return out


@cache
def load(name: str) -> Script:
    raw = (SCRIPTS_DIR / f"{name}.lua").read_text()
    header = raw.split("]]", 1)[0]
    required = optional = 0
    variadic = False
    for index, last, opt in _KEY.findall(header):
        if last == "n":
            variadic = True
        elif opt:
            optional += 1
        else:
            required = max(required, int(last or index))
    if not required:
        raise ValueError(f"script {name} declares no KEYS in its header")
    # after a shebang line (``#!lua flags=no-writes``), which must stay the first line
    shebang, newline, rest = raw.partition("\n") if raw.startswith("#!") else ("", "", raw)
    body = _expand(rest)
    source = shebang + newline + prelude(body) + body
    sha = hashlib.sha1(source.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA-1
    return Script(name, source, sha, required, None if variadic else required + optional)


def all_scripts() -> list[Script]:
    return [load(name) for name in NAMES]


class Scripts:
    """Calls scripts on one client (standalone or cluster) by SHA, loading them again after a server restart."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def __call__(self, name: str, keys: list[str], args: list[Any]) -> Any:
        script = load(name)
        script.check_keys(keys)
        try:
            return await self.client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.client.script_load(script.source)
            return await self.client.evalsha(script.sha, len(keys), *keys, *args)

    async def replicated(
        self, calls: list[tuple[str, list[str], list[Any]]], replicas: int, timeout_ms: int
    ) -> list[Any]:
        """Run script calls, then ``WAIT replicas timeout_ms`` on the same connection (WAIT counts the replicas
        that have the writes of its own connection), and raise :class:`ReplicationLag` when fewer acknowledged.
        Standalone: one non-transactional pipeline (WAIT inside MULTI would not block). Cluster: every key of a
        queue is in one slot, so the calls and the WAIT go as one pipeline on one connection of the slot's
        primary; a redirection (the slot moved) is followed by running the calls normally, which refreshes the
        slot map, and the whole is tried once more -- safe, because every script is safe to resend."""
        for attempt in range(3):
            results, acknowledged = await self._with_wait(calls, replicas, timeout_ms)
            redirected = False
            for i, result in enumerate(results):
                if isinstance(result, NoScriptError):
                    await self.client.script_load(load(calls[i][0]).source)
                    redirected = True
                elif isinstance(result, (MovedError, AskError, TryAgainError)) and attempt < 2:
                    await self.many(calls)
                    redirected = True
                elif isinstance(result, Exception):
                    raise result
            if redirected:
                continue
            if isinstance(acknowledged, Exception):
                raise acknowledged
            if int(acknowledged) < replicas:
                raise ReplicationLag(int(acknowledged), replicas)
            return results
        raise redis_errors.ConnectionError("the queue's slot kept moving while waiting for replicas")

    async def _with_wait(
        self, calls: list[tuple[str, list[str], list[Any]]], replicas: int, timeout_ms: int
    ) -> tuple[list[Any], Any]:
        commands: list[tuple[Any, ...]] = []
        for name, keys, args in calls:
            script = load(name)
            script.check_keys(keys)
            commands.append(("EVALSHA", script.sha, len(keys), *keys, *args))
        commands.append(("WAIT", replicas, timeout_ms))
        if isinstance(self.client, RedisCluster):
            await self.client.initialize()
            node = self.client.get_node_from_key(calls[0][1][0])
            if node is None:
                raise redis_errors.ClusterDownError("no primary serves the queue's slot")
            stack = [PipelineCommand(i, *command) for i, command in enumerate(commands)]
            await node.execute_pipeline(stack)
            results = [command.result for command in stack]
        else:
            results = await pipelined(self.client, commands)
        return results[:-1], results[-1]

    async def many_then(
        self, calls: list[tuple[str, list[str], list[Any]]], reads: list[Sequence[tuple[Any, ...]]]
    ) -> list[tuple[Any, list[Any]]]:
        """Run script calls in one round trip (a non-transactional pipeline; each stays atomic alone), each followed
        in the same pipeline by reads of its own (``reads[i]`` right after ``calls[i]``, on the same connection;
        empty for none), and answer ``(reply, read replies)`` pairs: for a state the script leaves that the caller
        needs whole (start's job records), without copying it into Lua and back out. Other clients' commands may
        run between a script and its reads. After a ``NOSCRIPT`` the call and its reads are run again one by one."""
        if not calls:
            return []
        commands: list[tuple[Any, ...]] = []
        for (name, keys, args), after in zip(calls, reads, strict=True):
            script = load(name)
            script.check_keys(keys)
            commands.append(("EVALSHA", script.sha, len(keys), *keys, *args))
            commands.extend(after)
        results = iter(await pipelined(self.client, commands))
        out: list[tuple[Any, list[Any]]] = []
        for call, after in zip(calls, reads, strict=True):
            reply = next(results)
            read_replies = [next(results) for _ in after]
            if isinstance(reply, NoScriptError):
                reply = await self(*call)
                read_replies = [await self.client.execute_command(*read) for read in after]
            elif isinstance(reply, Exception):
                raise reply
            for read_reply in read_replies:
                if isinstance(read_reply, Exception):
                    raise read_reply
            out.append((reply, read_replies))
        return out

    async def then_command(self, call: tuple[str, list[str], list[Any]], command: tuple[Any, ...]) -> tuple[Any, Any]:
        """Run a script call and then a command (one that changes what it reads, such as ``XREADGROUP``) in one round
        trip, and answer both replies. Unlike :meth:`many_then`, the command is never run twice: after a
        ``NOSCRIPT`` the script is loaded and run alone, after the command, whose first answer stands. The
        command's error is raised."""
        name, keys, args = call
        script = load(name)
        script.check_keys(keys)
        reply, answer = await pipelined(self.client, [("EVALSHA", script.sha, len(keys), *keys, *args), command])
        if isinstance(reply, NoScriptError):
            reply = await self(*call)
        elif isinstance(reply, Exception):
            raise reply
        if isinstance(answer, Exception):
            raise answer
        return reply, answer

    async def many(self, calls: list[tuple[str, list[str], list[Any]]]) -> list[Any]:
        """Run many script calls in one round trip (a non-transactional pipeline); each stays atomic alone."""
        if len(calls) == 1:
            return [await self(*calls[0])]
        return [reply for reply, _ in await self.many_then(calls, [()] * len(calls))]
