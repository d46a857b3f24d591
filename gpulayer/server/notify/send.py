"""The wire of a delivery: a POST to a checked address, a mail through the configured SMTP server.

A webhook URL is a request the server makes for a user, so its host must resolve to public addresses
only (every one of them: loopback, private, link-local, multicast and reserved ranges are refused) unless
the admin started the server with `--allow-private-webhooks`. The check runs when a webhook is added and
again at each delivery, and the connection goes to the address that was checked (no second lookup a
rebinding DNS could answer otherwise). Redirects are not followed: a 3xx is a failed try.
"""

from __future__ import annotations

import http.client
import ipaddress
import smtplib
import socket
import ssl
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


def public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
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
            raise InvalidRequest(
                f"{field}: {host} resolves to {refused[0]}, a loopback, private or link-local "
                "address: webhooks go to public addresses unless the server was started with "
                "--allow-private-webhooks",
                field=field,
                code="private_target",
            )
    return addresses[0]


class _Pinned(http.client.HTTPConnection):
    """An HTTP connection to an address checked beforehand, with the URL's host in its Host header."""

    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedTLS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def post(url: str, body: bytes, headers: dict[str, str], *, timeout: float, allow_private: bool, keep: dict | None = None) -> int:
    """POST `body`; returns the 2xx status. Raises SendError for anything else (refused, timed out, non-2xx).

    `keep`: this thread's open connections by (scheme, host, port, address), reused while the receiver
    keeps them alive (a connection it closed meanwhile is replaced at once, not counted as a failed try).
    """
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
            conn = (_PinnedTLS if scheme == "https" else _Pinned)(host, port, address, timeout)
        try:
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json", "User-Agent": "gpulayer-webhooks", **headers})
            resp = conn.getresponse()
            resp.read(65536)
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            if fresh:
                raise SendError(f"{type(e).__name__}: {e}"[:MAX_ERROR]) from None
            continue  # a kept connection the receiver had closed: once more on a new one
        if keep is not None and not resp.will_close:
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
    try:
        smtp: smtplib.SMTP
        if scheme == "smtps":
            smtp = smtplib.SMTP_SSL(host, port, timeout=timeout, context=ssl.create_default_context())
        else:
            smtp = smtplib.SMTP(host, port, timeout=timeout)
        with smtp:
            smtp.ehlo()
            if scheme == "smtp" and smtp.has_extn("starttls"):
                smtp.starttls(context=ssl.create_default_context())
                smtp.ehlo()
            if user is not None:
                smtp.login(user, password or "")
            smtp.send_message(message)
    except (OSError, smtplib.SMTPException) as e:
        raise SendError(f"{type(e).__name__}: {e}"[:MAX_ERROR]) from None
