"""The ``inferq`` command: ``up`` (the emulator), and client helpers added by the emulator."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print("usage: inferq {up,submit,status,bench} [options]\n\n  up      run the whole stack on this machine")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "up":
        from emulator.up import main as up

        return up(rest)
    print(f"inferq: unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
