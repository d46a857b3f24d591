"""Serve a WSGI app with cheroot, over plain HTTP or TLS, without head-of-line stalls.

cheroot's stock TLS adapter does the handshake inside its accept loop, so one
client that connects and says nothing stalls every other client. Here:

- the adapter wraps the socket without a handshake (`_LazyTLSAdapter`);
- a new connection first waits in cheroot's selector, holding no thread,
  until the client sends its first bytes (`_Server.process_conn`); a client
  that never sends is closed after `request_timeout_s` by cheroot's expiry;
- a worker thread then does the handshake (`_Connection.communicate`) and
  drops a failed one quietly (debug log line, no traceback).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading

from cheroot import server as cheroot_server, wsgi
from cheroot.makefile import StreamReader, StreamWriter
from cheroot.ssl import Adapter

log = logging.getLogger("gpulayer.httpserver")

LISTEN_BACKLOG = 128
# Idle keep-alive (and not-yet-spoken) connections held in the selector per
# worker thread; they cost a file descriptor each, not a thread.
KEEPALIVE_PER_THREAD = 16
# How often cheroot closes connections idle longer than request_timeout_s.
EXPIRY_INTERVAL_S = 0.25

_PLAIN_HTTP_MSG = b"This port speaks HTTPS; use an https:// URL.\n"
_PLAIN_HTTP_ON_TLS = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_PLAIN_HTTP_MSG), _PLAIN_HTTP_MSG)
)


class HTTPServer:
    """A cheroot WSGI server, plain HTTP or (with certfile and keyfile) TLS 1.2+.

    `threads` bounds the requests served at once: each request in progress
    (a long-poll included) holds one thread; idle keep-alive connections do
    not. `request_timeout_s` is the socket timeout for every read and write
    and the idle limit of a keep-alive connection. Headers beyond
    `max_header_bytes` are refused; bodies are not bounded here (the app
    bounds them). No access log; cheroot's errors go to the
    "gpulayer.httpserver" logger.
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
        srv.max_request_body_size = 0
        srv.keep_alive_conn_limit = threads * KEEPALIVE_PER_THREAD
        srv.expiration_interval = min(EXPIRY_INTERVAL_S, request_timeout_s)
        if certfile is not None:
            srv.ssl_adapter = _LazyTLSAdapter(certfile, keyfile, timeout_s=request_timeout_s)
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
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        log.info("http_stopped port=%d", self.port)


class _LazyTLSAdapter(Adapter):
    """cheroot TLS adapter whose wrap() does no handshake; _Connection does it in a worker."""

    def __init__(self, certificate, private_key, *, timeout_s: float):
        super().__init__(certificate, private_key)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(certificate, private_key)
        self.context = ctx
        self.timeout_s = timeout_s

    def bind(self, sock):
        """Return the listening socket unchanged."""
        return sock

    def wrap(self, sock):
        """Wrap the accepted socket for TLS without reading from it; return (socket, environ)."""
        tls_sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        tls_sock.settimeout(self.timeout_s)
        return tls_sock, self.get_environ(tls_sock)

    def get_environ(self, sock=None):
        """The environ entries known before the handshake; _Connection adds the rest after it."""
        return {"wsgi.url_scheme": "https", "HTTPS": "on"}

    def makefile(self, sock, mode="r", bufsize=-1):
        """Return a buffered reader or writer over the TLS socket."""
        return (StreamReader if "r" in mode else StreamWriter)(sock, mode, bufsize)


class _Connection(cheroot_server.HTTPConnection):
    """An HTTPConnection that finishes the TLS handshake in its worker thread, once."""

    spoke = False  # set when the client's first bytes arrived; see _Server.process_conn
    handshaken = False

    def communicate(self):
        """Handshake on first use (TLS only), then serve one request; True keeps the connection."""
        if isinstance(self.socket, ssl.SSLSocket) and not self.handshaken:
            if not self._handshake():
                return False
        return super().communicate()

    def _handshake(self) -> bool:
        try:
            self.socket.do_handshake()
        except ssl.SSLError as exc:
            if exc.reason == "HTTP_REQUEST":
                self._answer_plain_http()
            self._drop("tls_handshake_failed", exc)
            return False
        except (OSError, ValueError) as exc:  # reset, timeout, EOF, closed under us
            self._drop("tls_handshake_failed", exc)
            return False
        self.handshaken = True
        name, version, bits = self.socket.cipher()
        self.ssl_env = {**self.ssl_env, "SSL_PROTOCOL": version, "SSL_CIPHER": name,
                        "SSL_CIPHER_USEKEYSIZE": bits}
        return True

    def _answer_plain_http(self) -> None:
        # SSLSocket.sendall would encrypt; the base socket method writes the raw bytes.
        try:
            socket.socket.sendall(self.socket, _PLAIN_HTTP_ON_TLS)
        except OSError:
            pass

    def _drop(self, event: str, exc: BaseException) -> None:
        log.debug("%s peer=%s:%s error=%s", event, self.remote_addr, self.remote_port, exc)


class _Server(wsgi.Server):
    """cheroot's WSGI server with parked new connections and logging through `log`."""

    ConnectionClass = _Connection

    def process_conn(self, conn):
        """Park a brand-new connection in the selector; hand it to a worker once it has spoken.

        cheroot otherwise gives every accepted connection to a worker at once,
        so silent clients could occupy every thread until they time out.
        """
        if not conn.spoke:
            conn.spoke = True
            self._connections.put(conn)  # calls back here at once if bytes are already buffered
            return
        super().process_conn(conn)

    def error_log(self, msg="", level=logging.INFO, traceback=False):
        """Route cheroot's messages to logging: warnings and errors as such, the rest at debug."""
        if level >= logging.WARNING:
            log.log(level, "http_error %s", msg, exc_info=traceback)
        else:
            log.debug("http_notice %s", msg)


__all__ = ["HTTPServer"]
