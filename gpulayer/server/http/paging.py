"""Pages of the list routes: `limit` and a cursor in; a page and `next` (the cursor of the page after it) out.

One table says every list route's bounds, so the routes, the OpenAPI document
and the test that every list is bounded read the same numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpulayer.server.errors import InvalidRequest
from gpulayer.server.http import wire

MAX_CURSOR_TEXT = 256  # a name cursor (users, projects, secrets) is at most this long


@dataclass(frozen=True)
class Paging:
    """A list route's page: `limit` from 1 to `maximum` (`default` when absent), and the query parameter
    (`cursor`) that takes a page's `next` back: an integer (a sequence number, an id, a position), or a
    name (`text`). A followed list (a log) has no last page: its `next` is never null."""

    default: int
    maximum: int
    cursor: str = "after"
    text: bool = False
    followed: bool = False

    def describe(self) -> str:
        last = ("never null: an empty page says there is nothing newer yet" if self.followed
                else "null: this page is the last")
        return (f"a page of at most `limit` (default {self.default}, at most {self.maximum}) and a few MB; pass "
                f"`next` back as `{self.cursor}` for the page after it ({last})")


ROUTES = {
    "/v1/jobs": Paging(100, 1000, "before"),
    "/v1/jobs/{job_id}/events": Paging(1000, 10_000),
    "/v1/jobs/{job_id}/logs": Paging(1000, 10_000, followed=True),
    "/v1/jobs/{job_id}/checkpoints": Paging(1000, 1000),
    "/v1/workers": Paging(1000, 1000),
    "/v1/provisioners": Paging(100, 1000, "before"),
    "/v1/tokens": Paging(1000, 1000),
    "/v1/secrets": Paging(1000, 1000, text=True),
    "/v1/users": Paging(1000, 1000, text=True),
    "/v1/projects": Paging(1000, 1000, text=True),
    "/v1/webhooks": Paging(1000, 1000),
    "/v1/alerts": Paging(1000, 1000),
    "/v1/usage": Paging(1000, 1000),                  # `after`: how many rows came before (the rows are sums)
}


def params(req, route: str):
    """(`limit`, cursor) of a request to a list route; 400 naming the parameter for a bad one.

    The cursor's absence is the first page: 0 for an integer `after`, "" for a
    name, None for `before`.
    """
    paging = ROUTES[route]
    limit = wire.query_int(req, "limit", paging.default, 1, paging.maximum)
    if paging.text:
        return limit, _text_cursor(req, paging.cursor)
    return limit, wire.query_int(req, paging.cursor, None if paging.cursor == "before" else 0,
                                 1 if paging.cursor == "before" else 0, 1 << 62)


def _text_cursor(req, name: str) -> str:
    raw = req.get_param(name) or ""
    if len(raw) > MAX_CURSOR_TEXT or not raw.isprintable():
        raise InvalidRequest(f"{name}: must be the `next` of a page (a name of at most {MAX_CURSOR_TEXT} "
                             "printable characters)", field=name)
    return raw


def cut(found: list, limit: int) -> tuple[list, bool]:
    """The first `limit` of `found` (fetched as `limit` + 1), and whether more follow."""
    return found[:limit], len(found) > limit


def answer(name: str, found: list, more: bool, key: str, **extra) -> dict:
    """{`name`: found, `next`: the `key` of its last item when more follow, else null}, with `extra` fields."""
    return {name: found, **extra, "next": found[-1][key] if more and found else None}
