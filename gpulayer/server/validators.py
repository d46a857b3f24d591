"""The generic checks of one field of a request: each returns the value (normalised) or raises InvalidRequest
naming the field. The JobSpec's validation (scheduler/spec.py), the request bodies (http/wire.py), secrets,
the usage ledger and the artifact store (a digest is a file name there) all use them.
"""
from __future__ import annotations

import math
import re
from typing import Any, Literal, overload

from gpulayer.protocol.jobspec import DIGEST_PATTERN, LABEL_KEY_PATTERN, MAX_STR
from gpulayer.server.errors import InvalidRequest

# Validating patterns are used with .fullmatch() (and end in \Z, so that even a .match() is as strict):
# `$` also matches before a trailing newline, so "admin\n" would pass (docs/security.md, issue 22 item 8).
DIGEST = re.compile(DIGEST_PATTERN)
LABEL_KEY = re.compile(LABEL_KEY_PATTERN)


def fail(field: str, why: str) -> InvalidRequest:
    """The refusal of one field: `field: why`, a 400 (invalid_field)."""
    return InvalidRequest(f"{field}: {why}")


def integer(value: Any, field: str, lo: int, hi: int) -> int:
    """`value` as an int in [lo, hi] (not a bool); raises InvalidRequest naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(field, f"must be an integer, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise fail(field, f"must be between {lo} and {hi}, not {value}")
    return value


@overload
def number(value: Any, field: str, lo: float, hi: float, *, allow_none: Literal[False] = False) -> float: ...
@overload
def number(value: Any, field: str, lo: float, hi: float, *, allow_none: bool) -> float | None: ...
def number(value: Any, field: str, lo: float, hi: float, *, allow_none: bool = False) -> float | None:
    """`value` as a finite number in [lo, hi]; raises InvalidRequest naming `field`."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(field, "must be a finite number")
    if not lo <= value <= hi:
        raise fail(field, f"must be between {lo:g} and {hi:g}, not {value:g}")
    return value


@overload
def string(value: Any, field: str, *, limit: int = MAX_STR, allow_none: Literal[False] = False) -> str: ...
@overload
def string(value: Any, field: str, *, limit: int = MAX_STR, allow_none: bool) -> str | None: ...
def string(value: Any, field: str, *, limit: int = MAX_STR, allow_none: bool = False) -> str | None:
    """`value` as a str of at most `limit` UTF-8 bytes, without NUL; raises InvalidRequest naming `field`."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise fail(field, f"must be a string, not {type(value).__name__}")
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise fail(field, f"is longer than {limit} bytes")
    if "\x00" in value:
        raise fail(field, "must not contain NUL characters")
    return value


def mapping(value: Any, field: str) -> dict:
    """`value` if it is a JSON object; raises InvalidRequest naming `field`."""
    if not isinstance(value, dict):
        raise fail(field, f"must be an object, not {type(value).__name__}")
    return value



@overload
def digest(value: Any, field: str, *, allow_none: Literal[False]) -> str: ...
@overload
def digest(value: Any, field: str, *, allow_none: bool = True) -> str | None: ...
def digest(value: Any, field: str, *, allow_none: bool = True) -> str | None:
    """A `sha256:<64 lowercase hex>` digest, or None where allowed."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or not DIGEST.fullmatch(value):
        raise fail(field, "must be a digest written sha256:<64 lowercase hex digits>")
    return value


def relative_path(value: Any, field: str) -> str:
    """A relative path inside the task directory: no absolute path, no `..`."""
    path = string(value, field, limit=1024)
    parts = path.replace("\\", "/").split("/")
    if not path or path.startswith("/") or ".." in parts or "\x00" in path:
        raise fail(field, f"{path!r} must be a relative path inside the task directory (no leading / and no ..)")
    return path


def labels(value: Any, field: str = "labels") -> dict[str, str]:
    """{key: value} strings; keys start alphanumeric, then [A-Za-z0-9_.-/], at most 63 characters."""
    obj = mapping(value, field)
    if len(obj) > 64:
        raise fail(field, "at most 64 labels")
    for key, val in obj.items():
        label_key(key, field)
        string(val, f"{field}.{key}", limit=256)
    return dict(obj)


def label_key(key: Any, field: str) -> str:
    """A label key: 1-63 of [A-Za-z0-9_.-/], starting with a letter or digit; raises InvalidRequest naming
    `field`."""
    if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
        raise fail(field, f"label key {key!r} must be 1-63 of [A-Za-z0-9_.-/], starting with a letter or digit")
    return key




def check_digest(digest: str) -> str:
    """Refuse anything but `sha256:<64 lowercase hex>` (no path characters reach the filesystem)."""
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise InvalidRequest("artifact digest must be written sha256:<64 lowercase hex digits>", code="invalid_digest")
    return digest
