"""Where an endpoint may point: not at the deployment's own network.

An endpoint's address is typed by a tenant's admin, and Holdfast posts to it from
inside the deployment: without this rule a tenant could make it post to a loopback
service, a private network or a cloud's metadata address. Unless
``HOLDFAST_WEBHOOK_ALLOW_PRIVATE`` is true (local development, tests against the
sandbox), an address whose host is, or resolves to, a loopback, private, link-local,
reserved, multicast or unspecified address is refused: when an endpoint is saved, and
again before every attempt (names can be pointed elsewhere later). A name that does
not resolve is not refused here; its attempt fails and is retried like any
unreachable endpoint.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings


def _internal(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
    )


def address_problem(url: str) -> str:
    """Why events may not be posted to ``url``, or "" when they may."""
    if settings.HOLDFAST_WEBHOOK_ALLOW_PRIVATE:
        return ""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError):
        return ""
    if any(_internal(info[4][0]) for info in found):
        return f"{host} is an address of a private or local network; events are not posted there"
    return ""
