"""A connection's way to a worker thread: TLS handshake, request head and small body read off the threads.

`Connection.gate` is one non-blocking step, taken by the selector thread each
time bytes arrive (cheroot_server.py's `_Server.process_conn` decides what follows):
the TLS handshake, then the head, then a small body (bodies.BUFFERED_BODY_BYTES)
with it; its framing is checked on the head (`_framing`). A larger or chunked
body is read later by the worker thread through `_PacedSocketIO`, at the
minimum rate of its `bodies.Pace`. `LazyTLSAdapter` wraps an accepted socket
without a handshake, so the accept loop never waits on a client.
"""

from __future__ import annotations

import logging
import socket
import ssl

from cheroot import errors as cheroot_errors, server as cheroot_server
from cheroot.makefile import MakeFile, StreamReader, StreamWriter
from cheroot.ssl import Adapter

from gpulayer.server.errors import BodyIncomplete
from gpulayer.server.frontends import bodies

# The server's logger: an operator filters on one name, whichever module of the HTTP server speaks.
log = logging.getLogger("gpulayer.server.http.server")  # the name its lines have always had

_READ_STEP = 64 * 1024

_PLAIN_HTTP_MSG = b"This port speaks HTTPS; use an https:// URL.\n"
_PLAIN_HTTP_ON_TLS = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_PLAIN_HTTP_MSG), _PLAIN_HTTP_MSG)
)


class LazyTLSAdapter(Adapter):
    """cheroot TLS adapter whose wrap() does no handshake; Connection does it in a worker."""

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
        try:
            tls_sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except OSError as exc:  # reset before it was wrapped: cheroot logs this one (at debug) and drops it
            sock.close()
            raise cheroot_errors.FatalSSLAlert(str(exc)) from None
        tls_sock.settimeout(self.timeout_s)
        return tls_sock, self.get_environ(tls_sock)

    def get_environ(self, sock=None):
        """The environ entries known before the handshake; Connection adds the rest after it."""
        return {"wsgi.url_scheme": "https", "HTTPS": "on"}

    def makefile(self, sock, mode="r", bufsize=-1):
        """Return a buffered reader or writer over the TLS socket."""
        return (StreamReader if "r" in mode else StreamWriter)(sock, mode, bufsize)


class _PacedSocketIO(socket.SocketIO):
    """The socket under a connection's reader: while a streamed body is read, each read waits only as long
    as the body's minimum rate allows (`bodies.Pace`), then raises BodyTooSlow."""

    def __init__(self, conn: Connection, sock):
        super().__init__(sock, "rb")
        self._conn = conn
        self._raw = sock

    def readinto(self, b):
        pace = self._conn.pace
        if pace is None:
            return super().readinto(b)
        left = pace.seconds_left()
        if left <= 0:
            raise pace.too_slow()
        self._raw.settimeout(min(left, self._conn.server.timeout))
        try:
            n = super().readinto(b)
        except TimeoutError:
            if pace.seconds_left() <= 0:
                raise pace.too_slow() from None
            raise
        if not n:
            raise BodyIncomplete("the connection closed before the request body ended")
        pace.received += n
        return n


class _PacedReader(StreamReader):
    """cheroot's socket reader over a _PacedSocketIO."""

    def __init__(self, conn: Connection, sock, bufsize):
        super().__init__(sock, "rb", bufsize)
        self._raw = _PacedSocketIO(conn, sock)  # _pyio's BufferedReader reads through _raw


class _Request(cheroot_server.HTTPRequest):
    """cheroot's request, which closes its connection after a body that fell behind its minimum rate."""

    def send_headers(self):
        """Close (rather than drain the rest of the body) when the body was too slow."""
        if self.conn.pace is not None and self.conn.pace.expired:
            self.close_connection = True
        super().send_headers()


