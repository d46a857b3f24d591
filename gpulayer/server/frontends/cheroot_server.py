"""Serve a WSGI app with cheroot, over plain HTTP or TLS, without head-of-line stalls.

cheroot's stock TLS adapter does the handshake inside its accept loop, so one
client that connects and says nothing stalls every other client. Here:

- the adapter wraps the socket without a handshake (cheroot_connections.py's `LazyTLSAdapter`);
- a connection waits in cheroot's selector, holding no thread, until it has
  sent a whole request head: the selector thread does the TLS handshake and
  reads the head without blocking, a step each time bytes arrive
  (`_Server.process_conn`, cheroot_connections.py's `Connection.gate`). Only then does a worker
  thread take it, with the head already buffered. So clients that send
  slowly (slowloris: a header line every few seconds, or a ClientHello in
  pieces) never hold the threads that serve heartbeats;
- a head (and its handshake) must be complete within `head_timeout_s` of its
  first byte, in total, or the connection is closed; at most
  `MAX_PENDING_HEADS` connections may be part-way through one; a client that
  never sends is closed after `request_timeout_s` by cheroot's expiry;
- the body comes next (bodies.py): framing is checked in the selector (400
  and a close for an ambiguous length); a small body is read there too,
  within the same deadline as its head (408 past it), so a worker thread
  takes the connection with head and body buffered; a larger or chunked
  body is read by the thread through `_PacedSocketIO`, at a minimum rate
  (408 and a close past it), and at most `bodies.streamed_cap(threads)`
  connections do that at once (503 past it): heartbeats always find a thread;
- a failed handshake is dropped quietly (debug log line, no traceback).
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import sys
import threading
import time
from typing import Any

from cheroot import wsgi

from gpulayer.server.errors import peer_gone
from gpulayer.server.frontends import bodies
from gpulayer.server.frontends.cheroot_connections import Connection, LazyTLSAdapter

log = logging.getLogger("gpulayer.server.http.server")  # the name its lines have always had

LISTEN_BACKLOG = 128
# Idle keep-alive (and not-yet-spoken) connections held in the selector per
# worker thread; they cost a file descriptor each, not a thread.
KEEPALIVE_PER_THREAD = 16
# How often cheroot closes connections idle longer than request_timeout_s.
EXPIRY_INTERVAL_S = 0.25
# A request head (and TLS handshake) must be complete this long after its first byte.
HEAD_TIMEOUT_S = 10.0
# Connections part-way through a head at once; past it, new ones are closed. Each costs
# a file descriptor and up to max_header_bytes of buffer, never a thread.
MAX_PENDING_HEADS = 2048
# Out of file descriptors, accept() fails while the connection waits in the backlog:
# a spare descriptor, released for the moment, lets the server take it and refuse it.
_FD_EXHAUSTED = (errno.EMFILE, errno.ENFILE)
_OVERLOADED_BODY = (b'{"error": {"code": "overloaded", "message": "the control plane is out of file '
                    b'descriptors; try again"}}')
_OVERLOADED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_OVERLOADED_BODY), _OVERLOADED_BODY)
)


class HTTPServer:
    """A cheroot WSGI server, plain HTTP or (with certfile and keyfile) TLS 1.2+.

    `threads` bounds the requests served at once: each request in progress
    (a long-poll included) holds one thread; idle keep-alive connections do
    not, and neither do clients still sending a request head (see the
    module's docstring). `request_timeout_s` is the socket timeout for every
    read and write once a request is in a thread, and the idle limit of a
    keep-alive connection; `head_timeout_s` bounds the whole head (and TLS
    handshake) from its first byte, and a small body with it. Headers beyond
    `max_header_bytes` are refused; body sizes are bounded by the app. No access log; cheroot's errors go to the
    "gpulayer.server.http.server" logger.
    """

    def __init__(
        self,
        app,
        host: str,
        port: int,
        *,
        certfile: str | None = None,
        keyfile: str | None = None,
        threads: int = 64,
        request_timeout_s: float = 30.0,
        max_header_bytes: int = 64 * 1024,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        max_pending_heads: int = MAX_PENDING_HEADS,
    ):
        if (certfile is None) != (keyfile is None):
            raise ValueError("TLS needs both certfile and keyfile")
        srv = _Server(
            (host, port),
            app,
            numthreads=threads,
            max=threads,
            server_name="gpulayer",
            request_queue_size=LISTEN_BACKLOG,
            timeout=request_timeout_s,
        )
        srv.max_request_header_size = max_header_bytes
        srv.head_timeout_s = min(head_timeout_s, request_timeout_s)
        srv.max_pending_heads = max_pending_heads
        srv.max_streams = bodies.streamed_cap(threads)
        srv.max_request_body_size = 0
        srv.keep_alive_conn_limit = threads * KEEPALIVE_PER_THREAD
        srv.expiration_interval = min(EXPIRY_INTERVAL_S, request_timeout_s)
        if certfile is not None:
            srv.ssl_adapter = LazyTLSAdapter(certfile, keyfile, timeout_s=request_timeout_s)
        self._server = srv
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port once started (a free one when constructed with port=0)."""
        return self._server.bind_addr[1]

    @property
    def scheme(self) -> str:
        """"https" when serving TLS, else "http"."""
        return "http" if self._server.ssl_adapter is None else "https"

    def start(self) -> None:
        """Bind and serve in a background thread; return once listening.

        Raises OSError when the address cannot be bound.
        """
        self._server.prepare()
        self._thread = threading.Thread(target=self._server.serve, name="gpulayer-http", daemon=True)
        self._thread.start()
        log.info("http_listening scheme=%s port=%d", self.scheme, self.port)

    def serve_forever(self) -> None:
        """Bind and serve in the calling thread until stop() is called from another one.

        Stops the server on the way out (KeyboardInterrupt included).
        """
        self._server.prepare()
        log.info("http_listening scheme=%s port=%d", self.scheme, self.port)
        try:
            self._server.serve()
        finally:
            self._server.stop()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close idle connections, let in-flight requests finish.

        Requests still running after `timeout` seconds have their sockets shut
        down. Safe to call twice or before start().
        """
        self._server.shutdown_timeout = timeout
        self._server.stop()
        if self._server._spare_fd is not None:
            os.close(self._server._spare_fd)
            self._server._spare_fd = None
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        log.info("http_stopped port=%d", self.port)


class _Server(wsgi.Server):
    """cheroot's WSGI server that hands a worker only whole request heads; logging through `log`."""

    ConnectionClass = Connection
    head_timeout_s = HEAD_TIMEOUT_S
    max_pending_heads = MAX_PENDING_HEADS
    max_streams = 1  # requests reading a streamed body at once: bodies.streamed_cap(threads)
    _connections: Any  # cheroot's ConnectionManager, made by its prepare(): private, so its stubs leave it out

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pending_heads: set[Connection] = set()
        self._streams = 0
        self._streams_lock = threading.Lock()
        self._spare_fd: int | None = None
        self._fd_warned_at = 0.0

    def prepare(self):
        """cheroot's prepare, then an accept that sheds load when file descriptors run out."""
        super().prepare()
        self._spare_fd = os.open(os.devnull, os.O_RDONLY)
        accept = self._connections._from_server_socket

        def accept_or_shed(server_socket):
            try:
                return accept(server_socket)
            except OSError as exc:
                if exc.errno not in _FD_EXHAUSTED:
                    raise
                self._shed(server_socket)
                return None

        self._connections._from_server_socket = accept_or_shed

    def _shed(self, server_socket) -> None:
        """Out of descriptors: take one waiting connection with the spare, answer 503, close it.

        Without this cheroot retries accept() at once, for ever: one core spins,
        the log fills, and the waiting clients hang until their own timeout.
        """
        now = time.monotonic()
        if now - self._fd_warned_at > 10:
            self._fd_warned_at = now
            log.warning("http_fd_exhausted: refusing new connections with 503 until descriptors are free "
                        "(raise the limit: LimitNOFILE / ulimit -n)")
        if self._spare_fd is None:
            time.sleep(0.05)
            return
        os.close(self._spare_fd)
        self._spare_fd = None
        try:
            sock, _addr = server_socket.accept()
        except OSError:
            time.sleep(0.05)  # taken by another, or still none: let descriptors free up
        else:
            with sock:
                if self.ssl_adapter is None:
                    sock.setblocking(False)
                    try:
                        sock.send(_OVERLOADED)
                    except OSError:
                        pass
        finally:
            try:
                self._spare_fd = os.open(os.devnull, os.O_RDONLY)
            except OSError:
                self._spare_fd = None

    def process_conn(self, conn):
        """Read the head (and handshake) in the calling thread, never blocking; queue it once whole.

        Called by the selector thread for a new or readable connection (and by a
        worker that puts back a keep-alive connection with bytes buffered).
        cheroot otherwise gives every connection to a worker at once, so slow or
        silent clients could occupy every thread.
        """
        fresh = conn.head_started is None
        if fresh:
            conn.head_started = time.monotonic()
        state = conn.gate(self.max_request_header_size)
        if state == "refuse":
            log.debug("http_framing_refused peer=%s error=%s", conn.remote_addr, conn.refusal)
            self._refuse(conn, "400 Bad Request", "invalid_framing",
                         f"the request's length is ambiguous: {conn.refusal} (RFC 9112, section 6.3)")
            return
        if state == "stream":
            if not self._start_stream():
                log.debug("http_stream_refused peer=%s streams=%d", conn.remote_addr, self._streams)
                self._refuse(conn, "503 Service Unavailable", "unavailable", bodies.STREAMS_FULL,
                             (b"Retry-After: 1",))
                return
            conn.pace = bodies.Pace()
            state = "ready"
        if state == "ready":
            conn.head_started = None
            self.pending_heads.discard(conn)
            super().process_conn(conn)
            return
        if state == "drop" or time.monotonic() - conn.head_started > self.head_timeout_s:
            conn.close()
            return
        if conn not in self.pending_heads and (conn.rfile.has_data() or conn.handshaken is None):
            if len(self.pending_heads) >= self.max_pending_heads:
                log.debug("http_head_refused peer=%s pending=%d", conn.remote_addr, len(self.pending_heads))
                conn.close()
                return
            self.pending_heads.add(conn)
        if not conn.rfile.has_data() and conn.handshaken is not None:
            conn.head_started = None  # nothing sent yet: an idle connection, expired as such
        self._park(conn)

    def _refuse(self, conn, status: str, code: str, message: str, extra: tuple[bytes, ...] = ()) -> None:
        conn.answer(bodies.error_response(status, code, message, extra))
        conn.close()

    def _start_stream(self) -> bool:
        """Take a slot for a streamed body; False when `max_streams` are taken."""
        with self._streams_lock:
            if self._streams >= self.max_streams:
                return False
            self._streams += 1
            return True

    def end_stream(self) -> None:
        """Free a streamed body's slot."""
        with self._streams_lock:
            self._streams -= 1

    def _park(self, conn) -> None:
        """Back to the selector until more bytes arrive; cheroot's expiry closes it at its deadline."""
        self._connections._selector.register(  # type: ignore[attr-defined]  # cheroot internals, not in its stubs
            conn.socket.fileno(), selectors.EVENT_READ, data=conn)
        if conn.head_started is None:
            conn.last_used = time.time()
        else:  # expire at head_started + head_timeout_s, whatever arrives meanwhile
            left = self.head_timeout_s - (time.monotonic() - conn.head_started)
            conn.last_used = time.time() + left - self.timeout

    def error_log(self, msg="", level=logging.INFO, traceback=False):
        """Route cheroot's messages to logging: warnings and errors as such, the rest at debug.

        A peer that closed or reset its connection is one debug line, never a traceback.
        """
        failure = sys.exc_info()[1] if traceback else None
        if peer_gone(failure):
            log.debug("http_peer_gone error=%r", failure)
        elif level >= logging.WARNING:
            log.log(level, "http_error %s", msg, exc_info=traceback)
        else:
            log.debug("http_notice %s", msg)


__all__ = ["HTTPServer"]
