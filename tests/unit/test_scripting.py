"""The names the Lua scripts share with Python (group, failure codes, terminal statuses) are written once."""

from __future__ import annotations

import re

from inferq.queue.jobs import TERMINAL
from inferq.queue.keys import GROUP
from inferq.redis.scripting import NAMES, SCRIPTS_DIR, Code, load, prelude, reply_code


def test_no_script_types_a_shared_name_again() -> None:
    for path in [*SCRIPTS_DIR.glob("*.lua"), *SCRIPTS_DIR.glob("includes/*.lua")]:
        body = path.read_text().split("]]", 1)[-1]  # the header may document the codes by number
        assert f"'{GROUP}'" not in body and f'"{GROUP}"' not in body, path.name
        assert not re.search(r"\{\s*-\d", body), f"{path.name} returns a code by number, not CODE_<NAME>"
        assert "local TERMINAL" not in body, path.name


def test_every_script_starts_with_the_prelude_built_from_the_python_names() -> None:
    text = prelude()
    assert f"local GROUP = '{GROUP}'" in text
    assert all(f"local CODE_{code.name} = {code.value}" in text for code in Code)
    assert all(f"{status.value} = true" in text for status in TERMINAL)
    for name in NAMES:
        source = load(name).source
        own = source.split("\n", 1)[1] if source.startswith("#!") else source  # the shebang stays first
        assert own.startswith(f"local GROUP = '{GROUP}'\n"), name
        assert all(f"local CODE_{code.name} = {code.value}\n" in own for code in Code), name


def test_a_script_builds_the_prelude_tables_it_uses_and_no_other() -> None:
    # the tables are built on every run of a script; a script that never reads one should not pay for it
    for name in NAMES:
        source = load(name).source
        code = re.sub(r"--\[\[.*?\]\]|--[^\n]*", "", source, flags=re.DOTALL)
        for table in ("TERMINAL", "LANE_KEYS"):
            uses = re.search(rf"\b{table}\b(?! =)", code) is not None
            assert (f"local {table} = {{" in source) == uses, (name, table)
    assert "local TERMINAL" not in load("enqueue").source and "local TERMINAL" in load("start").source
    assert "local LANE_KEYS" not in load("finish").source and "local LANE_KEYS" in load("observe").source


def test_a_reply_code_is_read_from_a_plain_number_or_a_tables_first_element() -> None:
    assert reply_code(0) == 0 and reply_code([0]) == 0
    assert reply_code([-4, "succeeded"]) == -4 and reply_code([1, "job_x"]) == 1
