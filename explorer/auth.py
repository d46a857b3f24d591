"""Who may look: a bearer token or the `gpulayer_token` cookie the login page sets.

With no `auth` callable the explorer is open (`gpulayer explore` on
127.0.0.1). With one, HTML requests without a valid token are sent to
`/-/login` (303) and `.json`/`.csv` requests get 401 `{"ok": false, "error"}`.
"""
from __future__ import annotations

from collections.abc import Callable

import falcon

from . import render
from .pages import DATA_FORMATS, Context, request_format

COOKIE = "gpulayer_token"
LOGIN_PATH = "/-/login"
OPEN_PATHS = (LOGIN_PATH, "/-/static/app.css")

Auth = Callable[[str], bool]


def request_token(req: falcon.Request) -> str | None:
    """The token of `Authorization: Bearer`, else of the cookie."""
    header = req.get_header("Authorization") or ""
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    cookies = req.get_cookie_values(COOKIE)
    return cookies[0] if cookies else None


def safe_next(ctx: Context, target: str | None) -> str:
    """Where to go after login: a path inside the explorer, else its root."""
    root = ctx.links("/")
    base = ctx.links.base
    if target and target.startswith(base + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return root


class RequireToken:
    """Middleware: every request but the login page and the stylesheet needs a valid token."""

    def __init__(self, ctx: Context, auth: Auth):
        self.ctx = ctx
        self.auth = auth

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.path in {self.ctx.links(p) for p in OPEN_PATHS}:
            return
        token = request_token(req)
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
    """`/-/login`: a form that takes the client token and sets the cookie."""

    def __init__(self, ctx: Context, auth: Auth, secure_cookies: bool):
        self.ctx = ctx
        self.auth = auth
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
        resp.set_cookie(COOKIE, token, http_only=True, same_site="Strict", secure=self.secure,
                        path=self.ctx.links.base or "/")
        resp.status = falcon.HTTP_303
        resp.location = target


class LogoutPage:
    """`/-/logout` (POST): forget the cookie."""

    def __init__(self, ctx: Context, secure_cookies: bool):
        self.ctx = ctx
        self.secure = secure_cookies

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.unset_cookie(COOKIE, path=self.ctx.links.base or "/")
        resp.status = falcon.HTTP_303
        resp.location = self.ctx.links(LOGIN_PATH)
