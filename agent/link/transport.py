"""HTTP to the control plane: the protocol header, auth, error mapping, retries.

Every request carries ``X-GpuLayer-Protocol: 1``. Answers map to exceptions:
426 → AgentError (protocol mismatch), 401 → Unauthorized, 403 → Forbidden,
other 3xx and 4xx → Rejected (redirects are not followed), network errors,
timeouts, 408, 429 and 5xx → Unreachable.
``call()`` retries Unreachable with exponential backoff and jitter.
"""

import http.client
import ipaddress
import json
import os
import ssl
import time
from typing import BinaryIO, Callable
from urllib.parse import urlsplit

from .. import PROTOCOL, __version__
from ..errors import AgentError, Forbidden, Rejected, Unauthorized, Unreachable
from ..events import log_event
from .backoff import retry_delay
from .connections import ConnectionPool

PROTOCOL_HEADER = "X-GpuLayer-Protocol"
DEFAULT_TIMEOUT_S = 30.0
CHUNK_BYTES = 1024 * 1024
#: Seconds a retried call answered 401 waits for the worker to register again (the heartbeat's rejoin sets a
#: new session token) before the 401 stands: a control plane restored from a replica may not know this session.
REAUTH_WAIT_S = 20.0
#: Seconds: one for both connecting and each read, or (connect, read).
Timeout = float | tuple[float, float]


