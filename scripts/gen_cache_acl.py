"""Write inferq/redis/acl.py's access strings into infra/cache.yaml (its ``AccessStrings`` mapping), the one place the
cache's ElastiCache and MemoryDB users take their rules from. Run after changing inferq/redis/acl.py:
``python scripts/gen_cache_acl.py``; tests/infra/test_cache_acl.py fails while the template is out of date."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from inferq.redis import acl

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "infra" / "cache.yaml"
BLOCK = re.compile(r"(?m)^  AccessStrings:\n(?:(?:    .*|ACCESS_STRINGS_END)\n)*")


def rendered() -> str:
    lines = ["  AccessStrings:"]
    for role in acl.ROLES:
        lines += [f"    {role}:", f"      Rules: {json.dumps(acl.access_string(role))}",
                  f"      ServerlessRules: {json.dumps(acl.access_string(role, serverless=True))}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    text = CACHE.read_text()
    new, count = BLOCK.subn(rendered(), text, count=1)
    if count != 1:
        print("infra/cache.yaml has no AccessStrings mapping", file=sys.stderr)
        return 1
    if new != text:
        CACHE.write_text(new)
        print("infra/cache.yaml: access strings updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
