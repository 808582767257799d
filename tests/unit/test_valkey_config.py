"""The server settings inferq runs Valkey with are the same wherever it runs: the emulator's process (``inferq up``,
the tests, the bench), ``emulator/compose.yaml`` and the ElastiCache parameter group."""

from __future__ import annotations

from pathlib import Path

import yaml

from emulator.valkey import STREAM_NODE_MAX_ENTRIES, ValkeyProcess

ROOT = Path(__file__).resolve().parents[2]


def test_the_emulators_valkey_keeps_stream_nodes_small(valkey: ValkeyProcess) -> None:
    import redis

    r = redis.Redis.from_url(valkey.url, decode_responses=True)
    try:
        assert r.config_get("stream-node-max-entries") == {"stream-node-max-entries": str(STREAM_NODE_MAX_ENTRIES)}
    finally:
        r.close()
    assert STREAM_NODE_MAX_ENTRIES < 100  # Valkey's default, whose tombstone walk made XDEL the costliest command


def test_compose_runs_valkey_with_the_same_stream_node_size() -> None:
    compose = yaml.safe_load((ROOT / "emulator" / "compose.yaml").read_text())
    command = [str(word) for word in compose["services"]["valkey"]["command"]]
    at = command.index("--stream-node-max-entries")
    assert command[at + 1] == str(STREAM_NODE_MAX_ENTRIES)
