"""Errors the client raises: one class per kind of refusal, carrying the server's code.

`error_from_response` turns the wire's error shape (docs/protocol.md,
`{"error": {"code", "message"}}`) into the matching class.
"""
from __future__ import annotations

import requests


class ClientError(Exception):
    """Base of every error the client raises; `message` is a sentence for people."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadInput(ClientError, ValueError):
    """What the caller gave cannot be used as given (a --source folder that does not exist, a URL without
    a scheme); nothing was sent. The CLI exits 2 on it, as on every usage error."""


class ConnectionFailed(ClientError):
    """The control plane could not be reached (refused, DNS, TLS, timeout)."""


class WaitTimeout(ClientError, TimeoutError):
    """A wait (`Job.wait`, `Job.endpoints(wait=...)`) ran out of time."""


class ServiceNotStarting(ClientError):
    """`Job.endpoints(wait=..., max_failed_starts=N)`: a replica failed to start N times while waited on
    (its service goes on restarting by its policy)."""


class ApiError(ClientError):
    """The server refused a request; `code`, `status` and `message` are the server's."""

    def __init__(self, message: str, code: str = "error", status: int = 0, body: dict | None = None):
        super().__init__(message)
        self.code = code
        self.status = status
        self.body = body or {}

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class InvalidRequest(ApiError):
    """400/413/422: the request was malformed or a field is wrong."""


class Unauthorized(ApiError):
    """401: no token, or an unknown, revoked or expired one."""


class Forbidden(ApiError):
    """403: a valid token of the wrong kind or without the needed labels."""


class NotFound(ApiError):
    """404: no such job, artifact, token or secret."""


class Conflict(ApiError):
    """409: the thing is not in a state that allows the change."""


class ProtocolMismatch(ApiError):
    """426: the server speaks another protocol version; upgrade the older side."""


_BY_STATUS = {400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
              409: Conflict, 413: InvalidRequest, 422: InvalidRequest, 426: ProtocolMismatch}


def error_from_response(response: requests.Response) -> ApiError:
    """Build the typed error for a non-2xx response (error shape of docs/protocol.md)."""
    try:
        body = response.json()
        err = body.get("error") or {}
        code, message = err.get("code", "error"), err.get("message", "")
    except (ValueError, AttributeError):
        body, code, message = {}, "http_error", ""
    if not message:
        message = f"the server answered HTTP {response.status_code} {response.reason or ''}".strip()
        said = _plain_text(response)
        if said:  # a front end's own words (cheroot: "This port speaks HTTPS; use an https:// URL.")
            message = f"{message}: {said}"
    cls = _BY_STATUS.get(response.status_code, ApiError)
    return cls(message, code=code, status=response.status_code, body=body)


def _plain_text(response: requests.Response) -> str:
    """A short text/plain answer's first line, or ""."""
    if not response.headers.get("Content-Type", "").startswith("text/plain") or len(response.content) > 512:
        return ""
    return response.text.strip().splitlines()[0] if response.text.strip() else ""
