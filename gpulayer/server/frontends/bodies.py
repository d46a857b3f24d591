"""Request framing and request bodies, as both front ends (cheroot_server.py, granian_server.py) enforce them.

Framing (RFC 9112 §6.3): a request whose length two servers could read
differently is refused with 400 before anything reads its body: more than
one Content-Length, a Content-Length that is not digits only, a
Transfer-Encoding other than exactly `chunked` (one header, one coding), or
both headers at once.

Bodies: a small body (Content-Length up to `BUFFERED_BODY_BYTES`, every
control request) is read by the front end with its head, holding no Python
thread, and must be complete `head_timeout_s` after the head's first byte. A
larger or chunked body (an artifact upload) streams through a thread, so at
most `STREAMED_SHARE` of the threads read such bodies at once (past it: 503
at once) and each must keep up `MIN_BODY_RATE` bytes a second after a grace
of `BODY_GRACE_S` (past it: 408, connection closed).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

from gpulayer.server.errors import BodyTooSlow, error_body

# Bodies up to this size are read with the head, before a thread takes the request.
BUFFERED_BODY_BYTES = 64 * 1024
# The share of the threads that may be reading a streamed body at once (at least one).
STREAMED_SHARE = 0.25
# A streamed body may take BODY_GRACE_S plus one second per MIN_BODY_RATE bytes received.
BODY_GRACE_S = 10.0
MIN_BODY_RATE = 32 * 1024

_DIGITS = re.compile(r"[0-9]+")


def framing_error(headers: Iterable[tuple[str, str]]) -> str | None:
    """Why the (name, value) header pairs frame the body ambiguously; None when they do not.

    Names are compared case-insensitively; a name with white space before its
    colon counts as that header (cheroot strips it).
    """
    lengths, codings = [], []
    for name, value in headers:
        key = name.strip().lower()
        if key in ("content-length", "transfer-encoding") and key != name.lower():
            return f"white space in the header name {name.strip()!r}"
        if key == "content-length":
            lengths.append(value.strip(" \t"))
        elif key == "transfer-encoding":
            codings.append(value.strip(" \t"))
    if len(lengths) > 1:
        return "more than one Content-Length header"
    if lengths and not _DIGITS.fullmatch(lengths[0]):
        return f"Content-Length {lengths[0]!r} is not a decimal number"
    if codings and lengths:
        return "both Transfer-Encoding and Content-Length"
    if codings and (len(codings) > 1 or codings[0].lower() != "chunked"):
        return f"Transfer-Encoding {', '.join(codings)!r} is not exactly 'chunked'"
    return None


def error_response(status: str, code: str, message: str, extra: Iterable[bytes] = ()) -> bytes:
    """A whole HTTP/1.1 response in the one error shape, closing the connection (written by a front end)."""
    body = error_body(code, message)
    lines = [b"HTTP/1.1 " + status.encode(), b"Content-Type: application/json", b"Connection: close",
             *extra, b"Content-Length: %d" % len(body)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def streamed_cap(threads: int) -> int:
    """How many requests may be reading a streamed body at once."""
    return max(1, int(threads * STREAMED_SHARE))


STREAMS_FULL = "too many request bodies are streaming to the control plane at once; try again shortly"


class Pace:
    """The minimum-rate deadline of one streamed body: `seconds_left()` after `received` bytes."""

    def __init__(self, grace_s: float = BODY_GRACE_S, min_rate: float = MIN_BODY_RATE):
        self.started = time.monotonic()
        self.grace_s, self.min_rate = grace_s, min_rate
        self.received = 0
        self.expired = False

    def seconds_left(self) -> float:
        """Seconds until the body is behind; sets `expired` once it is."""
        left = self.started + self.grace_s + self.received / self.min_rate - time.monotonic()
        if left <= 0:
            self.expired = True
        return left

    def too_slow(self) -> BodyTooSlow:
        self.expired = True
        return BodyTooSlow(f"the request body arrived slower than {self.min_rate // 1024:g} KiB/s "
                           f"(after {self.grace_s:g} s); the connection is closed")


__all__ = ["BUFFERED_BODY_BYTES", "Pace", "error_response", "framing_error", "streamed_cap"]
