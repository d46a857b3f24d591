"""A WebSocket client over a blocking socket, for the relay's links (the agent's, the client's): RFC 6455's
client side, no extensions, binary messages, from threads.

Why not `websockets.sync`: it holds one lock while it writes to the socket and needs the same lock to take in
what it read, so a link that sends and receives at once (a port-forward both ways) reads nothing while a send
waits on the socket, and every message read crosses two threads (its reader's, then the caller's). Here the
one thread that calls `recv()` reads the socket itself, a frame's payload straight into its buffer
(`recv_into`), and `send()` (any thread, one at a time) only writes: reading and writing go on at once. The
handshake, close and keepalive follow what websockets does: a PING when nothing came for `ping_interval`,
the connection dropped when still nothing came `ping_timeout` later; a CLOSE answered, and the socket shut
`close_timeout` after ours if the other end does not answer. Masking uses websockets' C helper.

Errors: `Refused` (an HTTP answer other than 101: `.response.status_code`, `.headers`, `.body`), `BadHandshake`
(an answer that is not a WebSocket's), `EOFError` / `ConnectionResetError` / `TimeoutError` (no answer at all),
`ConnectionClosed` (from `recv()` and `send()` once the connection is over: `.rcvd` is the other end's close
code and reason when it sent one).
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import struct
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets without its C extension
    from websockets.utils import apply_mask

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
HEAD_LIMIT = 64 * 1024
BODY_LIMIT = 1024 * 1024
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
NORMAL, PROTOCOL_ERROR, TOO_BIG = 1000, 1002, 1009
#: What a close frame without a status code reads as (RFC 6455 7.1.5): granian's, for one, after an accepted upgrade.
NO_STATUS = 1005
SHORT, MEDIUM = struct.Struct("!BB"), struct.Struct("!BBH")
LONG = struct.Struct("!BBQ")


@dataclass
class Response:
    """The HTTP answer to a handshake."""

    status_code: int
    reason: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass
class Close:
    """A close frame's code and reason."""

    code: int
    reason: str = ""


class BadHandshake(Exception):
    """The server answered, but not as a WebSocket server."""


class Refused(BadHandshake):
    """The server answered the handshake with an HTTP status other than 101."""

    def __init__(self, response: Response):
        self.response = response
        super().__init__(f"server rejected WebSocket connection: HTTP {response.status_code}")


class ConnectionClosed(ConnectionError):
    """The connection is over; `rcvd`: the other end's close frame, when it sent one."""

    def __init__(self, why: str, rcvd: Close | None = None):
        self.rcvd = rcvd
        super().__init__(why)


@dataclass
class _Partial:
    opcode: int = 0
    parts: list[bytes] = field(default_factory=list)
    size: int = 0


