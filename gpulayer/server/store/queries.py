"""Named SQL blocks, read once from the .sql files beside this module.

A block starts with a line `-- name: <name> --`; the comment lines right after
it describe the query; everything up to the next name line is the SQL.
Python code calls `QUERIES["acquire_task"]`, never writes SQL inline.
"""
from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*) --\s*$", re.MULTILINE)


def parse_blocks(text: str) -> dict[str, str]:
    """Split `text` into {name: sql}; raises ValueError on a duplicate name."""
    parts = _NAME.split(text)
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in blocks:
            raise ValueError(f"duplicate query name {name!r}")
        blocks[name] = body.strip()
    return blocks


def load(path: Path) -> dict[str, str]:
    """The named blocks of one .sql file."""
    return parse_blocks(path.read_text(encoding="utf-8"))


QUERIES: dict[str, str] = load(Path(__file__).with_name("queries.sql"))


def rows(conn, query: str, /, **params) -> list[dict]:
    """Run the named query; every row as a dict."""
    return conn.execute(QUERIES[query], params).fetchall()


PAGE_BYTES = 4 << 20  # a page of a list route holds at most about this much text (its first row whatever its size)


def page(conn, query: str, limit: int, /, budget: int = PAGE_BYTES, **params) -> tuple[list[dict], bool]:
    """Up to `limit` rows of the named query (which takes `:limit`: it is sent `limit` + 1) until their text and
    bytes reach `budget` (at least one row); and whether more rows follow.

    A page stays a few MB however large its rows' text (log lines, event
    data, specs): the rows past the page are never read.
    """
    found: list[dict] = []
    size = 0
    cursor = conn.execute(QUERIES[query], {**params, "limit": limit + 1})
    try:
        for item in cursor:
            if len(found) == limit or size >= budget:
                return found, True
            found.append(item)
            size += sum(len(v) for v in item.values() if isinstance(v, (str, bytes)))
        return found, False
    finally:
        cursor.close()  # the statement's rest is never stepped through


def row(conn, query: str, /, **params) -> dict | None:
    """Run the named query; its first row, or None."""
    found = conn.execute(QUERIES[query], params).fetchall()
    return found[0] if found else None
