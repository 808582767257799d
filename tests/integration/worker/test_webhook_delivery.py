"""Webhook delivery under load and against hostile receivers: each webhook once with several consumers and a slow
receiver; one deadline per POST (a dripping receiver); the answer read only in part (a huge one); internal
addresses refused after resolving; the connection goes to the address that was checked, TLS to the name; a
receiver's private CA trusted through SSL_CERT_FILE / SSL_CERT_DIR, and proxy variables never used."""

from __future__ import annotations

import asyncio
import datetime
import http.server
import json
import logging
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferq.config.settings import Settings
from inferq.queue.keys import WEBHOOK_GROUP
from inferq.queue.protocol import Queue
from inferq.webhooks import netguard
from inferq.webhooks import sender as webhooks
from inferq.webhooks.guarded_http import GuardedTransport
from inferq.webhooks.sender import LEASE_MS, WebhookSender, deliver_webhooks
from tests.support.tls import private_ca
from tests.support.waiting import eventually_async

from .support import chat, submit


class HookServer:
    """A loopback HTTP receiver that records every request as it arrives and answers 200 ``delay_s`` later."""

    def __init__(self, delay_s: float = 0.0, tls: ssl.SSLContext | None = None) -> None:
        self.delay_s = delay_s
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.server_names: list[str | None] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests.append((dict(self.headers.items()), body))
                time.sleep(receiver.delay_s)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 128  # dozens of senders connect at once

        self.server = Server(("127.0.0.1", 0), Handler)
        if tls is not None:
            tls.sni_callback = lambda sock, name, ctx: self.server_names.append(name)  # type: ignore[assignment]
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def job_ids(self) -> Counter[str]:
        return Counter(json.loads(body)["id"] for _, body in self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RawServer:
    """A loopback TCP server whose connections ``handle(conn)`` serves, one thread each, for hostile answers."""

    def __init__(self, handle: Any) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.handle = handle
        self.done = threading.Event()
        self.closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)  # the request (small: headers and a job object)
            try:
                self.handle(conn)
            except OSError:
                pass  # the sender hung up: what these tests want
            finally:
                self.done.set()

    def close(self) -> None:
        self.closed = True
        self.sock.close()


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.replace(webhook_secret="whsec_dGVzdCBrZXk=", webhook_allow_private=True)


@pytest.fixture
def hooks() -> Iterator[list[Any]]:
    servers: list[Any] = []
    yield servers
    for server in servers:
        server.close()


async def ended_with_webhooks(queue: Queue, url: str, n: int) -> list[str]:
    """``n`` jobs cancelled at once (no worker needed): ``n`` terminal events with a webhook to ``url``."""
    ids = []
    for i in range(n):
        job = await submit(queue, chat(str(i)), webhook_url=url)
        await queue.cancel("acme", job.id)
        ids.append(job.id)
    return ids


async def no_pending(queue: Queue) -> bool:
    return int((await queue.redis.xpending(queue.keys.events, WEBHOOK_GROUP))["pending"]) == 0


# ------------------------------------------------------------------------------------------------ once


async def test_several_consumers_and_a_slow_receiver_post_each_webhook_exactly_once(
    settings: Settings, queue: Queue, hooks: list[Any]
) -> None:
    receiver = HookServer(delay_s=0.3)
    hooks.append(receiver)
    ids = await ended_with_webhooks(queue, receiver.url + "/hook", 150)
    stop = asyncio.Event()
    senders = [WebhookSender(queue, settings, f"sender-{i}") for i in range(3)]
    tasks = [asyncio.create_task(sender.run(stop)) for sender in senders]

    async def all_posted() -> bool:
        return len(receiver.job_ids()) == len(ids)

    await eventually_async(all_posted, what="150 webhooks", timeout=90, interval=0.2)
    await eventually_async(lambda: no_pending(queue), what="every entry acknowledged", timeout=30)
    # a duplicate comes once a delivered entry idles past the lease and a peer claims it: wait that out, twice
    await asyncio.sleep(2 * LEASE_MS / 1000 + 1)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    for sender in senders:
        await sender.aclose()
    posted = receiver.job_ids()
    assert set(posted) == set(ids)
    assert [job for job, times in posted.items() if times > 1] == []
    assert (await queue.stats())["webhooks_delivered"] == 150
    assert len({headers["webhook-id"] for headers, _ in receiver.requests}) == 150


async def test_each_scaler_pass_consumes_under_its_own_name_and_leaves_no_consumer_behind(
    settings: Settings, queue: Queue, hooks: list[Any]
) -> None:
    receiver = HookServer(delay_s=0.5)
    hooks.append(receiver)
    await ended_with_webhooks(queue, receiver.url, 6)
    # two overlapping passes (two scaler invocations at once) share the work and delete none of each other's
    first, second = await asyncio.gather(deliver_webhooks(queue, settings), deliver_webhooks(queue, settings))
    assert first.delivered + second.delivered == 6
    assert sorted(receiver.job_ids().values()) == [1] * 6
    assert await queue.redis.xinfo_consumers(queue.keys.events, WEBHOOK_GROUP) == []


