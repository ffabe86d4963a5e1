"""Where a webhook may be sent (no SSRF): http(s) URLs without credentials, whose host resolves
only to public addresses. Checked when a webhook is created and again before every attempt, on
the addresses the name resolves to then; the attempt connects to the address that was checked
(``Target``), so a name re-pointed at a private address in between (DNS rebinding) gets
nowhere. Hosts named in SPECDECK_WEBHOOK_ALLOWED_HOSTS skip the address check (a receiver on
the same host or network, tests).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from app.settings import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# getaddrinfo's signature: (host, port, family, type) -> [(family, type, proto, name, sockaddr)]
Resolver = Callable[..., Sequence[tuple[Any, ...]]]

# Public addresses that clouds answer metadata or platform requests on; the rest of them
# (169.254.169.254, fd00:ec2::254, 100.100.100.200) are link-local, private or shared anyway.
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "168.63.129.16"))


class UnsafeURL(ValueError):
    """The URL may not be a webhook's; the message says why."""


@dataclass(frozen=True)
class Target:
    """A checked URL, rewritten to connect to the checked address; the name stays in the Host
    header and in TLS (SNI, and the name the certificate must hold)."""

    url: httpx.URL  # with the address in place of the name
    host_header: str
    sni_hostname: str | None  # https to a name
    address: str


def forbidden(address: IPAddress) -> str | None:
    """Why a webhook may not reach ``address`` (None: it may): anything not on the public
    internet, and the clouds' metadata services. IPv6 forms that embed an IPv4 address
    (mapped, 6to4, Teredo) are judged by that address too."""
    if address in METADATA:
        return "a cloud metadata address"
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or (address.teredo or (None, None))[1]
        if embedded is not None:
            return forbidden(embedded)
    for kind in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
        if getattr(address, f"is_{kind}"):
            return f"{'an' if kind == 'unspecified' else 'a'} {kind.replace('_', '-')} address"
    if not address.is_global:
        return "not a public address"
    return None


def allowed_hosts(settings: Settings) -> frozenset[str]:
    return frozenset(h.strip().lower().strip("[]") for h in settings.webhook_allowed_hosts.split(",")
                     if h.strip())


def _parse(url: str) -> tuple[httpx.URL, str]:
    """The URL as httpx (which sends it) reads it, and its host in ASCII."""
    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except (httpx.InvalidURL, ValueError) as exc:
        raise UnsafeURL(f"'{url}' is not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise UnsafeURL("a webhook URL must start with http:// or https://")
    if parsed.userinfo:
        raise UnsafeURL("a webhook URL may not hold a user name or password")
    host = parsed.raw_host.decode("ascii").strip("[]").rstrip(".").lower()
    if not host:
        raise UnsafeURL("a webhook URL must name a host")
    if port is not None and not 0 < port < 65536:
        raise UnsafeURL("a webhook URL's port must be 1-65535")
    return parsed, host


def resolve(url: str, settings: Settings, resolver: Resolver = socket.getaddrinfo) -> Target:
    """Check ``url`` and pick the address to send to: every address its host resolves to must
    be public (one private address among them would let a receiver choose), unless the host is
    allowed by name. Raises UnsafeURL."""
    parsed, host = _parse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        literal: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        addresses = [literal]
    else:
        try:
            infos = resolver(host, port, 0, socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise UnsafeURL(f"the host '{host}' does not resolve "
                            f"({getattr(exc, 'strerror', None) or exc})") from None
        # sockaddr[0]: the address (an IPv6 one may carry a "%scope" suffix).
        addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0])
                                       for info in infos))
        if not addresses:
            raise UnsafeURL(f"the host '{host}' does not resolve")
    if host not in allowed_hosts(settings):
        for address in addresses:
            if reason := forbidden(address):
                shown = host if literal is not None else f"'{host}' resolves to {address}, which"
                raise UnsafeURL(f"webhooks may not be sent to private or internal addresses: "
                                f"{shown} is {reason} (SPECDECK_WEBHOOK_ALLOWED_HOSTS allows a "
                                "host by name)")
    address = str(addresses[0])
    return Target(url=parsed.copy_with(host=address), host_header=parsed.netloc.decode("ascii"),
                  sni_hostname=host if parsed.scheme == "https" and literal is None else None,
                  address=address)
