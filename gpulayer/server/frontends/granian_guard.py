"""What cheroot's selector bounds and granian's Rust side does not: silent connections and a full house.

granian reads request heads and TLS handshakes on tokio, never on a Python
thread, each within a deadline (hyper's `header_read_timeout`; the TLS
listener's 10 s handshake timeout). Its one bound on connections is
`backpressure`: past it, new connections wait in the listen backlog until
one ends, so a flood of half-sent heads would delay every new client up to
the head deadline, where cheroot refuses the heads past its cap and serves
whole ones at once. Two guards, applied by granian_server.py:

- `defer_accept`: TCP_DEFER_ACCEPT on the listening socket. A connection that
  sends nothing is never handed to granian; the kernel drops it after the
  head deadline. Idle floods cost a request socket in the kernel, not a
  place under granian's bound;
- `Reaper`: a thread that reads the listener's accept queue (TCP_INFO) every
  `INTERVAL_S`. Once new connections have waited there `PRESSURE_S`, granian
  is at its bound: the reaper looks at granian's connections (this process's
  sockets on the port) and closes each one that is stalled, that is, not in a
  request (`busy`), with nothing left to send, and nothing received for
  `STALLED_S`, and still so `CONFIRM_S` later (a head that had just come is
  with the app by then). A half-sent head gets a 408 first (plain
  HTTP), a stalled handshake or idle keep-alive connection a close. The
  waiting clients then take their places. Half-sent heads past the bound are
  refused, whole ones served, as cheroot's `MAX_PENDING_HEADS` does; what
  differs is the delay (`PRESSURE_S` plus a look or two, where cheroot
  refuses at once).

Linux only (TCP_INFO, /proc/self/fd); elsewhere both are no-ops.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
import termios
import threading
import time
from typing import Callable

from gpulayer.server import tcpinfo

log = logging.getLogger("gpulayer.server.http.granian")  # the name its lines have always had

INTERVAL_S = 0.25
# New connections waiting this long in the backlog mean granian is at its bound.
PRESSURE_S = 0.5
# A connection not in a request that has received nothing this long is stalled.
STALLED_S = 0.5
# ... and still so this much later (a head just come is with the app by then).
CONFIRM_S = 0.05

_TCP_DEFER_ACCEPT = getattr(socket, "TCP_DEFER_ACCEPT", None)

_TIMEOUT_BODY = b'{"error": {"code": "request_timeout", "message": "the server is full and this request head stalled"}}'
_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


def defer_accept(listener: socket.socket, seconds: float) -> None:
    """Hand granian a connection only once it has sent something (Linux; else nothing)."""
    if _TCP_DEFER_ACCEPT is not None:
        listener.setsockopt(socket.IPPROTO_TCP, _TCP_DEFER_ACCEPT, max(1, int(seconds)))


class Reaper:
    """Closes granian's stalled connections while new ones wait past its bound (see the module's docstring).

    `busy(peer)`: whether the connection from `peer` ("host:port", as RSGI names
    a client) has a request in the app.
    """

    def __init__(self, listener: socket.socket, port: int, tls: bool, busy: Callable[[str], bool]):
        self._listener, self._port, self._tls, self._busy = listener, port, tls, busy
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned_at = 0.0
        self.reaped = 0

    def start(self) -> None:
        if not tcpinfo.available():
            return
        self._thread = threading.Thread(target=self._run, name="gpulayer-granian-reaper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        self._thread = None

    def _run(self) -> None:
        waiting_since: float | None = None
        closed = 0
        while not self._stop.wait(0 if closed else INTERVAL_S):  # closed some: the next ones at once
            closed = 0
            if tcpinfo.accept_queue(self._listener) == 0:
                waiting_since = None
                continue
            now = time.monotonic()
            if waiting_since is None:
                waiting_since = now
            if now - waiting_since >= PRESSURE_S:
                try:
                    closed = self.look()
                except Exception:  # never let the guard die of one odd descriptor
                    log.exception("http_reaper_failed")

    def look(self) -> int:
        """One look over granian's connections: close those stalled now and `CONFIRM_S` later; how many."""
        suspects: list[socket.socket] = []
        for name in tcpinfo.socket_fds()[:tcpinfo.MAX_LOOK]:
            try:
                sock = socket.socket(fileno=os.dup(int(name)))  # a dup: closing it leaves granian's descriptor
            except OSError:
                continue  # closed meanwhile, or out of descriptors (the shed path's case)
            try:
                stalled = self._stalled(sock)
            except OSError:
                stalled = False
            if stalled:
                suspects.append(sock)
            else:
                sock.close()
        closed = 0
        if suspects:
            time.sleep(CONFIRM_S)  # a head that had just come is with the app by now
        for sock in suspects:
            with sock:
                try:
                    if self._stalled(sock):
                        self._close(sock)
                        closed += 1
                except OSError:
                    continue
        if closed:
            self.reaped += closed
            now = time.monotonic()
            if now - self._warned_at > 10:
                self._warned_at = now
                log.warning("http_full: closed %d stalled connections (half-sent heads, idle keep-alive) "
                            "for the ones waiting server=granian", closed)
        return closed

    def _stalled(self, sock: socket.socket) -> bool:
        """Whether `sock` is one of granian's connections, stalled."""
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return False
        if sock.getsockname()[1] != self._port:
            return False
        try:
            host, port = sock.getpeername()[:2]
        except OSError:
            return False  # the listener
        idle = tcpinfo.idle_ms(sock)
        if idle is None or idle < STALLED_S * 1000:
            return False
        if struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]:
            return False  # an answer still going out
        return not (self._busy(f"{host}:{port}") or self._busy(f"[{host}]:{port}"))

    def _close(self, sock: socket.socket) -> None:
        """Shut `sock` down under granian (which then drops it); a 408 first on plain HTTP."""
        if not self._tls:
            try:
                sock.send(_TIMEOUT, socket.MSG_DONTWAIT)  # never setblocking: the flag is shared with tokio
            except OSError:
                pass
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


__all__ = ["Reaper", "defer_accept"]
