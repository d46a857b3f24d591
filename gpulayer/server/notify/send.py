"""The wire of a delivery: a POST to a checked address, a mail through the configured SMTP server.

A webhook URL is a request the server makes for a user, so its host must resolve to public addresses
only (every one of them: loopback, private, link-local, multicast and reserved ranges are refused, and an
IPv6 address that carries an IPv4 one, 6to4, Teredo, NAT64, IPv4-mapped, by that IPv4 address) unless
the admin started the server with `--allow-private-webhooks`. The check runs when a webhook is added and
again at each delivery, and the connection goes to the address that was checked (no second lookup a
rebinding DNS could answer otherwise). Redirects are not followed: a 3xx is a failed try.

Each try has a total deadline, connect to last byte (`Deadline`): a socket timeout bounds one read, so a
receiver that sends a byte every few seconds would hold the try, and its thread, for ever. At the
deadline one reaper thread shuts the try's sockets down, which ends whatever the try was waiting on.
"""

from __future__ import annotations

import http.client
import ipaddress
import smtplib
import heapq
import itertools
import socket
import ssl
import threading
import time
from email.message import EmailMessage
from urllib.parse import unquote, urlsplit

from gpulayer.server.errors import InvalidRequest

MAX_URL = 2048
MAX_ERROR = 300  # characters of a failure kept in webhook_deliveries.last_error


