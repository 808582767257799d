"""The names the Lua scripts share with Python (group, failure codes, terminal statuses) are written once."""

from __future__ import annotations

import re

from inferq.jobs import TERMINAL
from inferq.keys import GROUP
from inferq.scripting import NAMES, SCRIPTS_DIR, Code, load, prelude


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
        assert text in source
        assert not source.startswith("#!") or source.split("\n", 1)[1].startswith(text)  # the shebang stays first
