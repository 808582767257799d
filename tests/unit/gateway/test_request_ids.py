"""Request ids the gateway makes (functions.gateway.edge.RequestIds): well-formed, unique, and a forked child's are
not its parent's."""

from __future__ import annotations

import os
import re

from functions.gateway.edge import RequestIds, _request_id

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def test_ids_are_32_hex_characters_and_never_repeat() -> None:
    ids = RequestIds()
    made = [ids.next() for _ in range(10_000)]
    assert all(HEX32.match(i) for i in made)
    assert len(set(made)) == len(made)
    assert RequestIds().next()[:16] != made[0][:16]  # each generator draws its own prefix


def test_a_request_without_a_usable_id_gets_a_new_one_each_time() -> None:
    scope = {"type": "http", "headers": [(b"x-request-id", b"bad id with spaces")], "state": {}}
    first, second = _request_id(scope), _request_id(scope)
    assert HEX32.match(first) and HEX32.match(second) and first != second
    assert _request_id({"type": "http", "headers": [(b"x-request-id", b"req-123")], "state": {}}) == "req-123"


def test_a_forked_child_makes_other_ids_than_its_parent() -> None:
    ids = RequestIds()
    ids.next()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out without running the parent's cleanup
        os.write(write, ids.next().encode())
        os._exit(0)
    os.close(write)
    mine = ids.next()
    theirs = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert HEX32.match(theirs) and theirs[:16] != mine[:16]