class SendError(Exception):
    """A try that failed: `status` is the HTTP status when one came back."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class Deadline:
    """The end of one try, `seconds` from now: every socket the try registered (`add`) is shut down then,
    so a connect, TLS handshake, send or read blocked on it returns at once. `close()` when the try ends.

    The registered socket is a duplicate of the try's descriptor (`socket.fromfd`), the try's own to
    close: a shutdown acts on the connection, which TLS does not own apart, and a closed duplicate is never
    mistaken for a descriptor number given out again."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        _REAPER.watch(self)

    def left(self) -> float:
        """Seconds left (a socket timeout for the next step); SendError once none are."""
        left = self.at - time.monotonic()
        if left <= 0 or self.expired:
            raise self.error()
        return left

    def error(self) -> SendError:
        return SendError(f"timed out: no complete answer within the try's {self.seconds:g} s")

    def add(self, sock: socket.socket) -> None:
        guard = socket.fromfd(sock.fileno(), sock.family, sock.type)
        with self._lock:
            if self._closed:
                guard.close()
                return
            self._socks.append(guard)
            if self.expired:
                _shut(guard)

    def expire(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.expired = True
            for guard in self._socks:
                _shut(guard)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks, self._socks = self._socks, []
        for guard in socks:
            guard.close()


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected (yet, or any more)
        pass


class _Reaper:
    """One thread for every try's deadline: it sleeps until the nearest and expires each that passed."""

    def __init__(self):
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, deadline: Deadline) -> None:
        with self._cv:
            heapq.heappush(self._heap, (deadline.at, next(self._order), deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="webhook-deadlines", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cv.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _, _, deadline = heapq.heappop(self._heap)
            deadline.expire()


_REAPER = _Reaper()


def check_url(url, field: str = "url") -> tuple[str, str, int, str]:
    """(scheme, host, port, path with query) of an http(s) URL; raises InvalidRequest naming `field`."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL or not url.isprintable():
        raise InvalidRequest(f"{field}: must be an http:// or https:// URL of at most {MAX_URL} characters", field=field)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise InvalidRequest(f"{field}: not a URL ({e})", field=field) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest(f"{field}: must be an http:// or https:// URL with a host, not {url!r}", field=field)
    if parts.username or parts.password:
        raise InvalidRequest(f"{field}: credentials in the URL are not accepted (the payload is signed)", field=field)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), path


NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052's well-known prefix: the IPv4 in the last 32 bits
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215's local-use prefix, of any RFC 6052 length
COMPATIBLE = ipaddress.IPv6Network("::/96")  # IPv4-compatible (deprecated): ::a.b.c.d
# Where the IPv4 address is in an address of NAT64_LOCAL, by the prefix length its network uses (RFC 6052
# 2.2: bits 64-71 are zero): which one an operator chose is not in the address, so each is checked.
NAT64_OFFSETS = ((6, 7, 9, 10), (7, 9, 10, 11), (9, 10, 11, 12), (12, 13, 14, 15))


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address stands for (a connection to it reaches them): IPv4-mapped and
    -compatible, 6to4, Teredo (its server and its client), NAT64; empty for any other."""
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        return list(ip.teredo)
    if ip in NAT64 or (ip in COMPATIBLE and int(ip) > 1):  # :: and ::1 are unspecified and loopback as they are
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip in NAT64_LOCAL:
        return [ipaddress.IPv4Address(bytes(ip.packed[i] for i in at)) for at in NAT64_OFFSETS]
    return []


def public_address(address: str) -> bool:
    """Is `address` a public one: global, and neither multicast, reserved, loopback, link-local, private nor
    unspecified? An IPv6 address that embeds IPv4 addresses (embedded_ipv4) is judged by them alone: every
    one must be public (2002:a9fe:a9fe:: is 169.254.169.254 through 6to4)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = embedded_ipv4(ip)
        if embedded:
            return all(_public(v4) for v4 in embedded)
    return _public(ip)


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_loopback or ip.is_link_local or ip.is_private or ip.is_unspecified)


def resolve(host: str, port: int, allow_private: bool, field: str = "url") -> str:
    """The address to connect to: the first of the host's, once every one of them is allowed.

    Raises InvalidRequest (unresolvable, or a loopback/private/link-local address without the flag)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as e:  # unknown, unreachable, not a host name at all
        raise InvalidRequest(f"{field}: host {host!r} does not resolve ({e})", field=field) from None
    addresses = [str(info[4][0]) for info in found]
    if not addresses:
        raise InvalidRequest(f"{field}: host {host!r} has no address", field=field)
    if not allow_private:
        refused = [a for a in addresses if not public_address(a)]
        if refused:
            ip = ipaddress.ip_address(refused[0].split("%", 1)[0])
            carried = embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else []
            told = f"{refused[0]} (which stands for {', '.join(map(str, carried))})" if carried else refused[0]
            raise InvalidRequest(
                f"{field}: {host} resolves to {told}, a loopback, private or link-local "
                "address: webhooks go to public addresses unless the server was started with "
                "--allow-private-webhooks",
                field=field,
                code="private_target",
            )
    return addresses[0]


class _Pinned(http.client.HTTPConnection):
    """An HTTP connection to an address checked beforehand, with the URL's host in its Host header; its
    socket is under the current try's `deadline` from the moment it exists."""

    deadline: Deadline | None = None

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def _open(self) -> socket.socket:
        deadline = self.deadline
        sock = socket.create_connection((self.address, self.port), deadline.left() if deadline else self.timeout)
        if deadline is not None:
            deadline.add(sock)
        return sock

    def connect(self) -> None:
        self.sock = self._open()


class _PinnedTLS(_Pinned, http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float):
        http.client.HTTPSConnection.__init__(self, host, port, timeout=timeout, context=ssl.create_default_context())
        self.address = address

    def connect(self) -> None:
        self.sock = self._context.wrap_socket(self._open(), server_hostname=self.host)  # type: ignore[attr-defined]


def post(url: str, body: bytes, headers: dict[str, str], *, timeout: float, allow_private: bool, keep: dict | None = None) -> int:
    """POST `body`; returns the 2xx status. Raises SendError for anything else (refused, timed out, non-2xx).
    `timeout` bounds the whole try, from the address's lookup to the answer's last byte (`Deadline`).

    `keep`: this thread's open connections by (scheme, host, port, address), reused while the receiver
    keeps them alive (a connection it closed meanwhile is replaced at once, not counted as a failed try).
    """
    deadline = Deadline(timeout)
    try:
        return _post(url, body, headers, deadline, allow_private, keep)
    finally:
        deadline.close()


def _post(url: str, body: bytes, headers: dict[str, str], deadline: Deadline, allow_private: bool, keep: dict | None) -> int:
    try:
        scheme, host, port, path = check_url(url)
        address = resolve(host, port, allow_private)
    except InvalidRequest as e:
        raise SendError(e.message) from None
    key = (scheme, host, port, address)
    held = keep.pop(key, None) if keep is not None else None
    for conn in ([held] if held is not None else []) + [None]:
        fresh = conn is None
        if conn is None:
            conn = (_PinnedTLS if scheme == "https" else _Pinned)(host, port, address, deadline.seconds)
        conn.deadline = deadline
        try:
            if conn.sock is not None:
                deadline.add(conn.sock)
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json", "User-Agent": "gpulayer-webhooks", **headers})
            resp = conn.getresponse()
            resp.read(65536)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            if deadline.expired:
                raise deadline.error() from None
            if fresh:
                raise SendError(f"{type(e).__name__}: {e}"[:MAX_ERROR]) from None
            continue  # a kept connection the receiver had closed: once more on a new one
        conn.deadline = None
        if keep is not None and not resp.will_close and not deadline.expired:
            keep[key] = conn
        else:
            conn.close()
        if not 200 <= resp.status < 300:
            raise SendError(f"HTTP {resp.status} {resp.reason}", resp.status)
        return resp.status
    raise SendError("no connection")  # not reached: the last round opens a fresh one


def check_smtp_url(url: str) -> tuple[str, str, int, str | None, str | None]:
    """(scheme, host, port, user, password) of `smtp://[user:pass@]host[:port]` or `smtps://...`;
    raises ValueError."""
    parts = urlsplit(url)
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise ValueError(f"--smtp-url: must be smtp://host[:port] or smtps://host[:port], not {url!r}")
    port = parts.port or (465 if parts.scheme == "smtps" else 25)
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return parts.scheme, parts.hostname, port, user, password


def mail(smtp_url: str, sender: str, to: str, subject: str, text: str, msg_id: str, *, timeout: float) -> None:
    """Send one mail; STARTTLS when the server offers it (smtp://), TLS from the start (smtps://).
    Raises SendError."""
    scheme, host, port, user, password = check_smtp_url(smtp_url)
    message = EmailMessage()
    message["From"], message["To"], message["Subject"] = sender, to, subject
    message["Message-ID"] = f"<{msg_id}@gpulayer>"
    message.set_content(text)
    deadline = Deadline(timeout)  # the whole exchange, as a POST's
    try:
        smtp: smtplib.SMTP
        if scheme == "smtps":
            smtp = smtplib.SMTP_SSL(host, port, timeout=timeout, context=ssl.create_default_context())
        else:
            smtp = smtplib.SMTP(host, port, timeout=timeout)
        if smtp.sock is not None:
            deadline.add(smtp.sock)
        with smtp:
            smtp.ehlo()
            if scheme == "smtp" and smtp.has_extn("starttls"):
                smtp.starttls(context=ssl.create_default_context())
                smtp.ehlo()
            if user is not None:
                smtp.login(user, password or "")
            smtp.send_message(message)
    except (OSError, smtplib.SMTPException) as e:
        if deadline.expired:
            raise deadline.error() from None
        raise SendError(f"{type(e).__name__}: {e}"[:MAX_ERROR]) from None
    finally:
        deadline.close()
