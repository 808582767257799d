"""The webhook address guard's table: every internal address in every spelling is refused, public ones pass."""

from __future__ import annotations

import ipaddress

import pytest

from inferq.webhooks import netguard
from inferq.webhooks.netguard import BlockedAddress, blocked_reason, check_webhook_host, parse_ipv4, resolve_checked

INTERNAL = [
    ("127.0.0.1", "loopback"), ("127.255.255.254", "loopback"), ("10.0.3.7", "private"),
    ("172.16.0.1", "private"), ("172.31.255.255", "private"), ("192.168.1.1", "private"),
    ("100.64.0.1", "private (carrier-grade NAT)"), ("169.254.169.254", "link-local"), ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"), ("239.255.255.250", "multicast"), ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"), ("192.0.2.1", "reserved (documentation)"),
    ("::1", "loopback"), ("::", "unspecified"), ("fe80::1", "link-local"), ("fc00::1", "unique-local"),
    ("fd12:3456::1", "unique-local"), ("ff02::1", "multicast"), ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:169.254.169.254", "link-local"), ("::ffff:10.1.2.3", "private"), ("64:ff9b::a00:1", "private"),
    ("2002:7f00:1::", "loopback"), ("::127.0.0.1", "reserved"), ("2001:db8::1", "reserved (documentation)"),
    ("2001::1", "reserved (IETF protocol assignments)"),
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "172.32.0.1", "100.128.0.1", "2606:4700:4700::1111", "::ffff:8.8.8.8",
          "64:ff9b::808:808", "2a00:1450:4001::200e"]


