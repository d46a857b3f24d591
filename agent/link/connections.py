"""Keep-alive http.client connections to the control plane, each used by one thread at a time.

``ConnectionPool.take()`` hands a caller an idle connection (or a new one);
the caller gives it back with ``give_back()`` once the answer is read, or
closes it. A connection is never shared by two threads at once, which
requests' Session did not promise, and reuse spans the agent's short-lived
task threads (a connection per thread would open new ones for every task).

What the agent took from requests' defaults, kept here:

- ``verify``: a CA file or folder; True means ``$REQUESTS_CA_BUNDLE`` or
  ``$CURL_CA_BUNDLE`` when set, else certifi's bundle (requests' own
  default); False (only the CA fetch before pinning) checks nothing.
- Proxies from ``$HTTPS_PROXY``, ``$HTTP_PROXY``, ``$ALL_PROXY`` and
  ``$NO_PROXY``, chosen by requests' own rules: an ``http://`` proxy, which
  tunnels (CONNECT) to an https control plane; credentials in its URL are
  sent as Proxy-Authorization.
"""

import base64
import http.client
import os
import select
import ssl
import threading
from urllib.parse import unquote, urlsplit

from requests import certs, utils

from ..errors import AgentError

#: Idle connections kept for reuse (requests' pool kept 10 per host as well).
IDLE_MAX = 10
#: Bytes read from a file body per send() while uploading.
SEND_BLOCK_BYTES = 64 * 1024


def ssl_context(verify: bool | str) -> ssl.SSLContext:
    """The TLS context for ``verify`` (see the module docstring); AgentError for an unreadable CA."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if verify is True:
        verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or certs.where()
    try:
        if os.path.isdir(verify):
            return ssl.create_default_context(capath=verify)
        return ssl.create_default_context(cafile=verify)
    except (OSError, ssl.SSLError) as exc:
        raise AgentError(f"cannot load the CA certificates in {verify}: {exc}") from None


def _proxy_of(url: str) -> str | None:
    """The proxy URL requests would use for ``url``, from the environment; None for none."""
    proxy = utils.select_proxy(url, utils.get_environ_proxies(url))
    if not proxy:
        return None
    proxy = utils.prepend_scheme_if_needed(proxy, "http")
    if urlsplit(proxy).scheme != "http":
        raise AgentError(f"proxy {urlsplit(proxy).scheme}://... for {url} is not supported by the agent: use an http:// proxy")
    return proxy


def _proxy_authorization(proxy: str) -> dict[str, str]:
    parts = urlsplit(proxy)
    if parts.username is None:
        return {}
    credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return {"Proxy-Authorization": "Basic " + base64.b64encode(credentials).decode()}


def is_dropped(connection: http.client.HTTPConnection) -> bool:
    """True when an idle connection's socket is readable: the server closed it (or sent something unasked)."""
    if connection.sock is None:
        return True
    poller = select.poll()
    poller.register(connection.sock, select.POLLIN)
    return bool(poller.poll(0))


class ConnectionPool:
    """Keep-alive connections to one control plane (``base_url``: scheme://host:port[/prefix])."""

    def __init__(self, base_url: str, verify: bool | str = True):
        parts = urlsplit(base_url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self.context = ssl_context(verify) if self.https else None
        self.proxy = _proxy_of(base_url)
        self.proxy_headers = _proxy_authorization(self.proxy) if self.proxy else {}
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def target(self, path: str) -> str:
        """The request target: the path, or the absolute URL through a plain-HTTP proxy."""
        return self.origin + path if self.proxy and not self.https else path

    def request_headers(self) -> dict[str, str]:
        """Headers every request needs for the route (Proxy-Authorization through a plain-HTTP proxy)."""
        return self.proxy_headers if self.proxy and not self.https else {}

    def take(self, fresh: bool = False) -> tuple[http.client.HTTPConnection, bool]:
        """A connection for one request and whether it was used before; ``fresh`` forces a new one."""
        while not fresh:
            with self._lock:
                if not self._idle:
                    break
                connection = self._idle.pop()
            if not is_dropped(connection):
                return connection, True
            connection.close()
        return self._new(), False

    def _new(self) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection
        host, port = self.host, self.port
        if self.proxy:
            proxy = urlsplit(self.proxy)
            host, port = proxy.hostname or "", proxy.port or 80
        if self.https:
            connection = http.client.HTTPSConnection(host, port, context=self.context, blocksize=SEND_BLOCK_BYTES)
            if self.proxy:
                connection.set_tunnel(self.host, self.port, headers=self.proxy_headers)
        else:
            connection = http.client.HTTPConnection(host, port, blocksize=SEND_BLOCK_BYTES)
        return connection

    def give_back(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        """Keep a connection whose answer was read whole for the next request; close any other."""
        with self._lock:
            keep = not self._closed and not response.will_close and response.isclosed() and len(self._idle) < IDLE_MAX
            if keep:
                self._idle.append(connection)
        if not keep:
            connection.close()

    def close(self) -> None:
        """Close the idle connections; those in use close when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
