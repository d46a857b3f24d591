"""create_app(): the explorer's routes on one read-only view of the state file."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import falcon

from . import auth as auth_
from . import pages, render
from gpulayer.server.store.readonly_sql import QueryError, ReadOnlyDatabase

STATIC = Path(__file__).with_name("static")
# Only our own stylesheet may load: no script, no frame, no form posting elsewhere.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",   # URLs carry SQL and filter values
}


class SecurityHeaders:
    """Middleware: SECURITY_HEADERS on every answer, errors and redirects included."""

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         req_succeeded: bool) -> None:
        resp.set_headers(SECURITY_HEADERS)


def create_app(state_path: str, *, auth: Callable[[str], bool] | None = None, secure_cookies: bool = False,
               time_limit_s: float = 1.0, max_rows: int = 1000, base_path: str = "",
               clock: Callable[[], float] = time.time) -> falcon.App:
    """The explorer as a WSGI app over the state file at `state_path`, read-only.

    `auth(token) -> bool` checks a client token; None leaves the explorer open.
    `base_path` ("/explorer") is the prefix every route and link carries when
    the app is mounted under one. `clock` gives `:now` for canned queries and
    times login sessions (SESSION_TTL_S).
    """
    base = base_path.rstrip("/")
    ctx = pages.Context(db=ReadOnlyDatabase(state_path, time_limit_s=time_limit_s, max_rows=max_rows),
                        env=render.environment(), links=render.Links(base), clock=clock,
                        auth_enabled=auth is not None)
    sessions = auth_.Sessions(clock)
    middleware = [SecurityHeaders(), *([auth_.RequireToken(ctx, auth, sessions)] if auth is not None else [])]
    app = falcon.App(middleware=middleware)  # type: ignore[arg-type]  # falcon types middleware as protocols
    app.req_options.strip_url_path_trailing_slash = True
    app.resp_options.secure_cookies_by_default = secure_cookies

    handle_error = pages.handler_for(ctx)
    for error in (pages.ExplorerError, QueryError, pages.browse.BadRequest):
        app.add_error_handler(error, handle_error)

    app.add_route(base or "/", pages.HomePage(ctx))
    app.add_route(f"{base}/-/tables", pages.TablesPage(ctx))
    app.add_route(f"{base}/{{table}}", pages.TablePage(ctx))
    query = pages.QueryPage(ctx)
    for suffix in ("", ".json", ".csv"):
        app.add_route(f"{base}/-/query{suffix}", query)
    app.add_route(f"{base}/-/queries/{{name}}", pages.CannedPage(ctx))
    app.add_route(f"{base}/-/workers", pages.WorkersPage(ctx))
    app.add_route(f"{base}/-/workers/{{worker_id:int}}", pages.WorkerPage(ctx))
    app.add_route(f"{base}/-/jobs/{{job_id:int}}", pages.JobPage(ctx))
    app.add_route(f"{base}/-/static/app.css", pages.Stylesheet((STATIC / "app.css").read_bytes()))
    if auth is not None:
        app.add_route(f"{base}{auth_.LOGIN_PATH}", auth_.LoginPage(ctx, auth, sessions, secure_cookies))
        app.add_route(f"{base}/-/logout", auth_.LogoutPage(ctx, sessions, secure_cookies))
    return app
