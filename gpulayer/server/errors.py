"""Domain errors: each has a snake_case code and an HTTP status, mapped once in app.py; the one error shape.

`error_body` writes that shape as bytes for the code that answers outside the app (the front ends, the relay's
ingress), so it sits here, below http/, frontends/ and relay/, rather than in any; so do the errors of a request
body the front ends raise inside the app (`BodyIncomplete`, `BodyTooSlow`, `peer_gone`).
"""
from __future__ import annotations

import json
import ssl


class GpulayerError(Exception):
    """Base of every error GPUlayer reports to a user; `message` is a sentence for people."""

    code = "error"
    status = 400

    def __init__(self, message: str, *, code: str | None = None, **extra):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.extra = extra

    def to_dict(self) -> dict:
        body = {"code": self.code, "message": self.message}
        return {"error": body, **self.extra}


def error_body(code: str, message: str) -> bytes:
    """The one error shape, as bytes."""
    return json.dumps({"error": {"code": code, "message": message}}).encode()



class BodyIncomplete(GpulayerError):
    """The peer closed the connection before its request body ended."""

    code = "incomplete_body"
    status = 400


class BodyTooSlow(GpulayerError):
    """A streamed request body fell behind the minimum rate; the connection is closed after the 408."""

    code = "request_timeout"
    status = 408


def peer_gone(exc: BaseException | None) -> bool:
    """True for the errors of a peer that closed or reset its connection (not worth a traceback)."""
    return isinstance(exc, (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError, BodyIncomplete)) or (
        isinstance(exc, ssl.SSLError) and exc.reason in ("UNEXPECTED_EOF_WHILE_READING", "BAD_LENGTH"))

class ConfigError(GpulayerError):
    """A bad setting or file, found before serving."""

    code = "config_error"


class InvalidRequest(GpulayerError):
    code = "invalid_field"
    status = 400


class InvalidJSON(GpulayerError):
    code = "invalid_json"
    status = 400


class BodyTooLarge(GpulayerError):
    code = "body_too_large"
    status = 413


class Unauthorized(GpulayerError):
    code = "unauthorized"
    status = 401


class Forbidden(GpulayerError):
    code = "forbidden"
    status = 403


class NotFound(GpulayerError):
    code = "not_found"
    status = 404


class Conflict(GpulayerError):
    code = "conflict"
    status = 409


class TaskNotAssigned(Conflict):
    code = "task_not_assigned"


class TooManyQueued(GpulayerError):
    """A submit past the per-user cap on elements not yet ended (`--max-queued-elements`)."""

    code = "too_many_queued"
    status = 429


class ProtocolMismatch(GpulayerError):
    code = "protocol_mismatch"
    status = 426


class DigestMismatch(GpulayerError):
    code = "digest_mismatch"
    status = 400


class AlreadyInitialised(GpulayerError):
    code = "already_initialised"
    status = 409


class Unavailable(GpulayerError):
    """The control plane cannot serve this now (writer busy or stopped, out of file descriptors); retry later."""

    code = "unavailable"
    status = 503


class ReadTimeout(Unavailable):
    """A read of the state file ran past `--read-timeout` and was stopped; nothing changed: retry, or ask for less."""

    code = "read_timeout"


class StorageFull(GpulayerError):
    """The state file's disk (or its max_page_count) is full; nothing of the request was written."""

    code = "storage_full"
    status = 507
