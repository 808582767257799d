"""What the fault suite shares: an endpoint whose primary changes (a managed Redis's one DNS name, modelled by a
loopback TCP proxy), and the check every fault test ends with (each accepted job ended exactly once)."""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import socket
import threading
import time
import uuid
from collections import Counter, deque
from typing import Any

import hiredis

from emulator.valkey import ValkeyProcess
from inferq.queue.jobs import Job, JobRequest, JobStatus, Priority
from inferq.queue.protocol import Queue
from inferq.redis.faults import Backoff, drop_stale_connections, is_recoverable
from tests.integration.worker.support import TENANT, mock_calls, terminal, terminal_events
from tests.support.waiting import eventually_async


class Endpoint:
    """A TCP proxy on loopback standing for the endpoint name of a managed Redis: new connections go to whichever
    server is the primary now (:meth:`switch`); connections already open stay with the server they were opened to,
    as a client that resolved the name before a failover keeps talking to the old primary. :meth:`blip` delays the
    replies on the connections open at that moment (a network blip): the server has run the command, the client
    times out and resends it on a new connection, which answers at once.

    It also counts the resends it carries (:attr:`resent`): it reads the requests and the replies of each
    connection (RESP, with hiredis's parser), keeps the requests not answered yet, and when a connection closes
    with requests unanswered, a later request with the same bytes on another connection is a resend of a command
    the server may already have run. Scripts carry a token made once per call (``includes/replay.lua``), so a
    resent ``EVALSHA`` is the same call again, never a new one with equal arguments. The connection's own setup
    (``HELLO``, ``AUTH``, ``CLIENT``, ``SELECT``, ``PING``) is not counted."""

    def __init__(self, upstream: ValkeyProcess) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._servers: set[socket.socket] = set()
        self._held_until: dict[socket.socket, float] = {}
        self._held: list[tuple[float, socket.socket, bytes]] = []
        self._readers: dict[socket.socket, hiredis.Reader] = {}
        self._outstanding: dict[socket.socket, deque[tuple[bytes, ...]]] = {}  # by client socket
        self._unanswered: Counter[tuple[bytes, ...]] = Counter()
        self.resent: list[tuple[bytes, ...]] = []
        """Every resend seen, in order: the command's arguments (``resent_names`` has the command names)."""
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="endpoint", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def resent_names(self) -> Counter[str]:
        """How many resends of each command (``EVALSHA``, ``XREADGROUP``, ...) this endpoint has carried."""
        return Counter(command[0].decode().upper() for command in list(self.resent))

    def switch(self, upstream: ValkeyProcess) -> None:
        self.upstream = upstream

    def blip(self, seconds: float) -> None:
        """Hold every reply of the connections open now for ``seconds`` from now."""
        until = time.monotonic() + seconds
        for server in list(self._servers):
            self._held_until[server] = until

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        for sock in [self._listener, *self._peers]:
            with contextlib.suppress(OSError):
                sock.close()
        self._selector.close()

    def _serve(self) -> None:
        while not self._closed.is_set():
            now = time.monotonic()
            due = [h for h in self._held if h[0] <= now]
            if due:
                self._held = [h for h in self._held if h[0] > now]
                for _, server, data in due:
                    self._forward(server, data)
            for key, _ in self._selector.select(timeout=0.01 if self._held else 0.05):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if sock is self._listener:
                    self._accept()
                else:
                    self._pump(sock)

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError):
            client, _ = self._listener.accept()
            try:
                server = socket.create_connection((self.upstream.host, self.upstream.port), timeout=2)
            except OSError:
                client.close()
                return
            for sock in (client, server):
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._selector.register(sock, selectors.EVENT_READ, None)
            self._peers[client], self._peers[server] = server, client
            self._servers.add(server)
            self._readers[client], self._readers[server] = _reader(), _reader()
            self._outstanding[client] = deque()

    def _pump(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(262144)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            until = self._held_until.get(sock, 0.0)
            if until > time.monotonic() or any(held is sock for _, held, _ in self._held):
                self._held.append((until, sock, data))  # in order, behind what is held already
                return
            self._forward(sock, data)
            return
        if any(held is sock for _, held, _ in self._held):
            return  # the server closed: deliver what is held first (the next select sees the close again)
        self._drop(sock)

    def _forward(self, sock: socket.socket, data: bytes) -> None:
        peer = self._peers.get(sock)
        if peer is None:
            return
        from_server = sock in self._servers
        if not from_server:
            self._requests_seen(sock, data)
        try:
            peer.setblocking(True)  # a short blocking write: replies here are small, and order must hold
            peer.sendall(data)
            peer.setblocking(False)
        except OSError:
            self._drop(sock)
            return
        if from_server:
            self._replies_delivered(peer, data)

    def _requests_seen(self, client: socket.socket, data: bytes) -> None:
        reader = self._readers[client]
        reader.feed(data)
        while (request := reader.gets()) is not _INCOMPLETE:
            command = tuple(request)
            if command[0].upper() in _SETUP:
                continue
            if self._unanswered[command] > 0:
                self._unanswered[command] -= 1
                self.resent.append(command)
            self._outstanding[client].append(command)

    def _replies_delivered(self, client: socket.socket, data: bytes) -> None:
        reader = self._readers[self._peers[client]]
        reader.feed(data)
        outstanding = self._outstanding[client]
        while reader.gets() is not _INCOMPLETE:
            if outstanding:  # a reply to the connection's setup has no entry
                outstanding.popleft()

    def _drop(self, sock: socket.socket) -> None:
        peer = self._peers.get(sock)
        for end in (sock, peer):
            if end is not None and end in self._outstanding:  # the client's end: what it never got an answer to
                self._unanswered.update(self._outstanding.pop(end))
            if end is not None and end in self._peers:
                self._readers.pop(end, None)
                del self._peers[end]
                self._servers.discard(end)
                self._held_until.pop(end, None)
                self._selector.unregister(end)
                end.close()


_INCOMPLETE = object()
_SETUP = {b"HELLO", b"AUTH", b"CLIENT", b"SELECT", b"PING"}


def _reader() -> hiredis.Reader:
    """A RESP parser for one direction of one connection: requests (arrays of bulk strings) or replies."""
    return hiredis.Reader(notEnoughData=_INCOMPLETE)


async def assert_each_ended_once(
    queue: Queue, jobs: list[Job], *, timeout: float = 45.0, calls_once: bool = True
) -> None:
    """Every accepted job succeeded, with one terminal event (and, where no worker died, one model call); nothing
    is left unfinished and the stream is empty."""
    for job in jobs:
        done = await terminal(queue, job.id, timeout=timeout)
        assert done.status is JobStatus.SUCCEEDED, (job.id, done.status, done.error)
    problems: dict[str, Any] = {}
    for job in jobs:
        events = len(await terminal_events(queue, job.id))
        calls = await mock_calls(queue, job.id)
        if events != 1 or (calls_once and calls != 1):
            problems[job.id] = {"terminal_events": events, "mock_calls": calls}
    stats = await queue.stats()
    assert not problems, f"{len(problems)} of {len(jobs)} jobs not ended exactly once: {problems}; stats {stats}"

    async def all_ended() -> bool:
        # a job whose submit failed was maybe created anyway, and an entry whose read reply was lost waits for
        # its claim-idle time before it is reclaimed: wait for those too
        lengths = [await queue.redis.xlen(stream) for stream in queue.keys.lane_streams]
        return (await queue.stats())["unfinished"] == 0 and lengths == [0, 0, 0]

    try:
        await eventually_async(all_ended, what="every job to end and the streams to empty", timeout=timeout,
                               interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {await queue.stats()} {await unfinished_jobs(queue)}") from None


async def submit_until_accepted(
    queue: Queue, body: dict[str, Any], *, timeout: float = 30.0, priority: Priority = Priority.NORMAL
) -> Job:
    """Submit as a client of the API does when it gets a 503: again, with the same idempotency key, until
    accepted. The job is accepted once, whatever happened to the tries before."""
    request = JobRequest(body=body, idempotency_key=uuid.uuid4().hex, priority=priority)
    backoff = Backoff(base_s=0.1, cap_s=1.0)
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            job, _ = await queue.enqueue(TENANT, request)
            return job
        except Exception as exc:
            if not is_recoverable(exc) or asyncio.get_running_loop().time() > deadline:
                raise
            await drop_stale_connections(queue.redis, exc)
            await asyncio.sleep(backoff.next())


async def unfinished_jobs(queue: Queue) -> dict[str, Any]:
    """Every job of the queue that is not terminal, with its record, and what the stream and group still hold."""
    found: dict[str, Any] = {}
    async for key in queue.redis.scan_iter(match=queue.keys.job("*"), count=1000):
        record = await queue.redis.hgetall(key)
        if record.get("status") not in ("succeeded", "failed", "cancelled", "expired"):
            found[key] = record
    for stream in queue.keys.lane_streams:
        found[stream] = await queue.redis.xrange(stream)
    found["delayed"] = await queue.redis.zrange(queue.keys.delayed, 0, -1, withscores=True)
    return found
