"""Named SQL blocks, read once from the .sql files of this folder.

A block starts with a line `-- name: <name> --`; the comment lines right after
it describe the query; everything up to the next name line is the SQL, one
statement. Python code calls `QUERIES["acquire_task"]`, never writes SQL inline.

Where a block lives: in `<owner>.sql`, the owner being the module that calls it,
by its file name (scheduler/placement.py: placement.sql; security/auth.py:
auth.sql; a package whose one caller is its loop, provisioning/: provisioning.sql).
A block that several modules call lives with the one whose job it is
(job_for_update and attempt_tasks with outcomes, gpus_in_use with placement).
tests/unit/test_schema.py checks that the owner calls every block of its file.
A module that moves keeps its file; one that is renamed renames it.

Names are one namespace across the files: a name a second block takes, in the
same file or another, fails the load.

Every file keeps the same conventions: :now is always a parameter, never the
wall clock, so tests pin time; active task states are 'assigned' and
'running'; a parameter that joins a view (`f.worker_id = CAST(:worker_id AS
INTEGER)`) is CAST, since SQLite 3.54 prepares a join whose key is a bare
parameter again on every run (one job's fit on one worker: ~170 us instead of
~13 us) and an expression it does not.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import apsw

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*) --\s*$", re.MULTILINE)
FOLDER = Path(__file__).resolve().parent


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


def load_folder(folder: Path = FOLDER) -> tuple[dict[str, str], dict[str, str]]:
    """({name: sql}, {name: owner}) of every .sql file of `folder`, the owner being the file's name without .sql.

    Raises ValueError on a name two blocks take, naming the file(s).
    """
    blocks: dict[str, str] = {}
    owner: dict[str, str] = {}
    for path in sorted(folder.glob("*.sql")):
        try:
            found = load(path)
        except ValueError as e:
            raise ValueError(f"{path.name}: {e}") from None
        for name, sql in found.items():
            if name in blocks:
                raise ValueError(f"duplicate query name {name!r} in {owner[name]}.sql and {path.name}")
            blocks[name] = sql
            owner[name] = path.stem
    return blocks, owner


QUERIES, OWNERS = load_folder()


def rows(conn: apsw.Connection, query: str, /, **params) -> list[dict]:
    """Run the named query; every row as a dict."""
    return _fetch(conn, query, params)


def _fetch(conn: apsw.Connection, query: str, params: dict) -> list[dict]:
    # store/db.py's connections all carry the row tracer that makes each row a dict; apsw's stubs type a tuple.
    return cast("list[dict]", conn.execute(QUERIES[query], params).fetchall())


PAGE_BYTES = 4 << 20  # a page of a list route holds at most about this much text (its first row whatever its size)


def page(conn: apsw.Connection, query: str, limit: int, /, budget: int = PAGE_BYTES, **params) -> tuple[list[dict], bool]:
    """Up to `limit` rows of the named query (which takes `:limit`: it is sent `limit` + 1) until their text and
    bytes reach `budget` (at least one row); and whether more rows follow.

    A page stays a few MB however large its rows' text (log lines, event
    data, specs): the rows past the page are never read.
    """
    found: list[dict] = []
    size = 0
    cursor = conn.execute(QUERIES[query], {**params, "limit": limit + 1})
    try:
        for item in cast("Iterator[dict]", cursor):  # rows are dicts: the row tracer (see _fetch)
            if len(found) == limit or size >= budget:
                return found, True
            found.append(item)
            size += sum(len(v) for v in item.values() if isinstance(v, (str, bytes)))
        return found, False
    finally:
        cursor.close()  # the statement's rest is never stepped through


def row(conn: apsw.Connection, query: str, /, **params) -> dict | None:
    """Run the named query; its first row, or None (where no row is a case the caller answers)."""
    found = _fetch(conn, query, params)
    return found[0] if found else None


class NoRow(LookupError):
    """A query that always returns a row returned none: a bug or a broken state file, answered as a 500."""


def one(conn: apsw.Connection, query: str, /, **params) -> dict:
    """Run the named query, which returns a row whenever its caller runs it (an aggregate, an INSERT ... RETURNING,
    a row the same transaction holds); its first row.

    Raises NoRow naming the query when none comes back.
    """
    found = _fetch(conn, query, params)
    if not found:
        raise NoRow(f"query {query!r} returned no row")
    return found[0]
