"""The send-time half of the webhook address guard (:mod:`.netguard` has the table): an httpx transport that
resolves a host once, refuses it when an address is internal, and connects to the address it checked.

httpcore's network backend is where a connection's address is chosen, so the guard sits there: no second
resolution for DNS rebinding to slip through, while httpcore still starts TLS with the URL's host name (SNI and
certificate verification are for the name, not the address). A separate module from ``netguard``: the gateway
imports that one and carries no HTTP client.
"""

from __future__ import annotations

import functools
import os
import ssl
import typing
from collections.abc import Iterable

import httpcore
import httpx

from inferq.webhooks import netguard

MAX_CONNECTIONS = 16


class GuardedNetwork(httpcore.AsyncNetworkBackend):
    """httpcore's network under the address guard: ``connect_tcp`` resolves the host once, refuses internal
    addresses (:class:`netguard.BlockedAddress`), and connects to the checked address. httpcore still starts TLS
    with the URL's host name, so SNI and certificate verification are for the name, not the address."""

    def __init__(self, allow_private: bool, blocked: typing.Sequence[netguard.Network] = ()) -> None:
        self.allow_private = allow_private
        self.blocked = tuple(blocked)
        self._network = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        local_address: str | None = None,
        socket_options: Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await netguard.resolve_checked(host, port, allow_private=self.allow_private, extra=self.blocked)
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._network.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        socket_options: Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise netguard.BlockedAddress(path, path, "unix socket")

    async def sleep(self, seconds: float) -> None:
        await self._network.sleep(seconds)


CA_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")


@functools.cache
def _verifying_context() -> ssl.SSLContext:
    """One certificate-verifying TLS context per process (loading a CA store takes tens of milliseconds, and the
    scaler builds a sender every tick): the system's CA store, as OpenSSL finds it, so ``SSL_CERT_FILE`` and
    ``SSL_CERT_DIR`` name a company's CA exactly as they do for curl or Python itself. Only where the system has no
    store at all (and neither variable is set) does it fall back to the CA list certifi bundles (httpx's)."""
    context = ssl.create_default_context()
    if not any(os.environ.get(name) for name in CA_VARIABLES) and not context.cert_store_stats()["x509_ca"]:
        paths = ssl.get_default_verify_paths()
        if not (paths.capath and os.path.isdir(paths.capath) and os.listdir(paths.capath)):
            import certifi

            context.load_verify_locations(certifi.where())
    return context


class GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport on a :class:`GuardedNetwork`. httpx offers no parameter for httpcore's network backend,
    so the connection pool it builds is replaced by one that has it (same pool class, same limits)."""

    def __init__(
        self, allow_private: bool, max_connections: int = MAX_CONNECTIONS, ssl_context: ssl.SSLContext | None = None,
        blocked: typing.Sequence[netguard.Network] = (),
    ) -> None:
        ssl_context = ssl_context or _verifying_context()
        # no proxy from the environment (HTTPS_PROXY, ALL_PROXY, ...): the proxy would do the resolving and connect
        # wherever the host leads, past the guard
        super().__init__(verify=ssl_context, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=5.0,
            network_backend=GuardedNetwork(allow_private, blocked),
        )


async def read_capped(response: httpx.Response, limit: int) -> None:
    received = 0
    async for chunk in response.aiter_raw():
        received += len(chunk)
        if received >= limit:
            break  # leaving the stream unread closes the connection instead of downloading the rest
