"""HTTP to the control plane: the protocol header, auth, error mapping, retries.

Every request carries ``X-GpuLayer-Protocol: 1``. Answers map to exceptions:
426 → AgentError (protocol mismatch), 401 → Unauthorized, 403 → Forbidden,
other 4xx → Rejected, network errors, timeouts and 5xx → Unreachable.
``call()`` retries Unreachable with exponential backoff and jitter.
"""

import ipaddress
import time
from typing import BinaryIO, Callable
from urllib.parse import urlsplit

import requests

from . import PROTOCOL
from .backoff import retry_delay
from .errors import AgentError, Forbidden, Rejected, Unauthorized, Unreachable
from .events import log_event

PROTOCOL_HEADER = "X-GpuLayer-Protocol"
DEFAULT_TIMEOUT_S = 30.0
CHUNK_BYTES = 1024 * 1024


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


def _error_of(response: requests.Response) -> tuple[str, str, dict]:
    try:
        body = response.json()
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "http_" + str(response.status_code), response.reason or "error", body if isinstance(body, dict) else {}
    return str(error.get("code", "")), str(error.get("message", "")), body


class Transport:
    """A requests session bound to one control plane, with retrying calls.

    ``give_up_at`` (a time.monotonic() value) bounds every retry loop: the
    worker sets it when stopping so that nothing retries forever.
    """

    def __init__(self, base_url: str, verify: bool | str = True, timeout: float = DEFAULT_TIMEOUT_S):
        self.api = base_url.rstrip("/") + "/v1"
        self.timeout = timeout
        self.session = requests.Session()
        self.verify = verify
        self.session.verify = verify
        self.session.headers[PROTOCOL_HEADER] = str(PROTOCOL)
        self.give_up_at: float | None = None

    def set_token(self, token: str) -> None:
        """Use ``token`` as the bearer token from now on."""
        self.session.headers["Authorization"] = f"Bearer {token}"

    def _send(self, method: str, path: str, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", self.timeout)
        # Per request: requests lets $REQUESTS_CA_BUNDLE / $CURL_CA_BUNDLE override a
        # session's verify, which would replace the pinned CA with the system's.
        kwargs.setdefault("verify", self.verify)
        try:
            response = self.session.request(method, self.api + path, **kwargs)
        except requests.RequestException as exc:
            raise Unreachable(f"{method} {path}: {type(exc).__name__}") from None
        if response.status_code >= 500 or response.status_code in (408, 429):
            raise Unreachable(f"{method} {path}: HTTP {response.status_code}")
        if response.status_code == 426:
            _, _, body = _error_of(response)
            server = body.get("protocol", response.headers.get(PROTOCOL_HEADER, "?"))
            raise AgentError(mismatch_message(server))
        if response.status_code >= 400:
            code, message, _ = _error_of(response)
            cls = {401: Unauthorized, 403: Forbidden}.get(response.status_code, Rejected)
            raise cls(response.status_code, code, message)
        return response

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        """One JSON call, no retry; returns the decoded answer ({} when empty)."""
        response = self._send(method, path, json=body, timeout=timeout or self.timeout)
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            raise Unreachable(f"{method} {path}: answer is not JSON") from None

    def retrying(self, what: str, fn, *args, **kwargs):
        """Call ``fn`` until it does not raise Unreachable, waiting with backoff.

        Raises Unreachable when ``give_up_at`` passes; other errors pass through.
        """
        failures = 0
        while True:
            try:
                result = fn(*args, **kwargs)
                if failures:
                    log_event("control_plane_reachable", call=what, after_failures=failures)
                return result
            except Unreachable as exc:
                failures += 1
                delay = retry_delay(failures)
                if self.give_up_at is not None and time.monotonic() + delay > self.give_up_at:
                    raise
                if failures == 1 or failures % 10 == 0:
                    log_event("control_plane_unreachable", call=what, failures=failures, error=str(exc))
                time.sleep(delay)

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

        def attempt() -> None:
            out.seek(0)
            out.truncate()
            response = self._send("GET", f"/artifacts/{digest}", stream=True)
            try:
                for chunk in response.iter_content(CHUNK_BYTES):
                    out.write(chunk)
            except requests.RequestException as exc:
                raise Unreachable(f"GET artifact {digest}: {type(exc).__name__}") from None
            finally:
                response.close()
            out.flush()

        self.retrying(f"GET /artifacts/{digest}", attempt)

    def upload_artifact(self, digest: str, path: str, opener: Callable[[str], BinaryIO] = lambda p: open(p, "rb")) -> None:
        """PUT a file's bytes (streamed) under its digest, unless the server has it; ``opener`` opens it."""

        def attempt() -> None:
            if self.artifact_exists(digest):
                return
            with opener(path) as handle:
                headers = {"Content-Type": "application/octet-stream"}
                self._send("PUT", f"/artifacts/{digest}", data=handle, headers=headers, timeout=(30, 600))

        self.retrying(f"PUT /artifacts/{digest}", attempt)

    def close(self) -> None:
        """Close the HTTP session."""
        self.session.close()