async def test_a_pass_deletes_long_idle_empty_consumers_of_earlier_passes_only(
    settings: Settings, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ended_with_webhooks(queue, "http://127.0.0.1:9/never", 1)
    redis, events = queue.redis, queue.keys.events
    await redis.xreadgroup(WEBHOOK_GROUP, "scaler-holding", {events: ">"}, count=1)  # holds the entry
    await redis.xgroup_createconsumer(events, WEBHOOK_GROUP, "scaler-empty")
    await redis.xgroup_createconsumer(events, WEBHOOK_GROUP, "worker-7")
    monkeypatch.setattr(webhooks, "STALE_CONSUMER_MS", -1)  # "long idle" is now
    await deliver_webhooks(queue, settings, budget_s=0.0)  # takes nothing: only the sweep runs
    names = {c["name"] for c in await redis.xinfo_consumers(events, WEBHOOK_GROUP)}
    assert names == {"scaler-holding", "worker-7"}  # holding something, or not a pass of this prefix


async def test_a_stopping_sender_starts_no_new_post(settings: Settings, queue: Queue, hooks: list[Any]) -> None:
    receiver = HookServer(delay_s=0.5)
    hooks.append(receiver)
    await ended_with_webhooks(queue, receiver.url, 3)
    stop = asyncio.Event()
    sender = WebhookSender(queue, settings, "stopping", concurrency=1)
    task = asyncio.create_task(sender.run(stop))
    await eventually_async(lambda: asyncio.sleep(0, result=bool(receiver.requests)), what="a first POST", timeout=10)
    stop.set()
    await asyncio.wait_for(task, 10)
    await sender.aclose()
    assert len(receiver.requests) == 1  # the one in flight finished; the two waiting for the slot did not start
    assert int((await queue.redis.xpending(queue.keys.events, WEBHOOK_GROUP))["pending"]) == 2


# ------------------------------------------------------------------------------------------------ bounded


def drip(conn: socket.socket) -> None:
    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
        conn.sendall(bytes([byte]))
        time.sleep(1.0)  # every read gets a byte in time: only an overall deadline ends this


async def test_a_dripping_receiver_is_given_up_at_the_deadline_and_frees_its_slot(
    settings: Settings, queue: Queue, hooks: list[Any]
) -> None:
    dripping, good = RawServer(drip), HookServer()
    hooks += [dripping, good]
    await ended_with_webhooks(queue, dripping.url, 1)
    [after] = await ended_with_webhooks(queue, good.url, 1)
    sender = WebhookSender(queue, settings, "one-slot", http_timeout_s=2.0, concurrency=1)
    # the drip takes 40 s; one slot and no deadline would hold the pass (and the next webhook) that long
    report = await asyncio.wait_for(sender.deliver_once(), 20)
    await sender.aclose()
    assert (report.failed, report.delivered) == (1, 1)
    assert list(good.job_ids()) == [after]
    pending = await queue.redis.xpending(queue.keys.events, WEBHOOK_GROUP)
    assert pending["pending"] == 1  # the dripping receiver's webhook waits for its retry


async def test_a_huge_answer_is_not_read_whole(settings: Settings, queue: Queue, hooks: list[Any]) -> None:
    size = 1 << 30
    sent = [0]

    def huge(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        chunk = b"x" * 65536
        while sent[0] < size:
            sent[0] += conn.send(chunk)

    server = RawServer(huge)
    hooks.append(server)
    await ended_with_webhooks(queue, server.url, 1)
    report = await asyncio.wait_for(deliver_webhooks(queue, settings), 30)
    assert report.delivered == 1  # the status is the answer
    assert await asyncio.to_thread(server.done.wait, 30)  # the sender hung up
    assert sent[0] < size // 16, f"{sent[0]} bytes of {size} went out"


# ------------------------------------------------------------------------------------------------ the guard


INTERNAL = ["127.0.0.1", "10.0.0.5", "169.254.169.254", "100.64.0.1", "::1", "::ffff:127.0.0.1", "fd00::1",
            "fe80::1"]


async def test_a_public_name_that_resolves_inward_is_refused_at_send_time_and_abandoned(
    settings: Settings, queue: Queue, hooks: list[Any], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver = HookServer()
    hooks.append(receiver)
    resolved: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        address = INTERNAL[len(resolved)]
        resolved.append(host)
        return [address] if host == "hooks.example.com" else []

    monkeypatch.setattr(netguard, "resolve", resolve)
    guarded = settings.replace(webhook_allow_private=False)
    await ended_with_webhooks(queue, "https://hooks.example.com/done?token=s3cret", len(INTERNAL))
    with caplog.at_level(logging.INFO, logger="inferq.webhooks"):
        report = await deliver_webhooks(queue, guarded)
    assert (report.refused, report.abandoned, report.delivered, report.failed) == (len(INTERNAL), len(INTERNAL), 0, 0)
    assert resolved == ["hooks.example.com"] * len(INTERNAL)
    stats = await queue.stats()
    assert (stats["webhooks_refused"], stats["webhooks_abandoned"]) == (len(INTERNAL), len(INTERNAL))
    assert await no_pending(queue)  # permanent: no retry
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == len(INTERNAL) and all("hooks.example.com" in m for m in refusals)
    assert "s3cret" not in caplog.text  # the URL's query never reaches the log


@pytest.mark.parametrize("url", ["https://127.0.0.1/", "https://127.1/", "https://2130706433/", "https://0x7f.1/",
                                 "https://[::1]/", "https://[::ffff:127.0.0.1]/", "https://localhost/",
                                 "http://hooks.example.com/"])
async def test_internal_literals_and_plain_http_are_refused_at_send_time(
    settings: Settings, queue: Queue, url: str
) -> None:
    await ended_with_webhooks(queue, url, 1)
    report = await deliver_webhooks(queue, settings.replace(webhook_allow_private=False))
    assert (report.refused, report.failed) == (1, 0)


async def test_the_connection_goes_to_the_address_that_was_checked_without_resolving_again(
    settings: Settings, queue: Queue, hooks: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = HookServer()
    hooks.append(receiver)
    lookups: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["127.0.0.1"]  # the system resolver knows no "hooks.test": only this answer can lead there

    monkeypatch.setattr(netguard, "resolve", resolve)
    await ended_with_webhooks(queue, f"http://hooks.test:{receiver.port}/hook", 1)
    report = await deliver_webhooks(queue, settings)
    assert report.delivered == 1 and lookups == ["hooks.test"]
    assert receiver.requests[0][0]["Host"] == f"hooks.test:{receiver.port}"


def certificate_for(name: str, directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for ``name``: the receiver's context, and a client context trusting only it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_path, key_path)
    client = ssl.create_default_context(cafile=str(cert_path))
    return server, client


async def test_tls_goes_to_the_checked_address_but_names_and_verifies_the_host(
    settings: Settings, queue: Queue, hooks: list[Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server_tls, client_tls = certificate_for("hooks.test", tmp_path)
    receiver = HookServer(tls=server_tls)
    hooks.append(receiver)

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    monkeypatch.setattr(netguard, "resolve", resolve)
    await ended_with_webhooks(queue, f"https://hooks.test:{receiver.port}/hook", 1)
    async with httpx.AsyncClient(transport=GuardedTransport(True, ssl_context=client_tls)) as client:
        report = await deliver_webhooks(queue, settings, client=client)
    assert report.delivered == 1
    assert receiver.server_names == ["hooks.test"]  # SNI: the name, though the socket went to 127.0.0.1
    # a certificate for another name fails verification: the check is against the URL's host, not the address
    other_tls, other_client_tls = certificate_for("elsewhere.test", tmp_path)
    other = HookServer(tls=other_tls)
    hooks.append(other)
    await ended_with_webhooks(queue, f"https://hooks.test:{other.port}/hook", 1)
    async with httpx.AsyncClient(transport=GuardedTransport(True, ssl_context=other_client_tls)) as client:
        report = await deliver_webhooks(queue, settings, client=client)
    assert (report.delivered, report.failed) == (0, 1) and other.requests == []


async def test_a_receiver_with_a_private_ca_is_reached_through_ssl_cert_file_and_never_through_a_proxy(
    settings: Settings, queue: Queue, hooks: list[Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Deliveries verify receivers against the system's CA store as OpenSSL finds it: a receiver whose certificate
    a company CA signed fails until ``SSL_CERT_FILE`` names that CA (``SSL_CERT_DIR`` likewise). Proxy variables
    are not used: a proxy would resolve and connect past the address guard."""
    from inferq.webhooks import guarded_http

    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    ca_path, server_tls = private_ca(tmp_path)
    receiver = HookServer(tls=server_tls)
    proxy = RawServer(lambda conn: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
    hooks += [receiver, proxy]
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    url = f"https://127.0.0.1:{receiver.port}/hook"

    guarded_http._verifying_context.cache_clear()
    await ended_with_webhooks(queue, url, 1)
    report = await deliver_webhooks(queue, settings)  # the system's store knows no such CA
    assert (report.delivered, report.failed) == (0, 1) and receiver.requests == []

    monkeypatch.setenv("SSL_CERT_FILE", str(ca_path))
    guarded_http._verifying_context.cache_clear()  # read once per process, as a process starts
    [through_file] = await ended_with_webhooks(queue, url, 1)
    report = await deliver_webhooks(queue, settings)
    assert report.delivered >= 1 and through_file in receiver.job_ids()  # (>=: the first one's retry may be due)
    assert not proxy.done.is_set()  # nothing went to the proxy

    (tmp_path / "certs").mkdir()
    subject_hash = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(ca_path)], check=True,
                                  capture_output=True, text=True).stdout.strip()
    shutil.copy(ca_path, tmp_path / "certs" / f"{subject_hash}.0")  # a c_rehash'd directory, as SSL_CERT_DIR wants
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "certs"))
    guarded_http._verifying_context.cache_clear()
    [through_dir] = await ended_with_webhooks(queue, url, 1)
    report = await deliver_webhooks(queue, settings)
    assert report.delivered >= 1 and through_dir in receiver.job_ids() and not proxy.done.is_set()
    guarded_http._verifying_context.cache_clear()