def is_loopback_host(host: str) -> bool:
    """True for localhost and loopback addresses."""
    if host.lower() in ("localhost", "localhost.localdomain") or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_url(url: str, insecure: bool) -> str:
    """Validate the control plane URL; returns it without a trailing slash.

    Raises AgentError for a non-HTTP URL, or plain HTTP to a non-loopback host
    unless ``insecure``.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AgentError(f"invalid control plane URL {url!r}: expected https://host:port")
    if parts.scheme == "http" and not insecure and not is_loopback_host(parts.hostname):
        raise AgentError(f"refusing plain HTTP to {parts.hostname}: use https:// or --insecure")
    base = url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def mismatch_message(server_protocol: object) -> str:
    """The one-line message for a 426 answer."""
    return (
        f"the control plane speaks protocol {server_protocol}, this worker speaks {PROTOCOL}: "
        "upgrade the worker (pip install -U gpulayer)"
    )


def _error_of(status: int, reason: str, data: bytes) -> tuple[str, str, dict]:
    try:
        body = json.loads(data) if data else {}
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "http_" + str(status), reason or "error", body if isinstance(body, dict) else {}
    return str(error.get("code", "")), str(error.get("message", "")), body


def _timeouts(timeout: Timeout) -> tuple[float, float]:
    return timeout if isinstance(timeout, tuple) else (timeout, timeout)


class Transport:
    """Calls to one control plane over keep-alive connections (agent/link/connections.py), with retries.

    Safe to use from many threads: each request holds its own connection.
    ``give_up_at`` (a time.monotonic() value) bounds every retry loop: the
    worker sets it when stopping so that nothing retries forever.
    """

    def __init__(self, base_url: str, verify: bool | str = True, timeout: float = DEFAULT_TIMEOUT_S):
        self.api = base_url.rstrip("/") + "/v1"
        self.timeout = timeout
        self.verify = verify
        self.api_path = urlsplit(self.api).path  # /v1, or deeper when the control plane sits under a path
        self.pool = ConnectionPool(base_url, verify)
        self.headers = {PROTOCOL_HEADER: str(PROTOCOL), "User-Agent": f"gpulayer-agent/{__version__}"}
        self.give_up_at: float | None = None
        self.reauth_wait_s = REAUTH_WAIT_S
        self.answered_at = 0.0  # time.monotonic() of the last 2xx answer (a heartbeat may be skipped after one)

    def set_token(self, token: str) -> None:
        """Use ``token`` as the bearer token from now on."""
        self.headers = {**self.headers, "Authorization": f"Bearer {token}"}

    def _exchange(self, method: str, path: str, body, headers: dict, timeout: Timeout):
        """Send one request and read the answer's head; returns (connection, response).

        A reused connection the server closed meanwhile is replaced and the
        request sent once more, unless its body is a stream already read.
        """
        connect_s, read_s = _timeouts(timeout)
        target = self.pool.target(self.api_path + path)
        headers = {**self.headers, **self.pool.request_headers(), **headers}
        fresh = False
        while True:
            connection, reused = self.pool.take(fresh)
            try:
                if connection.sock is None:
                    connection.timeout = connect_s
                    connection.connect()
                connection.sock.settimeout(read_s)
                connection.request(method, target, body=body, headers=headers)
                return connection, connection.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                stale = isinstance(exc, (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError))  # RemoteDisconnected is one
                if reused and stale and not hasattr(body, "read"):
                    fresh = True
                    continue
                raise Unreachable(f"{method} {path}: {type(exc).__name__}") from None

    def _read(self, connection, response, method: str, path: str) -> bytes:
        """The whole body; the connection goes back to the pool (or is closed on an error)."""
        try:
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise Unreachable(f"{method} {path}: {type(exc).__name__}") from None
        self.pool.give_back(connection, response)
        return data

    def _open(self, method: str, path: str, body=None, headers: dict | None = None, timeout: Timeout | None = None):
        """A request whose 2xx answer's body is still to be read: (connection, response); errors mapped."""
        connection, response = self._exchange(method, path, body, headers or {}, timeout or self.timeout)
        status = response.status
        if 200 <= status < 300:
            self.answered_at = time.monotonic()
            return connection, response
        data = self._read(connection, response, method, path)
        if status >= 500 or status in (408, 429):
            raise Unreachable(f"{method} {path}: HTTP {status}")
        if status == 426:
            _, _, error_body = _error_of(status, response.reason, data)
            server = error_body.get("protocol", response.getheader(PROTOCOL_HEADER, "?"))
            raise AgentError(mismatch_message(server))
        code, message, _ = _error_of(status, response.reason, data)
        cls = {401: Unauthorized, 403: Forbidden}.get(status, Rejected)
        raise cls(status, code, message)

    def _send(self, method: str, path: str, body=None, headers: dict | None = None, timeout: Timeout | None = None) -> bytes:
        """One request; the answer's body, read whole. Raises as the module docstring says."""
        connection, response = self._open(method, path, body, headers, timeout)
        return self._read(connection, response, method, path)

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        """One JSON call, no retry; returns the decoded answer ({} when empty)."""
        if body is None:
            data = self._send(method, path, timeout=timeout)
        else:
            payload = json.dumps(body, separators=(",", ":")).encode()
            data = self._send(method, path, payload, {"Content-Type": "application/json"}, timeout)
        if not data:
            return {}
        try:
            return json.loads(data)
        except ValueError:
            raise Unreachable(f"{method} {path}: answer is not JSON") from None

    def retrying(self, what: str, fn, *args, **kwargs):
        """Call ``fn`` until it does not raise Unreachable, waiting with backoff.

        Raises Unreachable when ``give_up_at`` passes; a 401 is sent again once the worker registered again
        (``_registered_again``); other errors pass through.
        """
        failures = 0
        while True:
            sent_with = self.headers.get("Authorization")
            try:
                result = fn(*args, **kwargs)
                if failures:
                    log_event("control_plane_reachable", call=what, after_failures=failures)
                return result
            except Unauthorized:
                if not self._registered_again(sent_with):
                    raise
                log_event("call_sent_again", call=what, reason="the worker registered again after a 401")
            except Unreachable as exc:
                failures += 1
                delay = retry_delay(failures)
                if self.give_up_at is not None and time.monotonic() + delay > self.give_up_at:
                    raise
                if failures == 1 or failures % 10 == 0:
                    log_event("control_plane_unreachable", call=what, failures=failures, error=str(exc))
                time.sleep(delay)

    def _registered_again(self, sent_with: str | None) -> bool:
        """Whether the session token changed since a call was sent with ``sent_with`` (waiting for it, bounded).

        A task's start, finish or checkpoint answered 401 is not dropped: the heartbeat thread registers the
        worker again (registration.Registration._rejoin) and the call goes again with the new token, so a
        task that finished while a restored control plane did not yet know this worker is not run twice.
        """
        started = time.monotonic()
        while self.headers.get("Authorization") == sent_with:
            now = time.monotonic()  # both bounds read again: a stop or a revocation shortens the wait
            if now >= started + self.reauth_wait_s or (self.give_up_at is not None and now >= self.give_up_at):
                return False
            time.sleep(0.05)
        return True

    def call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        """A JSON call retried until the control plane answers (see ``retrying``)."""
        return self.retrying(f"{method} {path}", self.request, method, path, body, timeout)

    def artifact_exists(self, digest: str) -> bool:
        """HEAD /v1/artifacts/{digest}: True for 200, False for 404."""
        try:
            self._send("HEAD", f"/artifacts/{digest}")
        except Rejected as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def download_artifact(self, digest: str, out: BinaryIO) -> None:
        """Stream an artifact into ``out`` from its start, retrying from scratch on errors."""

        buffer = bytearray(CHUNK_BYTES)  # read into, written from: no bytes object made per chunk
        view = memoryview(buffer)

        def attempt() -> None:
            out.seek(0)
            out.truncate()
            connection, response = self._open("GET", f"/artifacts/{digest}")
            while True:
                try:
                    got = response.readinto(buffer)
                except (OSError, http.client.HTTPException) as exc:
                    connection.close()
                    raise Unreachable(f"GET artifact {digest}: {type(exc).__name__}") from None
                if not got:
                    if response.length:  # http.client's readinto ends quietly at a close before Content-Length
                        connection.close()
                        raise Unreachable(f"GET artifact {digest}: IncompleteRead")
                    break
                try:
                    out.write(view[:got])
                except BaseException:
                    connection.close()
                    raise
            self.pool.give_back(connection, response)
            out.flush()

        self.retrying(f"GET /artifacts/{digest}", attempt)

    def upload_artifact(self, digest: str, path: str, opener: Callable[[str], BinaryIO] = lambda p: open(p, "rb"),
                        probe: bool = True) -> None:
        """PUT a file's bytes (streamed) under its digest, unless the server has it (``probe``: HEAD first; without,
        the caller asked already); ``opener`` opens it."""

        def attempt() -> None:
            if probe and self.artifact_exists(digest):
                return
            with opener(path) as handle:
                headers = {"Content-Type": "application/octet-stream"}
                try:
                    headers["Content-Length"] = str(os.fstat(handle.fileno()).st_size - handle.tell())
                except (OSError, AttributeError, ValueError):
                    pass  # no size known: http.client sends it chunked
                self._send("PUT", f"/artifacts/{digest}", handle, headers, timeout=(30, 600))

        self.retrying(f"PUT /artifacts/{digest}", attempt)

    def close(self) -> None:
        """Close the idle connections (safe to call twice)."""
        self.pool.close()
