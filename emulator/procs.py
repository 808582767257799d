"""Child processes of ``inferq up``: spawned so they die with the supervisor, their output prefixed by role.

Every child stays in the supervisor's process group (``pgrep -g`` finds them all) and gets ``PR_SET_PDEATHSIG``,
so even a SIGKILLed supervisor leaves nothing behind. Children start with SIGINT blocked: a Ctrl-C in the terminal
reaches the whole foreground group, and the supervisor, not the terminal, decides the stopping order (workers drain
while Valkey still runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

_COLOURS = (36, 33, 32, 35, 34, 96, 93, 92, 95, 94)
_PR_SET_PDEATHSIG = 1


def child_setup(death_signal: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn``: die with the parent (Linux), ignore the terminal's Ctrl-C (the supervisor relays it)."""

    parent = os.getpid()

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, death_signal)
        except OSError:
            pass
        # The parent may have died between fork and prctl; then nobody would ever signal us.
        if os.getppid() != parent:
            os._exit(1)

    return setup


class LogSink:
    """Writes lines as ``role | text``, like docker compose, colouring the prefix on a terminal.

    A thread does the writing, so a reader that stops reading our stdout (a full pipe) can never block the
    supervisor's event loop, and with it the whole stack. Past ``backlog`` waiting lines, children's lines are
    dropped and counted; the supervisor's own lines (``say``: ready, stopping, stopped) are always kept."""

    def __init__(self, stream: TextIO | None = None, width: int = 9, backlog: int = 10_000) -> None:
        self.stream = stream or sys.stdout
        self.width = width
        self.backlog = backlog
        self.colour = self.stream.isatty() and not os.environ.get("NO_COLOR")
        self._colours: dict[str, int] = {}
        self._pending: deque[str] = deque()
        self._dropped = 0
        self._ready = threading.Condition()
        self._writer = threading.Thread(target=self._write_forever, name="log-writer", daemon=True)
        self._writer.start()

    def _prefix(self, role: str) -> str:
        label = f"{role:<{self.width}}|"
        if not self.colour:
            return label
        family = role.split("-")[0]
        code = self._colours.setdefault(family, _COLOURS[len(self._colours) % len(_COLOURS)])
        return f"\x1b[{code}m{label}\x1b[0m"

    def _put(self, text: str, *, keep: bool) -> None:
        with self._ready:
            if not keep and len(self._pending) >= self.backlog:
                self._dropped += 1
                return
            if self._dropped:
                self._pending.append(f"inferq: {self._dropped} log lines dropped (stdout is not being read)")
                self._dropped = 0
            self._pending.append(text)
            self._ready.notify()

    def _write_forever(self) -> None:
        while True:
            with self._ready:
                while not self._pending:
                    self._ready.wait()
                batch = list(self._pending)
                self._pending.clear()
            try:
                self.stream.write("".join(line + "\n" for line in batch))
                self.stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass
            with self._ready:
                self._ready.notify_all()

    def line(self, role: str, text: str) -> None:
        self._put(f"{self._prefix(role)} {text}", keep=False)

    def say(self, text: str) -> None:
        """An unprefixed line from the supervisor itself (``inferq: ready ...``); never dropped."""
        self._put(text, keep=True)

    def flush(self, timeout: float = 2.0) -> None:
        """Wait (bounded: the reader may be gone) until what was logged so far is written."""
        deadline = time.monotonic() + timeout
        with self._ready:
            while self._pending and (left := deadline - time.monotonic()) > 0:
                self._ready.wait(left)


class Child:
    """One supervised process and the task that copies its output into the log."""

    def __init__(
        self,
        role: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        sink: LogSink,
        *,
        death_signal: int = signal.SIGTERM,
    ) -> None:
        self.role = role
        self.argv = list(argv)
        self.env = dict(env)
        self.sink = sink
        self.death_signal = death_signal
        self.process: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        self._pump: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> Child:
        self.process = await asyncio.create_subprocess_exec(
            *self.argv,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=child_setup(self.death_signal),
            limit=1 << 20,
        )
        self.started_at = time.monotonic()
        self._pump = asyncio.create_task(self._copy_output(), name=f"log-{self.role}")
        return self

    async def _copy_output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        stream = self.process.stdout
        while True:
            try:
                raw = await stream.readline()
            except (ValueError, asyncio.LimitOverrunError):
                raw = await stream.read(1 << 16)
            if not raw:
                return
            self.sink.line(self.role, raw.decode(errors="replace").rstrip("\n"))

    async def wait(self) -> int:
        assert self.process is not None
        code = await self.process.wait()
        if self._pump is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._pump), 2.0)
        return code

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    async def stop(self, grace_s: float) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s`` seconds (what ECS does with a container's stop timeout)."""
        if self.process is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.wait(), grace_s)
        except TimeoutError:
            self.sink.line(self.role, f"did not stop within {grace_s:g}s: SIGKILL")
            self.signal(signal.SIGKILL)
            return await self.wait()
