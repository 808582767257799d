"""The results feed's sealed cursor (inferq/queue/feed.py): it round-trips its positions for its tenant and key only,
looks different every time, has a length set by the queue names alone, and any change to it is refused."""

from __future__ import annotations

import base64
import random
import re

from inferq.queue import feed

KEY = bytes(range(32))


def positions(rng: random.Random, names: list[str]) -> dict[str, str | None]:
    return {name: None if rng.random() < 0.2 else f"{rng.randrange(2**44)}-{rng.randrange(2**20)}" for name in names}


def test_a_cursor_round_trips_for_its_tenant_and_key_only() -> None:
    rng = random.Random(7)
    names = ["default", "m-chat", "m-embed"]
    for _ in range(200):
        held = positions(rng, names)
        cursor = feed.seal(KEY, "tenant-a", held)
        assert feed.unseal(KEY, "tenant-a", cursor) == held
        assert feed.unseal(KEY, "tenant-b", cursor) is None
        assert feed.unseal(bytes(32), "tenant-a", cursor) is None
        assert re.match(r"^[0-9]+-[0-9]+$", cursor) is None and "." not in cursor  # no stream position shows


def test_a_cursor_reveals_neither_its_position_nor_whether_it_moved() -> None:
    rng = random.Random(11)
    names = ["default", "m-chat"]
    quiet = {"default": "1764400000123-0", "m-chat": None}
    busy: dict[str, str | None] = {"default": "1764400999999-4095", "m-chat": "1764400999999-12"}
    cursors = [feed.seal(KEY, "t", quiet) for _ in range(50)] + [feed.seal(KEY, "t", busy) for _ in range(50)]
    cursors += [feed.seal(KEY, "t", positions(rng, names)) for _ in range(50)]
    assert len(set(cursors)) == len(cursors)  # a fresh nonce each time
    assert len({len(c) for c in cursors}) == 1  # the length says nothing about the positions
    assert not any("1764400" in c for c in cursors)


def test_any_change_to_a_cursor_is_refused() -> None:
    cursor = feed.seal(KEY, "t", {"default": "1764400000123-7"})
    raw = bytearray(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    for index in range(len(raw)):
        for bit in (0x01, 0x80):
            changed = bytearray(raw)
            changed[index] ^= bit
            token = base64.urlsafe_b64encode(bytes(changed)).decode().rstrip("=")
            assert feed.unseal(KEY, "t", token) is None, f"byte {index} bit {bit:#x}"
    for bad in ("", "x" * 43, "!" * 60, cursor[:-1], cursor + "A", cursor[1:], "1-0", "A" * 8193):
        assert feed.unseal(KEY, "t", bad) is None
