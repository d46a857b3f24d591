"""The explorer's SQL: named blocks of explorer/queries.sql, read once.

`QUERIES["queued_jobs"]` is a `Query`. Names starting with `page_` feed the
explorer's own pages; the others are the canned queries in `CANNED`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

QUERIES_PATH = Path(__file__).with_name("queries.sql")
PAGE_PREFIX = "page_"
_NAME_LINE = re.compile(r"^-- name: ([a-z_][a-z0-9_]*) --\s*$", re.MULTILINE)

SECONDS_PER_WEEK = 7 * 86400


@dataclass(frozen=True)
class Query:
    """One named block: what it answers and its statement."""

    name: str
    description: str
    sql: str


def parse_queries(text: str) -> dict[str, Query]:
    """Split the text of a queries file into its named blocks.

    Raises ValueError on a block without its `-- ` description line or SQL,
    or on a name used twice.
    """
    parts = _NAME_LINE.split(text)
    queries: dict[str, Query] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        first, _, sql = body.lstrip("\n").partition("\n")
        if not first.startswith("-- ") or not sql.strip():
            raise ValueError(f"query {name}: a '-- ' description line and SQL must follow its name line")
        if name in queries:
            raise ValueError(f"query {name} is defined twice")
        queries[name] = Query(name, first[3:].strip(), sql.strip())
    return queries


def param_defaults(now: float) -> dict[str, float]:
    """Values for the time parameters a form leaves empty."""
    return {"now": now, "since": now - SECONDS_PER_WEEK, "until": now}


QUERIES = parse_queries(QUERIES_PATH.read_text(encoding="utf-8"))
CANNED = {name: q for name, q in QUERIES.items() if not name.startswith(PAGE_PREFIX)}
