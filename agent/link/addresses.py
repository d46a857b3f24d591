"""The address this worker advertises when ``--advertise-address`` is not given."""

import ipaddress
import socket
from urllib.parse import urlsplit


def local_address_towards(url: str) -> str | None:
    """This machine's address that a connection to ``url``'s host leaves from; None when it cannot be told.

    A UDP ``connect()`` picks the route and its source address without
    sending a packet. The answer is loopback only when the control plane
    itself is reached over loopback.
    """
    parts = urlsplit(url)
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError, ValueError):
        return None
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(sockaddr)
                address = probe.getsockname()[0].split("%", 1)[0]
        except OSError:
            continue
        if not ipaddress.ip_address(address).is_unspecified:
            return address
    return None
