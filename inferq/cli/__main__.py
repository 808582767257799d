"""``python -m inferq.cli``: the ``inferq`` command."""

from inferq.cli.main import main

raise SystemExit(main())