class Connection(cheroot_server.HTTPConnection):
    """An HTTPConnection that reaches a worker thread only with a whole request head buffered, and its body
    too when that is small (bodies.BUFFERED_BODY_BYTES); a larger one streams under a `bodies.Pace`."""

    RequestHandlerClass = _Request
    handshaken: bool | None = False    # None while the TLS handshake waits for more bytes
    refusal = ""                       # why the request's framing is refused
    head_started: float | None = None  # monotonic time of the current head's first step
    pace: bodies.Pace | None = None     # the minimum rate of a body a worker thread is reading
    _wanted: int | None = None          # the bytes of head and buffered body, once the head is known

    def __init__(self, server, sock, makefile=None):
        super().__init__(server, sock, makefile or MakeFile)
        self.rfile = _PacedReader(self, sock, self.rbufsize)

    def gate(self, max_head: int) -> str:
        """One non-blocking step of handshake, head and small body: "ready", "stream", "wait" or "drop"."""
        self.socket.settimeout(0)
        try:
            if isinstance(self.socket, ssl.SSLSocket) and not self.handshaken and not self._handshake():
                return "wait" if self.handshaken is None else "drop"
            return self._read_request(max_head)
        finally:
            if self.socket.fileno() != -1:
                self.socket.settimeout(self.server.timeout)

    def _read_request(self, max_head: int) -> str:
        data = bytearray(self.rfile._read_buf[self.rfile._read_pos:])  # a pipelined request's start, if any
        state = self._buffered(data, max_head)
        while state == "wait":
            try:
                chunk = self.socket.recv(_READ_STEP)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except (OSError, ValueError) as exc:
                self._drop("http_head_failed", exc)
                return "drop"
            if not chunk:
                return "drop"  # the client went away
            data += chunk
            state = self._buffered(data, max_head)
        # Hand what arrived to the reader the worker thread parses from (a pure-Python BufferedReader).
        self.rfile._read_buf, self.rfile._read_pos = bytes(data), 0
        if state != "wait":
            self._wanted = None
        return state

    def _buffered(self, data: bytearray, max_head: int) -> str:
        """What the bytes so far make: "wait" for more, "ready", "stream" (a big body), "refuse" (framing)."""
        if self._wanted is None:
            end = _head_end(data)
            if end is None:
                return "ready" if len(data) > max_head else "wait"  # an oversized head: cheroot answers 431
            if end > max_head:
                return "ready"
            framing = _framing(bytes(data[:end]))
            if isinstance(framing, str):
                self.refusal = framing
                return "refuse"
            if framing is None:
                return "stream"
            self._wanted = end + framing
        return "ready" if len(data) >= self._wanted else "wait"

    def communicate(self):
        """Serve one request; a streamed body's slot is freed after it."""
        try:
            return super().communicate()
        finally:
            self._end_stream()

    def _end_stream(self) -> None:
        if self.pace is not None:
            self.pace = None
            self.server.end_stream()

    def _handshake(self) -> bool:
        """One handshake step; False with handshaken None while it needs more bytes."""
        try:
            self.socket.do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            self.handshaken = None
            return False
        except ssl.SSLError as exc:
            if exc.reason == "HTTP_REQUEST":
                self._answer_plain_http()
            self._drop("tls_handshake_failed", exc)
            self.handshaken = False
            return False
        except (OSError, ValueError) as exc:  # reset, EOF, closed under us
            self._drop("tls_handshake_failed", exc)
            self.handshaken = False
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

    def answer(self, response: bytes) -> None:
        """Write a short response without blocking (the selector's thread): what fits, or nothing."""
        self.socket.settimeout(0)
        try:
            self.socket.send(response)
        except (OSError, ValueError):
            pass

    def close(self):
        """Close the socket; a head in progress, or a streamed body, no longer counts against its cap.

        Closed with its head in and its (small) body still arriving, it was too slow: 408 first.
        """
        self.server.pending_heads.discard(self)
        if self._wanted is not None and self.socket.fileno() != -1:
            self._wanted = None
            self.answer(bodies.error_response(
                "408 Request Timeout", "request_timeout",
                f"the request body did not arrive within {self.server.head_timeout_s:g} s of its head's start"))
        self._end_stream()
        super().close()


def _head_end(data: bytes | bytearray) -> int | None:
    """Where the head's blank line ends, or None while it has not arrived."""
    ends = [i + len(mark) for mark in (b"\r\n\r\n", b"\n\n") if (i := data.find(mark)) != -1]
    return min(ends) if ends else None


def _framing(head: bytes) -> int | str | None:
    """The length of a body to buffer with this head (0: none); None to stream it; a str: why it is refused."""
    fields: list[tuple[str, str]] = []
    for line in head.split(b"\n")[1:]:
        line = line.rstrip(b"\r")
        if line[:1] in (b" ", b"\t") and fields:  # an obsolete line folding: part of the previous value
            fields[-1] = (fields[-1][0], fields[-1][1] + " " + line.strip().decode("latin-1"))
        elif b":" in line:
            name, _, value = line.partition(b":")
            fields.append((name.decode("latin-1"), value.decode("latin-1")))
    refused = bodies.framing_error(fields)
    if refused is not None:
        return refused
    named = {name.strip().lower(): value.strip().lower() for name, value in fields}
    if "transfer-encoding" in named or named.get("expect") == "100-continue":
        return None  # chunked, or a client that waits to be told to send: a thread reads it
    length = int(named.get("content-length", "0"))
    return length if length <= bodies.BUFFERED_BODY_BYTES else None

