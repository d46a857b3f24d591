"""This process's TCP connections as the kernel sees them: TCP_INFO and /proc/self/fd (Linux; elsewhere
nothing is found).

Below both front-end guards and the relay: http/granian_guard.py reads a listener's accept queue and its
connections' idle time to close stalled ones; relay/ingress_limits.py finds a client's connection under
granian and reads how many bytes its peer has acknowledged.
"""

from __future__ import annotations

import os
import socket
import struct

# Descriptors looked at per look (each suspect may be held, duplicated, for a moment).
MAX_LOOK = 16384

_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None)
_TCP_ESTABLISHED = 1
_TCP_CLOSE_WAIT = 8
# struct tcp_info: eight u8 fields, then u32s: tcpi_unacked (a listener's accept queue) is the
# fifth, tcpi_last_data_recv (ms) the twelfth.
_INFO_BYTES = 104
_UNACKED_AT = 8 + 4 * 4
_LAST_DATA_RECV_AT = 8 + 11 * 4
# ... and, past 26 u32s and two u64 pacing rates, tcpi_bytes_acked (u64, Linux 4.1 and later).
_BYTES_ACKED_AT = 8 + 24 * 4 + 2 * 8
_BYTES_ACKED_INFO = _BYTES_ACKED_AT + 8


def available() -> bool:
    """Whether this system tells a process about its connections (TCP_INFO and /proc/self/fd)."""
    return _TCP_INFO is not None and os.path.isdir("/proc/self/fd")


def accept_queue(listener: socket.socket) -> int:
    """Connections waiting in `listener`'s backlog to be accepted (0 where unknown)."""
    if _TCP_INFO is None:
        return 0
    try:
        info = listener.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _INFO_BYTES)
    except OSError:
        return 0
    return struct.unpack_from("I", info, _UNACKED_AT)[0]


def idle_ms(sock: socket.socket) -> int | None:
    """Milliseconds since `sock` last received data; None when it is not an established connection.
    Raises OSError where the kernel will not say."""
    info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO or 0, _INFO_BYTES)
    if info[0] != _TCP_ESTABLISHED:
        return None
    return struct.unpack_from("I", info, _LAST_DATA_RECV_AT)[0]


def connection(server: str, client: str) -> socket.socket | None:
    """A duplicate of this process's TCP connection from `client` to `server` (each "host:port" as RSGI names
    them): the caller closes it (granian's descriptor stays), or shuts it down to end the connection. None
    where it is not found (gone, or not Linux)."""
    if not available():
        return None
    want_host, _, want_port = client.rpartition(":")
    local_port = server.rpartition(":")[2]
    if not want_port.isdigit() or not local_port.isdigit():
        return None
    want = (_plain(want_host.strip("[]")), int(want_port))
    for name in socket_fds()[:MAX_LOOK]:
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM \
                    and sock.getsockname()[1] == int(local_port):
                host, port = sock.getpeername()[:2]
                if (_plain(host), port) == want:
                    return sock
        except OSError:
            pass
        sock.close()
    return None


def bytes_acked(sock: socket.socket) -> int | None:
    """The bytes the peer of `sock` has acknowledged (TCP_INFO's tcpi_bytes_acked); None once the connection
    can carry nothing more to it (this side shut or closed; a peer that only half-closed may still read)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO or 0, _BYTES_ACKED_INFO)
    except OSError:
        return None
    if len(info) < _BYTES_ACKED_INFO or info[0] not in (_TCP_ESTABLISHED, _TCP_CLOSE_WAIT):
        return None
    return struct.unpack_from("Q", info, _BYTES_ACKED_AT)[0]


def _plain(host: str) -> str:
    """An address as one spelling: an IPv4-mapped IPv6 address as its IPv4 address."""
    return host[7:] if host.startswith("::ffff:") and "." in host else host


def socket_fds() -> list[str]:
    """This process's descriptors that are sockets."""
    names = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                names.append(name)
        except OSError:
            continue
    return names


__all__ = ["MAX_LOOK", "accept_queue", "available", "bytes_acked", "connection", "idle_ms", "socket_fds"]
