"""Who may look: a bearer token, or the session the login page opens (the `gpulayer_token` cookie).

With no `auth` callable the explorer is open (`gpulayer explore` on
127.0.0.1). With one, HTML requests without a valid token are sent to
`/-/login` (303) and `.json`/`.csv` requests get 401 `{"ok": false, "error"}`.
The cookie never holds the token: it holds a random session id that this
process keeps (hashed) with the token and an expiry; logout forgets it, and
every request checks the token again, so a rotated token ends its sessions.
"""
from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Callable

import falcon

from . import render
from .pages import DATA_FORMATS, Context, request_format

COOKIE = "gpulayer_token"
LOGIN_PATH = "/-/login"
OPEN_PATHS = (LOGIN_PATH, "/-/static/app.css")

SESSION_TTL_S = 12 * 3600.0
MAX_SESSIONS = 10_000   # past it, the oldest session is dropped

Auth = Callable[[str], bool]


class Sessions:
    """Open logins in memory: SHA-256 of the session id -> (token, expires at). Thread-safe."""

    def __init__(self, clock: Callable[[], float], ttl_s: float = SESSION_TTL_S):
        self.clock = clock
        self.ttl_s = ttl_s
        self._open: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def open(self, token: str) -> str:
        """A new session for `token`; returns its id (for the cookie, nowhere else)."""
        session_id = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            for key in [k for k, (_, expires) in self._open.items() if expires <= now]:
                del self._open[key]
            while len(self._open) >= MAX_SESSIONS:
                del self._open[next(iter(self._open))]
            self._open[_digest(session_id)] = (token, now + self.ttl_s)
        return session_id

    def token(self, session_id: str) -> str | None:
        """The token of an open, unexpired session, else None."""
        entry = self._open.get(_digest(session_id))
        if entry is None or entry[1] <= self.clock():
            return None
        return entry[0]

    def close(self, session_id: str) -> None:
        with self._lock:
            self._open.pop(_digest(session_id), None)


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()


def request_token(req: falcon.Request, sessions: Sessions) -> str | None:
    """The token of `Authorization: Bearer`, else of the cookie's session."""
    header = req.get_header("Authorization") or ""
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    cookies = req.get_cookie_values(COOKIE)
    return sessions.token(cookies[0]) if cookies else None


def safe_next(ctx: Context, target: str | None) -> str:
    """Where to go after login: a path inside the explorer, else its root."""
    root = ctx.links("/")
    base = ctx.links.base
    if target and target.startswith(base + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return root


class RequireToken:
    """Middleware: every request but the login page and the stylesheet needs a valid token."""

    def __init__(self, ctx: Context, auth: Auth, sessions: Sessions):
        self.ctx = ctx
        self.auth = auth
        self.sessions = sessions

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.path in {self.ctx.links(p) for p in OPEN_PATHS}:
            return
        token = request_token(req, self.sessions)
        if token and self.auth(token):
            return
        if request_format(req) in DATA_FORMATS:
            resp.status = falcon.HTTP_401
            resp.content_type = falcon.MEDIA_JSON
            resp.set_header("WWW-Authenticate", 'Bearer realm="gpulayer explorer"')
            resp.text = render.json_body({"ok": False, "error": "a client token is required: send "
                                          "'Authorization: Bearer <token>' or log in at " + self.ctx.links(LOGIN_PATH)})
        else:
            target = req.path + (f"?{req.query_string}" if req.query_string else "")
            resp.status = falcon.HTTP_303
            resp.location = self.ctx.links(LOGIN_PATH, next=target)
        resp.complete = True


class LoginPage:
    """`/-/login`: a form that takes the client token, opens a session and sets its cookie."""

    def __init__(self, ctx: Context, auth: Auth, sessions: Sessions, secure_cookies: bool):
        self.ctx = ctx
        self.auth = auth
        self.sessions = sessions
        self.secure = secure_cookies

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.ctx.html(resp, "login.html", title="Log in", next=safe_next(self.ctx, req.get_param("next")),
                      error=None)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        form = req.get_media(default_when_empty={}) if req.content_length else {}
        token = str(form.get("token") or "").strip()
        target = safe_next(self.ctx, form.get("next"))
        if not token or not self.auth(token):
            self.ctx.html(resp, "login.html", falcon.HTTP_401, title="Log in", next=target,
                          error="That token is not a valid client token.")
            return
        resp.set_cookie(COOKIE, self.sessions.open(token), http_only=True, same_site="Strict", secure=self.secure,
                        path=self.ctx.links.base or "/")
        resp.status = falcon.HTTP_303
        resp.location = target


class LogoutPage:
    """`/-/logout` (POST): close the session and forget the cookie."""

    def __init__(self, ctx: Context, sessions: Sessions, secure_cookies: bool):
        self.ctx = ctx
        self.sessions = sessions
        self.secure = secure_cookies

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        for session_id in req.get_cookie_values(COOKIE) or ():
            self.sessions.close(session_id)
        resp.unset_cookie(COOKIE, path=self.ctx.links.base or "/")
        resp.status = falcon.HTTP_303
        resp.location = self.ctx.links(LOGIN_PATH)
