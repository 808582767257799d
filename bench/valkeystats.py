"""Valkey's own account of a scenario: ``INFO commandstats`` deltas divided by the jobs done.

Valkey counts every command it executes, including the ones a Lua script calls: an ``EVALSHA``'s ``usec`` already
includes the time of its inner ``HSET``/``XADD``/..., and those inner commands are counted again under their own
names. So the total command time per job counts each script once, with its inner commands, and leaves out the
commands the scripts themselves call (their names are read from ``inferq/queue/scripts/**.lua``, so the split follows
the scripts as they change). A command that is called both directly and from a script (``HGETALL``, say) is then
left out of the total altogether: the total is a lower bound, and the table says which commands it left out.

``INFO commandstats`` has no per-script figures (every script is ``evalsha``). :func:`script_shares` splits the
``EVALSHA`` time by script from a short *sample* taken after the measured runs with the slow log recording every
command (``slowlog-log-slower-than 0``): the slow log names each call's SHA and its duration (inner commands
included). The sample's shares are applied to the measured ``EVALSHA`` time; the slow log is not on while the
runs are measured.

The pure parts (parsing, deltas, attribution, formatting) are tested in ``tests/unit/test_bench_valkeystats.py``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPTS_DIR = Path(__file__).resolve().parent.parent / "inferq" / "queue" / "scripts"
SCRIPT_COMMANDS = frozenset({"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"})
# the bench's own bookkeeping commands, left out of every figure
BENCH_COMMANDS = frozenset({"info", "config|resetstat", "config|set", "config|get", "slowlog|get", "slowlog|reset",
                            "slowlog|len", "client|setname", "hello", "ping"})
_CALL = re.compile(r"""(?:\brcall|\bredis\.p?call|\bserver\.p?call)\(\s*['"]([A-Za-z]+)['"]""")


@dataclass(frozen=True)
class Stat:
    calls: int
    usec: int


def parse(info: Mapping[str, Any] | str) -> dict[str, Stat]:
    """``INFO commandstats`` as redis-py parses it (``{"cmdstat_xadd": {"calls": .., "usec": ..}}``) or as raw
    text (``cmdstat_xadd:calls=3,usec=12,...`` lines) -> ``{"xadd": Stat}`` (subcommands as ``config|set``)."""
    out: dict[str, Stat] = {}
    if isinstance(info, str):
        for line in info.splitlines():
            name, sep, rest = line.strip().partition(":")
            if not sep or not name.startswith("cmdstat_"):
                continue
            fields = dict(part.split("=", 1) for part in rest.split(",") if "=" in part)
            out[name[len("cmdstat_"):].lower()] = Stat(int(fields.get("calls", 0)), int(fields.get("usec", 0)))
        return out
    for name, fields in info.items():
        if name.startswith("cmdstat_") and isinstance(fields, Mapping):
            out[name[len("cmdstat_"):].lower()] = Stat(int(fields.get("calls", 0)), int(fields.get("usec", 0)))
    return out


def delta(before: Mapping[str, Stat], after: Mapping[str, Stat]) -> dict[str, Stat]:
    """What happened between two snapshots; commands with no new calls and the bench's own are dropped. A
    counter that went down (``CONFIG RESETSTAT``, a restarted server) counts from zero."""
    out: dict[str, Stat] = {}
    for name, now in after.items():
        if name in BENCH_COMMANDS:
            continue
        then = before.get(name, Stat(0, 0))
        if now.calls < then.calls:
            then = Stat(0, 0)
        if now.calls - then.calls > 0:
            out[name] = Stat(now.calls - then.calls, now.usec - then.usec)
    return out


def script_inner_commands(scripts_dir: Path = SCRIPTS_DIR) -> frozenset[str]:
    """The commands the Lua scripts call (``redis.call``/``pcall``, ``server.call``, the ``rcall`` alias)."""
    names: set[str] = set()
    with contextlib.suppress(OSError):
        for path in scripts_dir.rglob("*.lua"):
            names.update(match.lower() for match in _CALL.findall(path.read_text()))
    return frozenset(names)


def per_job(stats: Mapping[str, Stat], jobs: int, inner: Iterable[str] = (), top: int = 8,
            script_split: Mapping[str, float] | None = None,
            direct: Mapping[str, float] | None = None) -> dict[str, Any]:
    """µs and calls per job by command, biggest first, and the total command time per job (scripts counted once,
    with their inner commands; see the module's docstring). ``direct``: the share of each command's calls that
    clients sent themselves rather than scripts (from :func:`direct_shares`); a command it does not name counts
    whole unless the scripts call it (``inner``). ``script_split``: each script's share of the ``EVALSHA`` time
    (from :func:`script_shares`), turned into µs per job."""
    if jobs <= 0:
        return {"jobs": jobs, "total_usec_per_job": None, "commands": []}
    inner_set, direct = set(inner), dict(direct or {})
    scripted = any(name in SCRIPT_COMMANDS for name in stats)

    def counted_share(name: str) -> float:
        if not scripted or name in SCRIPT_COMMANDS:
            return 1.0
        if name in direct:
            return min(max(direct[name], 0.0), 1.0)
        return 0.0 if name in inner_set else 1.0

    shares = {name: counted_share(name) for name in stats}
    total = sum(s.usec * shares[name] for name, s in stats.items())
    calls = sum(s.calls * shares[name] for name, s in stats.items())
    rows: list[dict[str, Any]] = [
        {"command": name, "calls_per_job": round(s.calls / jobs, 3), "usec_per_job": round(s.usec / jobs, 2),
         "usec_per_call": round(s.usec / s.calls, 2) if s.calls else None,
         "in_total": shares[name] > 0, "counted_usec_per_job": round(s.usec * shares[name] / jobs, 2),
         "counted_calls_per_job": round(s.calls * shares[name] / jobs, 3)}
        for name, s in sorted(stats.items(), key=lambda kv: -kv[1].usec)]
    out: dict[str, Any] = {
        "jobs": jobs, "total_usec_per_job": round(total / jobs, 2), "total_calls_per_job": round(calls / jobs, 2),
        "top": sorted((row for row in rows if row["in_total"]), key=lambda row: -row["counted_usec_per_job"])[:top],
        "commands": rows,
        "left_out_as_script_inner": sorted(name for name in stats if shares[name] == 0.0),
        "partly_counted": {name: round(share, 3) for name, share in shares.items() if 0.0 < share < 1.0},
    }
    script_usec = sum(s.usec for name, s in stats.items() if name in SCRIPT_COMMANDS)
    if script_split and script_usec:
        out["scripts_usec_per_job"] = {name: round(share * script_usec / jobs, 2)
                                       for name, share in sorted(script_split.items(), key=lambda kv: -kv[1])}
        mock = out["scripts_usec_per_job"].get(MOCK_COUNTER, 0.0)
        out["mock_counter_usec_per_job"] = mock
        out["inferq_usec_per_job"] = round(total / jobs - mock, 2)
    return out


def direct_shares(entries: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """From ``MONITOR`` lines (redis-py's dicts: ``client_type`` is ``lua`` for a script's own commands): each
    command's share of calls sent by clients directly, for the commands that scripts also call."""
    direct: dict[str, int] = {}
    total: dict[str, int] = {}
    for entry in entries:
        words = str(entry.get("command", "")).split(maxsplit=1)
        if not words:
            continue
        name = words[0].lower()
        total[name] = total.get(name, 0) + 1
        if entry.get("client_type") != "lua":
            direct[name] = direct.get(name, 0) + 1
    return {name: direct.get(name, 0) / n for name, n in total.items() if name not in SCRIPT_COMMANDS}


def script_shares(entries: Iterable[Mapping[str, Any]], names_by_sha: Mapping[str, str]) -> dict[str, float]:
    """Each script's share of the script time in slow-log entries (``SLOWLOG GET`` as redis-py returns it:
    ``command`` bytes or str, ``duration`` µs). ``EVALSHA <sha>`` is named by ``names_by_sha`` (else its SHA's
    first 8 characters), ``FCALL <function>`` by its function."""
    usec: dict[str, int] = {}
    for entry in entries:
        command = entry.get("command", b"")
        words = (command.decode(errors="replace") if isinstance(command, bytes) else str(command)).split()
        if len(words) < 2 or words[0].lower() not in SCRIPT_COMMANDS:
            continue
        target = words[1]
        name = names_by_sha.get(target.lower(), target[:8]) if words[0].lower().startswith("evalsha") else target
        usec[name] = usec.get(name, 0) + int(entry.get("duration", 0))
    total = sum(usec.values())
    if not total:
        return {}
    return {name: value / total for name, value in sorted(usec.items(), key=lambda kv: -kv[1])}


def script_calls(entries: Iterable[Mapping[str, Any]], names_by_sha: Mapping[str, str]) -> dict[str, int]:
    """Calls per script in slow-log entries (same naming as :func:`script_shares`)."""
    calls: dict[str, int] = {}
    for entry in entries:
        command = entry.get("command", b"")
        words = (command.decode(errors="replace") if isinstance(command, bytes) else str(command)).split()
        if len(words) >= 2 and words[0].lower() in SCRIPT_COMMANDS:
            target = words[1]
            name = names_by_sha.get(target.lower(), target[:8]) if words[0].lower().startswith("evalsha") else target
            calls[name] = calls.get(name, 0) + 1
    return calls


MOCK_COUNTER = "mock_count"
"""The mock backend's call counter (``gpu_worker/backends/mock_count.lua``, test instrumentation of the mock
contract): it runs once per model call in the mock, never with a real model server, so the figures name it and
give inferq's own µs per job without it."""


def names_by_sha() -> dict[str, str]:
    """SHA -> script name for inferq's scripts as this checkout loads them, and the mock backend's counter (empty
    when they cannot be loaded)."""
    with contextlib.suppress(Exception):
        import hashlib

        from gpu_worker.backends.mock import COUNT_SCRIPT
        from inferq.redis import scripting

        names = {script.sha.lower(): script.name for script in scripting.all_scripts()}
        names[hashlib.sha1(COUNT_SCRIPT.encode()).hexdigest()] = MOCK_COUNTER  # Redis names scripts by SHA-1
        return names
    return {}


def fmt_line(section: Mapping[str, Any] | None, top: int = 5) -> str:
    """One line for the table: ``Valkey 207 µs/job: evalsha 137 (3), xreadgroup 11 (1), ...``: µs per job and
    (calls per job) of the commands the total counts, then the scripts' split of the EVALSHA time."""
    if not section or section.get("total_usec_per_job") is None:
        return ""
    parts = [f"{row['command']} {row['counted_usec_per_job']:.0f} ({row['counted_calls_per_job']:g})"
             for row in section.get("top", [])[:top]]
    text = f"Valkey {section['total_usec_per_job']:.0f} µs/job"
    if section.get("mock_counter_usec_per_job"):
        text += (f" (inferq {section['inferq_usec_per_job']:.0f} + the mock backend's call counter "
                 f"{section['mock_counter_usec_per_job']:.0f})")
    text += ": " + ", ".join(parts)
    scripts = section.get("scripts_usec_per_job")
    if scripts:
        text += "; scripts " + ", ".join(f"{name} {usec:.0f}" for name, usec in list(scripts.items())[:top])
    return text


class Sampler:
    """``INFO commandstats`` snapshots on a Valkey (sync redis-py; the bench's own commands are left out)."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=10)

    def snapshot(self) -> dict[str, Stat]:
        return parse(self.client.info("commandstats"))

    def slowlog_on(self, max_len: int = 100_000) -> dict[str, Any]:
        saved = self.client.config_get("slowlog-*")
        self.client.config_set("slowlog-max-len", max_len)
        self.client.config_set("slowlog-log-slower-than", 0)
        self.client.slowlog_reset()
        return {str(name): value for name, value in saved.items()}

    def slowlog_off(self, saved: Mapping[str, Any]) -> list[dict[str, Any]]:
        entries = list(self.client.slowlog_get(-1))
        for name, value in saved.items():
            with contextlib.suppress(Exception):
                self.client.config_set(name, value)
        self.client.slowlog_reset()
        return entries

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