class WebSocket:
    """A connected client WebSocket: one thread calls `recv()`, any thread `send()`; `close()` from any."""

    def __init__(self, sock: socket.socket, buffered: bytes = b"", *, max_size: int = 1 << 20, ping_interval: float | None = 20.0,
                 ping_timeout: float = 20.0, close_timeout: float = 2.0):
        self.sock = sock
        self.buf = bytearray(buffered)
        self.max_size = max_size
        self.ping_timeout, self.close_timeout = ping_timeout, close_timeout
        self.send_lock = threading.Lock()
        self.closing = False  # our CLOSE went
        self.closed = threading.Event()  # the socket is shut
        self.error: ConnectionClosed | None = None
        self.last_read = time.monotonic()
        if ping_interval:
            threading.Thread(target=self._keepalive, args=(ping_interval,), name="relay-keepalive", daemon=True).start()

    def __enter__(self) -> WebSocket:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # reading (one thread)

    def recv(self, timeout: float | None = None) -> bytes | str:
        """The next message: bytes (binary) or str (text). ConnectionClosed when the connection is over;
        TimeoutError when `timeout` passes first (only between messages: use it where nothing else reads)."""
        if timeout is not None:
            self.sock.settimeout(timeout)
        try:
            return self._message()
        finally:
            if timeout is not None and not self.closed.is_set():
                self.sock.settimeout(None)

    def _message(self) -> bytes | str:
        partial = _Partial()
        while True:
            fin, opcode, payload = self._frame()
            if opcode >= CLOSE:
                self._control(opcode, payload)
                continue
            if opcode == CONTINUATION:
                if not partial.parts:
                    self._fail(PROTOCOL_ERROR, "a continuation frame with no message to continue")
            elif partial.parts:
                self._fail(PROTOCOL_ERROR, "a new message before the last one ended")
            else:
                partial.opcode = opcode
            partial.parts.append(payload)
            partial.size += len(payload)
            if partial.size > self.max_size:
                self._fail(TOO_BIG, f"a message over {self.max_size} bytes")
            if fin:
                data = partial.parts[0] if len(partial.parts) == 1 else b"".join(partial.parts)
                if partial.opcode == TEXT:
                    try:
                        return bytes(data).decode()
                    except UnicodeDecodeError:
                        self._fail(1007, "a text message that is not UTF-8")
                return data

    def _frame(self) -> tuple[bool, int, bytes]:
        first, second = self._exact(2)
        fin, opcode, size = bool(first & 0x80), first & 0x0F, second & 0x7F
        if first & 0x70:
            self._fail(PROTOCOL_ERROR, "reserved bits set (no extension was agreed)")
        if second & 0x80:
            self._fail(PROTOCOL_ERROR, "a masked frame from the server")
        if opcode not in (CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG):
            self._fail(PROTOCOL_ERROR, f"unknown opcode {opcode}")
        if size == 126:
            size = struct.unpack("!H", self._exact(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", self._exact(8))[0]
        if opcode >= CLOSE and (size > 125 or not fin):
            self._fail(PROTOCOL_ERROR, "a control frame over 125 bytes or fragmented")
        if size > self.max_size:
            self._fail(TOO_BIG, f"a frame over {self.max_size} bytes")
        payload = self._exact(size)
        self.last_read = time.monotonic()
        return fin, opcode, payload

    def _exact(self, size: int) -> bytes:
        """`size` bytes off the connection: what the buffer holds first, the rest read straight into place."""
        have = len(self.buf)
        if have >= size:
            out = bytes(self.buf[:size])
            del self.buf[:size]
            return out
        if size <= 4096:  # a header or a small frame: fill the buffer
            while len(self.buf) < size:
                self._read_more()
            return self._exact(size)
        into = bytearray(size)
        view = memoryview(into)
        view[:have] = self.buf
        self.buf.clear()
        while have < size:
            try:
                got = self.sock.recv_into(view[have:])
            except OSError as exc:
                raise self._lost(exc) from None
            if not got:
                raise self._lost(None)
            have += got
        return into  # type: ignore[return-value]  # a bytearray: bytes-like, and not copied once more

    def _read_more(self) -> None:
        try:
            data = self.sock.recv(65536)
        except OSError as exc:
            raise self._lost(exc) from None
        if not data:
            raise self._lost(None)
        self.buf += data

    def _control(self, opcode: int, payload: bytes) -> None:
        if opcode == PING:
            self._send_frame(PONG, payload, quiet=True)
        elif opcode == CLOSE:
            rcvd = Close(NO_STATUS if len(payload) < 2 else struct.unpack("!H", payload[:2])[0], bytes(payload[2:]).decode(errors="replace"))
            if not self.closing:  # answer it
                self.closing = True
                self._send_frame(CLOSE, payload[:2], quiet=True)
            self._shut()
            self.error = ConnectionClosed(f"received {rcvd.code} ({rcvd.reason})", rcvd)
            raise self.error

    def _lost(self, exc: OSError | None) -> ConnectionClosed:
        if self.error is None:
            why = "the connection was closed" if exc is None or self.closed.is_set() else f"the connection failed: {exc}"
            self.error = ConnectionClosed(why)
        self._shut()
        return self.error

    def _fail(self, code: int, why: str):
        """The other end broke the protocol: tell it (a CLOSE with `code`), shut the connection, raise."""
        if not self.closing:
            self.closing = True
            self._send_frame(CLOSE, struct.pack("!H", code) + why.encode()[:120], quiet=True)
        self._shut()
        self.error = ConnectionClosed(f"protocol error: {why}")
        raise self.error

    # writing (any thread)

    def send(self, data: bytes | bytearray | memoryview | str) -> None:
        """Send one message (str: text, else binary); ConnectionClosed once the connection is over."""
        if isinstance(data, str):
            self._send_frame(TEXT, data.encode())
        else:
            self._send_frame(BINARY, data)

    def _send_frame(self, opcode: int, payload, *, quiet: bool = False) -> None:
        size = len(payload)
        if size < 126:
            head = SHORT.pack(0x80 | opcode, 0x80 | size)
        elif size < 65536:
            head = MEDIUM.pack(0x80 | opcode, 0x80 | 126, size)
        else:
            head = LONG.pack(0x80 | opcode, 0x80 | 127, size)
        mask = os.urandom(4)
        frame = head + mask + apply_mask(payload, mask)
        with self.send_lock:
            if self.closed.is_set() or (self.closing and opcode != CLOSE and opcode != PONG):
                if quiet:
                    return
                raise self.error or ConnectionClosed("the connection is closed")
            try:
                self.sock.sendall(frame)
            except OSError as exc:
                if quiet:
                    return
                raise self._lost(exc) from None

    # ending

    def close(self, code: int = NORMAL, reason: str = "") -> None:
        """Send our CLOSE (once) and shut the socket when the other end answers (the reader sees it) or
        `close_timeout` later, whichever comes first."""
        if self.closed.is_set():
            return
        if not self.closing:
            self.closing = True
            self._send_frame(CLOSE, struct.pack("!H", code) + reason.encode()[:120], quiet=True)
        timer = threading.Timer(self.close_timeout, self._shut)
        timer.daemon = True
        timer.start()

    def _shut(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass

    def _keepalive(self, interval: float) -> None:
        while not self.closed.wait(interval):
            quiet = time.monotonic() - self.last_read
            if quiet >= interval + self.ping_timeout:
                if self.error is None:
                    self.error = ConnectionClosed(f"no answer to a keepalive ping within {self.ping_timeout:g} s")
                self._shut()
                return
            if quiet >= interval:
                self._send_frame(PING, b"", quiet=True)


def connect(url: str, *, ssl_context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None, timeout: float = 10.0,
            **options) -> WebSocket:
    """Open a WebSocket to `url` (ws:// or wss://): the TCP connection (through the environment's HTTP proxy for
    the host, as `requests` would), TLS, the handshake, all within `timeout`. `options` go to WebSocket."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"not a ws:// or wss:// URL: {url!r}")
    secure = parts.scheme == "wss"
    host, port = parts.hostname, parts.port or (443 if secure else 80)
    deadline = time.monotonic() + timeout
    sock = _tcp(host, port, secure, timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if secure:
            context = ssl_context or ssl.create_default_context()
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock = context.wrap_socket(sock, server_hostname=host)
        key = base64.b64encode(os.urandom(16)).decode()
        authority = host if ":" not in host else f"[{host}]"
        if parts.port:
            authority += f":{parts.port}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"GET {target} HTTP/1.1", f"Host: {authority}", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        response, rest = _response(sock, deadline)
        if response.status_code != 101:
            raise Refused(response)
        accept = base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()
        if response.headers.get("upgrade", "").lower() != "websocket" or response.headers.get("sec-websocket-accept") != accept:
            raise BadHandshake("the server's 101 answer is not a WebSocket's (Upgrade or Sec-WebSocket-Accept)")
        if response.headers.get("sec-websocket-extensions"):
            raise BadHandshake("the server agreed to an extension no one asked for")
        sock.settimeout(None)
        return WebSocket(sock, rest, **options)
    except BaseException:
        sock.close()
        raise


def _tcp(host: str, port: int, secure: bool, timeout: float) -> socket.socket:
    """A TCP connection to host:port, through an HTTP proxy (CONNECT) where the environment names one for it."""
    proxy = None if urllib.request.proxy_bypass(host) else urllib.request.getproxies().get("https" if secure else "http")
    if not proxy:
        return socket.create_connection((host, port), timeout=timeout)
    parts = urlsplit(proxy if "://" in proxy else "http://" + proxy)
    if parts.scheme != "http" or not parts.hostname:
        shown = f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")  # never its password
        raise ValueError(f"the relay goes through http:// proxies only, not {shown} (or add {host} to no_proxy)")
    sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout)
    try:
        authority = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        auth = ""
        if parts.username:
            userpass = f"{parts.username}:{parts.password or ''}".encode()
            auth = f"Proxy-Authorization: Basic {base64.b64encode(userpass).decode()}\r\n"
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{auth}\r\n".encode())
        response, rest = _response(sock, time.monotonic() + timeout)
        if response.status_code // 100 != 2 or rest:
            raise BadHandshake(f"the proxy {parts.hostname} refused CONNECT {authority}: HTTP {response.status_code}")
        return sock
    except BaseException:
        sock.close()
        raise


def _response(sock: socket.socket, deadline: float) -> tuple[Response, bytes]:
    """The HTTP answer's head (and, for a refusal, its body up to BODY_LIMIT); the bytes read past the head."""
    buf = bytearray()
    while b"\r\n\r\n" not in buf:
        if len(buf) > HEAD_LIMIT:
            raise BadHandshake(f"the answer's head is over {HEAD_LIMIT} bytes")
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        data = sock.recv(65536)
        if not data:
            if not buf:
                raise EOFError("the connection closed before any answer")
            raise BadHandshake("the connection closed in the middle of the answer")
        buf += data
    end = buf.index(b"\r\n\r\n")
    head, rest = bytes(buf[:end]).decode("latin-1"), bytes(buf[end + 4 :])
    status_line, *header_lines = head.split("\r\n")
    try:
        version, code, *reason = status_line.split(" ", 2)
        status = int(code)
        if not version.startswith("HTTP/1."):
            raise ValueError(version)
    except ValueError:
        raise BadHandshake(f"not an HTTP answer: {status_line[:80]!r}") from None
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    response = Response(status, reason[0] if reason else "", headers)
    if status != 101 and status // 100 != 2:
        length = headers.get("content-length", "")
        want = min(int(length), BODY_LIMIT) if length.isdigit() else 0
        body = bytearray(rest)
        try:
            while len(body) < want:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                data = sock.recv(65536)
                if not data:
                    break
                body += data
        except OSError:
            pass
        response.body, rest = bytes(body[:want]), b""
    return response, rest


__all__ = ["WebSocket", "connect", "Refused", "BadHandshake", "ConnectionClosed", "Close", "Response"]
