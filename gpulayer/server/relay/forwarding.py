"""What the ingress (server/relay/ingress.py) passes on to a replica and what it keeps: the request's headers
(hop-by-hop ones and the caller's credentials out, X-Forwarded-* in), its target (the ingress's `token` taken
out of the query, whatever its spelling), and its own cookie.
"""

from __future__ import annotations

from http.cookies import CookieError, SimpleCookie
from urllib.parse import quote, unquote_plus

PREFIX = "/ingress/"
COOKIE = "gpulayer_ingress"
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-authenticate",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-prefix",
        "x-forwarded-host",
    }
)
SAFE_PATH = "/:@!$&'()*+,;=-._~"

def upstream_headers(scope, job_id: int, strip: bool, websocket: bool = False) -> tuple[list[tuple[str, str]], bool]:
    """The request's headers as the replica gets them (hop-by-hop ones and the caller's credentials out,
    X-Forwarded-* in), and whether it has a body."""
    out: list[tuple[str, str]] = []
    named: dict[str, str] = {}
    for name, value in scope.headers.items():
        lower = name.lower()
        named[lower] = value
        if lower in HOP_BY_HOP or (websocket and lower.startswith("sec-websocket-")):
            continue
        if strip and lower == "authorization":
            continue
        if lower == "cookie":
            value = _cookies_without_ours(value)
            if not value:
                continue
        out.append((lower, value))
    if "host" not in named:
        out.insert(0, ("host", scope.authority or "localhost"))
    client = scope.client.rpartition(":")[0].strip("[]")
    forwarded_for = named.get("x-forwarded-for")
    out += [
        ("x-forwarded-for", f"{forwarded_for}, {client}" if forwarded_for else client),
        ("x-forwarded-proto", scope.scheme),
        ("x-forwarded-prefix", f"{PREFIX}{job_id}"),
        ("x-forwarded-host", named.get("host") or scope.authority or ""),
    ]
    if websocket:
        return out, False
    out.append(("connection", "close"))
    length = named.get("content-length")
    if "transfer-encoding" in named or (length is None and scope.method.upper() in ("POST", "PUT", "PATCH") and scope.http_version.startswith("2")):
        out = [(n, v) for n, v in out if n != "content-length"]
        out.append(("transfer-encoding", "chunked"))
        return out, True
    return out, bool(length and length.strip() != "0")


def cookie_token(header: str | None) -> str | None:
    if not header:
        return None
    try:
        jar = SimpleCookie(header)
    except CookieError:
        return None
    found = jar.get(COOKIE)
    return found.value if found is not None else None


def _cookies_without_ours(header: str) -> str:
    """The Cookie header less the ingress's own, however spaced (as SimpleCookie reads the name)."""
    return "; ".join(part.strip() for part in header.split(";") if part.strip() and part.partition("=")[0].strip() != COOKIE)


def target(rest: str, query: str, strip: bool) -> str:
    """The request-target the replica gets: the path percent-encoded again (RSGI gives it decoded), the query
    as sent, less the ingress's `token` when the ingress checked the caller (`strip`)."""
    query = query_without_token(query) if strip else query
    return quote(rest, safe=SAFE_PATH) + (f"?{query}" if query else "")


def query_without_token(query: str) -> str:
    """The query as the replica gets it: every parameter whose name decodes to `token` (the ingress's, read with
    parse_qsl: `token=`, `%74oken=`, `tok%65n=`) taken out, the rest as sent."""
    return "&".join(part for part in query.split("&") if unquote_plus(part.partition("=")[0]) != "token")


__all__ = ["COOKIE", "HOP_BY_HOP", "PREFIX", "SAFE_PATH", "cookie_token", "target", "upstream_headers"]
