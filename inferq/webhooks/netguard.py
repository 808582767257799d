"""The address guard for webhooks: which hosts a webhook may be POSTed to (docs/api.md, ``webhook_url``).

A webhook is an HTTP request made from inside the deployment (a worker's or the scaler's network) to a URL a tenant
chose. Without a guard, ``https://169.254.169.254/`` reads the instance metadata, ``https://10.0.3.7/`` reaches
the VPC, ``https://localhost:6379/`` talks to a sidecar. Two checks, one table:

- at submit, :func:`check_webhook_host` refuses a host that *is* an internal address (any spelling of one:
  ``127.1``, ``2130706433``, ``0x7f.1``, ``[::ffff:127.0.0.1]``) or a ``localhost`` name -- a clear 422 instead of
  a webhook that could never be delivered;
- at send time, the sender resolves the name and refuses it when any of its addresses is internal (DNS can point
  a public-looking name inward), then connects to the address it checked, never resolving twice (DNS rebinding).

Two more rules of the deployment's: a webhook goes to a port of ``INFERQ_WEBHOOK_PORTS`` only (443 unless the
operator lists more: a tenant's URL must not make the sender talk to any service on any port), and never into
``INFERQ_WEBHOOK_BLOCKED_NETWORKS`` (the stack sets its VPC's CIDR, which may lie outside the private ranges, say
in 100.64/10 or a public block used privately). Cloud metadata endpoints are in the table: 169.254.169.254 and
169.254.170.2 (link-local), AWS's IPv6 ``fd00:ec2::254`` (unique-local), 100.100.100.200 (carrier-grade NAT).
And, when the operator lists them, only to ``INFERQ_WEBHOOK_HOSTS`` (:func:`host_refusal`): the hosts a stack's DNS
Firewall lets the VPC resolve, so a URL no webhook could reach is a 422 at submit, not a delivery that never lands.

``INFERQ_WEBHOOK_ALLOW_PRIVATE=true`` turns the address and port rules off for local development (``inferq up``
sets it); a host list still holds.

Standard library only: the gateway imports it, and its Lambda artifact carries no HTTP client.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import unicodedata
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

BLOCKED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/8"), "unspecified"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "private (carrier-grade NAT)"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local"),  # the instance metadata service, 169.254.169.254, is here
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "reserved"),
    (_V4("192.0.2.0/24"), "reserved (documentation)"),
    (_V4("192.88.99.0/24"), "reserved (6to4 relay)"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("198.18.0.0/15"), "reserved (benchmarking)"),
    (_V4("198.51.100.0/24"), "reserved (documentation)"),
    (_V4("203.0.113.0/24"), "reserved (documentation)"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved"),  # with the broadcast address 255.255.255.255
)
"""IPv4 ranges a webhook may not reach: everything not globally routable unicast (RFC 6890's special-purpose
registry, with multicast)."""

BLOCKED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("::/8"), "reserved"),  # IPv4-compatible and other deprecated forms; mapped addresses are checked as IPv4
    (_V6("64:ff9b:1::/48"), "reserved (local NAT64)"),
    (_V6("100::/64"), "reserved (discard)"),
    (_V6("2001::/23"), "reserved (IETF protocol assignments)"),
    (_V6("2001:db8::/32"), "reserved (documentation)"),
    (_V6("fc00::/7"), "unique-local"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "reserved (site-local)"),
    (_V6("ff00::/8"), "multicast"),
)
"""IPv6 ranges a webhook may not reach. Addresses that carry an IPv4 address (mapped ``::ffff:a.b.c.d``, NAT64
``64:ff9b::a.b.c.d``, 6to4 ``2002:aabb:ccdd::``) are judged by that IPv4 address: that is where they lead."""

NAT64 = _V6("64:ff9b::/96")


class BlockedAddress(Exception):
    """A webhook's host is, or resolves to, an address the guard refuses. A permanent failure: retrying cannot
    help. The message names the host and the address, never the URL (its query may carry a token)."""

    def __init__(self, host: str, address: str, reason: str) -> None:
        super().__init__(f"webhook host {host} is a {reason} address ({address})")
        self.host = host
        self.address = address
        self.reason = reason


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """``INFERQ_WEBHOOK_BLOCKED_NETWORKS``'s blocks as networks."""
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def blocked_reason(address: Address, extra: Sequence[Network] = ()) -> str | None:
    """Why ``address`` is refused ("loopback", "private", ...), or None for a public unicast address. ``extra``: the
    deployment's own networks (its VPC), refused too."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return blocked_reason(embedded, extra)
        reason = next((reason for network, reason in BLOCKED_V6 if address in network), None)
    else:
        reason = next((reason for network, reason in BLOCKED_V4 if address in network), None)
    if reason is None and any(address.version == n.version and address in n for n in extra):
        return "the deployment's own network's (INFERQ_WEBHOOK_BLOCKED_NETWORKS)"
    return reason


def port_refusal(port: int, allowed: Sequence[int]) -> str | None:
    """Why a webhook may not go to ``port`` (a sentence), or None."""
    if port in allowed:
        return None
    return f"port {port} is not one webhooks may use ({', '.join(map(str, allowed))}: INFERQ_WEBHOOK_PORTS)"


def _ipv4_number(part: str) -> int | None:
    """One part of an IPv4 host as browsers and ``inet_aton`` read it: decimal, ``0x`` hex or ``0`` octal."""
    if part.startswith(("0x", "0X")):
        digits, base = part[2:], 16
    elif len(part) > 1 and part.startswith("0"):
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    if digits == "":
        return 0 if base == 16 else None
    try:
        return int(digits, base) if digits.isascii() and digits.isalnum() else None
    except ValueError:
        return None


def parse_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """``host`` as an IPv4 address in any spelling a resolver or browser accepts (``127.1``, ``2130706433``,
    ``0x7f.0.0.1``, ``0177.0.0.1``; the WHATWG URL standard's IPv4 parser), or None when it is not one."""
    parts = host.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()  # one trailing dot, as in a fully qualified name
    if not 1 <= len(parts) <= 4:
        return None
    numbers = [_ipv4_number(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    *head, last = [n for n in numbers if n is not None]
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(parts)):
        return None
    value = last
    for i, n in enumerate(head):
        value += n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def parse_address(host: str) -> Address | None:
    """An IP address written as a URL host (IPv6 with or without brackets, a zone id dropped), or None."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return None
    return parse_ipv4(host)


def normalize_host(host: str) -> str:
    """The host as a resolver sees it: percent-decoded, NFKC (full-width digits become digits, as IDNA maps them),
    lower case."""
    return unicodedata.normalize("NFKC", unquote(host)).lower()


def host_refusal(host: str, allowed: Sequence[str]) -> str | None:
    """Why a webhook may not go to ``host`` under ``INFERQ_WEBHOOK_HOSTS`` (a sentence), or None: with a list, the
    host is one of its names, or under one of its ``*.zone`` entries (as the stack's DNS Firewall matches them)."""
    if not allowed:
        return None
    name = normalize_host(host).rstrip(".")
    if any(name == entry or (entry.startswith("*.") and name.endswith(entry[1:])) for entry in allowed):
        return None
    return f"{name} is not a host webhooks may reach (INFERQ_WEBHOOK_HOSTS)"


def check_webhook_host(host: str, extra: Sequence[Network] = ()) -> str | None:
    """Why a URL host may not receive webhooks (a sentence for a 422), or None when it may. Literal checks only,
    no DNS: the send-time check resolves."""
    name = normalize_host(host)
    address = parse_address(name)
    if address is not None:
        reason = blocked_reason(address, extra)
        return f"{address} is a {reason} address" if reason else None
    labels = name.rstrip(".").split(".")
    if labels[-1] == "localhost":
        return f"{name} is a localhost name"
    if (labels[-1].isascii() and labels[-1].isdigit()) or labels[-1].startswith("0x"):
        # a last label that is a number makes a URL host an IPv4 address; this one is not a valid one
        return f"{name} is not a valid IPv4 address"
    return None


async def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, in the resolver's order. Tests replace this function to point a
    public-looking name wherever they like."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        if sockaddr[0] not in seen:
            seen.append(str(sockaddr[0]))
    return seen


async def resolve_checked(host: str, port: int, *, allow_private: bool,
                          extra: Sequence[Network] = ()) -> list[str]:
    """The addresses to connect to for ``host``: all of them public (and outside ``extra``), or
    :class:`BlockedAddress`. A name with one internal address among public ones is refused whole: which one a
    connection would get is the attacker's choice."""
    addresses = await resolve(host, port)
    if not addresses:
        raise OSError(f"{host} resolves to no address")
    if not allow_private:
        for raw in addresses:
            address = ipaddress.ip_address(raw.split("%", 1)[0])
            reason = blocked_reason(address, extra)
            if reason:
                raise BlockedAddress(host, raw, reason)
    return addresses
