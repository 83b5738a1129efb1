"""The address a request came from, as the audit log and the login lockout record it.

``REMOTE_ADDR`` is the peer that connected to daphne. Behind a load balancer or a
reverse proxy that is the proxy, and the client's address is in ``X-Forwarded-For``,
where each proxy appends the address it received the request from. Only the entries
the trusted proxies appended can be believed: everything left of them was written by
whoever sent the request. So the header is read from the right, one proxy at a time,
and only while the hop that wrote the entry is one of ``HOLDFAST_TRUSTED_PROXIES``.

Daphne's own ``--proxy-headers`` is not used for this: it takes the left-most entry,
which the client writes, and believes it from any peer.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

from django.conf import settings
from django.http import HttpRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def _networks(proxies: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(proxy, strict=False) for proxy in proxies)


def _address(text: str) -> IPAddress | None:
    """An address from a header entry: ``192.0.2.1``, ``192.0.2.1:443``, ``[2001:db8::1]:80``."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    # An IPv4 client seen through an IPv6 socket: record it as the IPv4 address it is.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def client_address(request: HttpRequest) -> str | None:
    """The client's address: the peer, or through trusted proxies the first hop none of them is.

    ``None`` when the request has no peer address at all (a request built in code).
    """
    peer = _address(request.META.get("REMOTE_ADDR") or "")
    if peer is None:
        return None
    trusted = _networks(tuple(settings.HOLDFAST_TRUSTED_PROXIES))

    def is_trusted(address: IPAddress) -> bool:
        return any(address in network for network in trusted)

    client = peer
    hops = request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
    for hop in reversed(hops):
        if not is_trusted(client):
            break
        # `client` is a trusted proxy: the entry it appended names whom it heard from.
        forwarded = _address(hop)
        if forwarded is None:
            # Garbage, or no header: the proxy is the nearest address anyone vouches for.
            break
        client = forwarded
    return str(client)