@pytest.mark.parametrize(("address", "reason"), INTERNAL, ids=[a for a, _ in INTERNAL])
def test_internal_addresses_are_refused_with_their_kind(address: str, reason: str) -> None:
    assert blocked_reason(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize("address", PUBLIC)
def test_public_unicast_addresses_pass(address: str) -> None:
    assert blocked_reason(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("spelling", "address"),
    [("127.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0x7f.1", "127.0.0.1"), ("0177.0.0.1", "127.0.0.1"),
     ("0x7f000001", "127.0.0.1"), ("127.0.0.1.", "127.0.0.1"), ("10.1", "10.0.0.1"), ("192.168.257", "192.168.1.1"),
     ("0", "0.0.0.0"), ("8.8.8.8", "8.8.8.8")],
)
def test_every_ipv4_spelling_a_resolver_accepts_is_read_as_that_address(spelling: str, address: str) -> None:
    assert parse_ipv4(spelling) == ipaddress.IPv4Address(address)


@pytest.mark.parametrize("host", ["example.com", "1.2.3.4.5", "256.1.1.1", "0x1g", "1e3", "-1", "", "a.b"])
def test_names_and_impossible_numbers_are_not_ipv4(host: str) -> None:
    assert parse_ipv4(host) is None


@pytest.mark.parametrize(
    "host",
    ["localhost", "LOCALHOST", "localhost.", "api.localhost", "127.0.0.1", "127.1", "2130706433", "0x7f.1",
     "[::1]", "::ffff:127.0.0.1", "[::ffff:7f00:1]", "169.254.169.254", "%31%32%37.0.0.1", "\uff11\uff12\uff17.0.0.1",
     "fe80::1%25eth0", "10.0.0.1", "[fd00::1]", "0.0.0.0", "999.1.1.1"],
)
def test_internal_hosts_are_refused_at_submit(host: str) -> None:
    assert check_webhook_host(host) is not None


@pytest.mark.parametrize("host", ["hooks.example.com", "8.8.8.8", "[2606:4700::1111]", "xn--bcher-kva.example",
                                  "localhost.example.com", "my-localhost.com", "10.example.com"])
def test_public_hosts_pass_at_submit(host: str) -> None:
    assert check_webhook_host(host) is None


async def test_a_name_resolving_inward_is_refused_even_with_public_addresses_beside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def resolve(host: str, port: int) -> list[str]:
        return ["93.184.215.14", "10.0.0.5"]

    monkeypatch.setattr(netguard, "resolve", resolve)
    with pytest.raises(BlockedAddress) as refused:
        await resolve_checked("hooks.example.com", 443, allow_private=False)
    assert (refused.value.address, refused.value.reason) == ("10.0.0.5", "private")
    assert "hooks.example.com" in str(refused.value)
    assert await resolve_checked("hooks.example.com", 443, allow_private=True) == ["93.184.215.14", "10.0.0.5"]


async def test_the_real_resolver_answers_for_an_address_literal() -> None:
    assert await netguard.resolve("127.0.0.1", 80) == ["127.0.0.1"]
    with pytest.raises(BlockedAddress):
        await resolve_checked("127.0.0.1", 80, allow_private=False)


@pytest.mark.parametrize("address", ["169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200",
                                     "169.254.169.253", "::ffff:169.254.170.2"])
def test_cloud_metadata_and_the_task_credentials_endpoints_are_refused(address: str) -> None:
    """Issue 47, L4: the instance metadata (IPv4 and AWS's IPv6), the ECS task metadata and credentials endpoint,
    Amazon's DNS, and Alibaba's metadata address (carrier-grade NAT space)."""
    assert blocked_reason(ipaddress.ip_address(address)) is not None


def test_the_deployments_own_network_is_refused_even_outside_the_private_ranges() -> None:
    """A VPC may use a public block privately (or 100.64/10): the stack names its CIDR and the guard refuses it,
    at submit and at send time, mapped IPv6 spellings included."""
    vpc = netguard.networks(["11.42.0.0/16", "2600:1f18:abcd::/56"])
    for inside in ("11.42.7.9", "::ffff:11.42.0.1", "2600:1f18:abcd:12::5"):
        assert blocked_reason(ipaddress.ip_address(inside)) is None  # public by the table alone
        assert "INFERQ_WEBHOOK_BLOCKED_NETWORKS" in (blocked_reason(ipaddress.ip_address(inside), vpc) or "")
    assert blocked_reason(ipaddress.ip_address("11.43.0.1"), vpc) is None
    assert check_webhook_host("11.42.0.10", vpc) is not None and check_webhook_host("11.42.0.10") is None


async def test_a_name_resolving_into_the_deployments_network_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_resolve(host: str, port: int) -> list[str]:
        return ["11.42.0.10"]

    monkeypatch.setattr(netguard, "resolve", fake_resolve)
    with pytest.raises(BlockedAddress):
        await resolve_checked("hooks.example.com", 443, allow_private=False, extra=netguard.networks(["11.42.0.0/16"]))
    assert await resolve_checked("hooks.example.com", 443, allow_private=False) == ["11.42.0.10"]


def test_only_the_configured_ports_take_webhooks() -> None:
    assert netguard.port_refusal(443, (443,)) is None
    assert "INFERQ_WEBHOOK_PORTS" in (netguard.port_refusal(6379, (443,)) or "")
    assert netguard.port_refusal(8443, (443, 8443)) is None


async def test_a_webhook_to_a_port_not_allowed_is_refused_without_a_connection() -> None:
    from inferq.config.settings import Settings
    from inferq.webhooks.post import Outcome, WebhookPost

    def never(request: object) -> None:
        raise AssertionError("no request may be made")

    import httpx

    post = WebhookPost(Settings(), client=httpx.AsyncClient(transport=httpx.MockTransport(never)))
    try:
        for url in ("https://hooks.example.com:22/x", "https://hooks.example.com:6379/", "https://h.example:8443/"):
            assert await post.post("m", "job_x", url, b"{}", ["whsec_MTIzNDU2Nzg5MDEyMzQ1Ng=="]) is Outcome.REFUSED
    finally:
        await post.aclose()


def test_with_a_host_list_only_its_hosts_take_webhooks() -> None:
    """INFERQ_WEBHOOK_HOSTS (the stack's WebhookHosts, which its DNS Firewall lets the VPC resolve): exact names,
    and ``*.zone`` for any name under the zone but not the zone itself, as DNS Firewall matches them."""
    from inferq.config.settings import Settings

    allowed = Settings.from_env({"INFERQ_WEBHOOK_HOSTS": " Hooks.Example.com., *.tenant.example "}).webhook_hosts
    assert allowed == ("hooks.example.com", "*.tenant.example")
    for host in ("hooks.example.com", "HOOKS.example.com.", "a.tenant.example", "a.b.tenant.example"):
        assert netguard.host_refusal(host, allowed) is None, host
    for host in ("example.com", "x.hooks.example.com", "tenant.example", "atenant.example", "hooks.example.com.evil"):
        assert "INFERQ_WEBHOOK_HOSTS" in (netguard.host_refusal(host, allowed) or ""), host
    assert netguard.host_refusal("anything.example", ()) is None  # no list: any host (the other rules hold)


async def test_a_webhook_to_a_host_not_listed_is_refused_at_send_without_a_connection() -> None:
    import httpx

    from inferq.config.settings import Settings
    from inferq.webhooks.post import Outcome, WebhookPost

    def never(request: object) -> None:
        raise AssertionError("no request may be made")

    settings = Settings(webhook_hosts=("hooks.example.com",), webhook_allow_private=True)  # the list holds anyway
    post = WebhookPost(settings, client=httpx.AsyncClient(transport=httpx.MockTransport(never)))
    try:
        for url in ("https://other.example/x", "http://127.0.0.1:8080/hook"):
            assert await post.post("m", "job_x", url, b"{}", ["whsec_MTIzNDU2Nzg5MDEyMzQ1Ng=="]) is Outcome.REFUSED
    finally:
        await post.aclose()
