"""Where webhooks may go (app/services/webhook_urls.py), and one attempt's send
(workers/webhooks.py send()) re-checking the address after resolving the name again, then
connecting to the address it checked. Names are resolved by ``resolver`` arguments standing in
for DNS (a name re-pointed between two lookups cannot be had from real DNS here); the sends go
over real HTTP to a real receiver on 127.0.0.1."""

from __future__ import annotations

import ipaddress
import re
import socket

import pytest

from app.services.secrets import cipher
from app.services.webhook_urls import UnsafeURL, forbidden, resolve
from app.settings import Settings
from tests.support.webhook_receiver import Receiver
from workers.webhooks import Claimed, send


def dns(*addresses: str):
    """A resolver (getaddrinfo's signature) that answers ``addresses`` for any name."""
    def resolver(host: str, port: int, family: int = 0, type: int = 0):
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port)) for a in addresses]
    return resolver


@pytest.mark.parametrize("address", [
    "10.0.0.5", "172.16.3.4", "192.168.1.1", "127.0.0.1", "127.8.9.10", "0.0.0.0",
    "169.254.169.254", "169.254.1.1", "100.64.0.1", "100.100.100.200", "224.0.0.1",
    "240.0.0.1", "255.255.255.255", "198.18.0.1", "168.63.129.16", "::1", "::", "fe80::1",
    "fc00::1", "fd00:ec2::254", "ff02::1", "::ffff:10.0.0.1", "::ffff:127.0.0.1",
    "2002:a00:1::",  # 6to4 around 10.0.0.1
])
def test_internal_addresses_are_forbidden(address: str) -> None:
    assert forbidden(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888",
                                     "::ffff:8.8.8.8"])
def test_public_addresses_are_not(address: str) -> None:
    assert forbidden(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("url, why", [
    ("http://10.0.0.5/hook", "10.0.0.5 is a private address"),
    ("http://169.254.169.254/", "169.254.169.254 is a cloud metadata address"),
    ("http://[fd00:ec2::254]/", "cloud metadata"),
    ("http://0x7f000001/", "loopback"),  # the name's resolution decides, however it is written
    ("ftp://8.8.8.8/", "http:// or https://"),
    ("http://user:pw@8.8.8.8/", "user name or password"),
    ("http://8.8.8.8:0/", "port"),
    ("http:///path", "must name a host"),
])
def test_refused_urls_say_why(url: str, why: str) -> None:
    with pytest.raises(UnsafeURL, match=re.escape(why)):
        resolve(url, Settings(), dns("10.0.0.5") if "0x" not in url else socket.getaddrinfo)


def test_every_address_of_a_name_must_be_public() -> None:
    with pytest.raises(UnsafeURL, match="'hooks.example' resolves to 10.1.2.3"):
        resolve("https://hooks.example/in", Settings(), dns("8.8.8.8", "10.1.2.3"))
    target = resolve("https://hooks.example:8443/in?x=1", Settings(), dns("8.8.8.8"))
    assert str(target.url) == "https://8.8.8.8:8443/in?x=1"  # connect to what was checked
    assert target.host_header == "hooks.example:8443" and target.sni_hostname == "hooks.example"


def test_allowed_hosts_are_matched_by_name() -> None:
    settings = Settings(webhook_allowed_hosts="hooks.internal, 127.0.0.1")
    assert resolve("http://HOOKS.internal/x", settings, dns("10.0.0.7")).address == "10.0.0.7"
    assert resolve("http://127.0.0.1:9/x", settings).address == "127.0.0.1"
    with pytest.raises(UnsafeURL):  # the same address under a name that is not allowed
        resolve("http://other.internal/x", settings, dns("10.0.0.7"))


def test_a_name_that_does_not_resolve_is_refused() -> None:
    def nowhere(*_: object):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(UnsafeURL, match="does not resolve"):
        resolve("http://gone.example/", Settings(), nowhere)


def claimed(url: str, settings: Settings, body: str = '{"type":"webhook.test"}') -> Claimed:
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    return Claimed(id="msg_0123456789abcdef01234567", token="t", attempt=1, attempt_id=0,
                   webhook_id="wh_x", url=url, body=body,
                   secret_ciphertext=cipher(settings).encrypt(secret.encode()).decode())


def test_delivery_re_checks_the_name_and_refuses_a_private_answer() -> None:
    """Created while the name pointed at a public address; by delivery time it points at a
    private one (DNS rebinding): the attempt fails without connecting anywhere."""
    settings = Settings()
    with Receiver() as receiver:
        port = receiver.server.server_address[1]
        outcome = send(claimed(f"http://rebound.example:{port}/hook", settings), settings,
                       resolver=dns("127.0.0.1"))
        assert outcome.status_code is None and outcome.error.startswith("refused: ")
        assert "resolves to 127.0.0.1" in outcome.error
        assert receiver.received == []


def test_delivery_connects_to_the_checked_address_with_the_name_as_host() -> None:
    settings = Settings(webhook_allowed_hosts="hooks.test")
    with Receiver() as receiver:
        port = receiver.server.server_address[1]
        outcome = send(claimed(f"http://hooks.test:{port}/hook?k=v", settings), settings,
                       resolver=dns("127.0.0.1"))
        [request] = receiver.received
    assert outcome.status_code == 200 and outcome.error is None
    assert request.headers["host"] == f"hooks.test:{port}" and request.path == "/hook?k=v"
    assert request.verify("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") == {"type": "webhook.test"}


def test_redirects_are_not_followed_and_count_as_failures() -> None:
    settings = Settings(webhook_allowed_hosts="127.0.0.1")
    with Receiver(statuses=[302]) as receiver:
        outcome = send(claimed(receiver.url, settings), settings)
        assert len(receiver.received) == 1
    assert outcome.status_code == 302 and not outcome.succeeded


def test_an_unreachable_receiver_is_a_network_error() -> None:
    settings = Settings(webhook_allowed_hosts="127.0.0.1")
    with Receiver() as receiver:
        url = receiver.url
    outcome = send(claimed(url, settings), settings)  # its port is closed now
    assert outcome.status_code is None and "ConnectError" in outcome.error


def test_the_retry_schedule_defaults_to_about_a_day() -> None:
    delays = Settings().webhook_retry_delays
    assert delays == [5, 300, 1800, 7200, 18000, 36000, 36000]
    assert 20 * 3600 < sum(delays) < 30 * 3600
    with pytest.raises(ValueError):
        Settings(webhook_retry_seconds="5,soon")
    with pytest.raises(ValueError, match="LEASE"):
        Settings(webhook_timeout_seconds=30, webhook_lease_seconds=10)
