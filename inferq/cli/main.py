"""The ``inferq`` command: the HTTP commands, built on :mod:`inferq.client`, and the commands other code registers
(entry points of the group :data:`COMMANDS`): ``up``, the emulator, is registered by the repository's
``inferq_emulator-0.dist-info`` (found wherever the clone is on the path, as ``make install`` puts it), so this
package never imports the emulator, and an installed wheel alone says that ``up`` needs a clone.

The commands live by concern: :mod:`.jobs` (submit, wait, cancel, redrive, dlq), :mod:`.status`, :mod:`.usage`,
:mod:`.interrupt`, what they share in :mod:`.common`. Imports stay inside the commands: ``inferq up`` must not pay
for httpx or rich, and the clients not for the emulator.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

USAGE = """usage: inferq {up,submit,wait,status,cancel,dlq,redrive,usage,interrupt} [options]

  up       run the whole stack on this machine (gateway, Valkey, scaler, workers)
  submit   submit a job: inferq submit "text" [--wait | --stream], or many: inferq submit --file jobs.jsonl
  wait     wait for jobs to end and print them: inferq wait ID...
  status   live view of the queue and the fleet; with job ids, print those jobs
  cancel   cancel jobs: inferq cancel ID...
  dlq      list your dead-lettered jobs, newest first
  redrive  queue dead-lettered jobs again: inferq redrive ID...
  usage    your metered usage per model and lane: inferq usage --since 7d [--csv]
  interrupt  interrupt a worker of `inferq up` as EC2 Spot does: inferq interrupt [WORKER]

inferq COMMAND --help for a command's options"""

COMMANDS = "inferq.commands"
"""The entry-point group of commands registered from outside this package: ``name = module:function``, the function
taking the command's arguments and returning its exit status."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "up":
        up = registered(command)
        if up is None:
            # the wheel holds the client and the CLI only: the stack's code lives in the repository
            print("inferq up: the local stack runs from a clone of the inferq repository (`make up` there): this "
                  "installation has the client and CLI only", file=sys.stderr)
            return 2
        return up(rest)
    if command == "interrupt":
        from .interrupt import InterruptError, interrupt

        try:
            return interrupt(rest)
        except InterruptError as exc:
            print(f"inferq interrupt: {exc}", file=sys.stderr)
            return 1
    from .common import CliError
    from .jobs import cancel, dlq, redrive, submit, wait
    from .status import status
    from .usage import usage

    commands: dict[str, Callable[[list[str]], int]] = {
        "submit": submit, "wait": wait, "status": status, "cancel": cancel, "dlq": dlq, "redrive": redrive,
        "usage": usage,
    }
    if command not in commands:
        print(f"inferq: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    from inferq.client import GatewayUnreachable, InferqError

    try:
        return commands[command](rest)
    except GatewayUnreachable as exc:
        print(f"inferq {command}: cannot reach the gateway ({exc.message}); is `inferq up` running?",
              file=sys.stderr)
        return 1
    except InferqError as exc:
        print(f"inferq {command}: the gateway answered {exc.status} ({exc.type}: {exc.message})", file=sys.stderr)
        return 1
    except CliError as exc:
        print(f"inferq {command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def registered(name: str) -> Callable[[list[str]], int] | None:
    """The command ``name`` another distribution registers (entry-point group :data:`COMMANDS`), or None."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=COMMANDS, name=name):
        command: Callable[[list[str]], int] = entry.load()
        return command
    return None


if __name__ == "__main__":
    raise SystemExit(main())
