"""Browsing one table or view: filters, sorting and keyset paging as SQL.

The only SQL the explorer builds rather than reads from queries.sql: table and
column names are checked against the schema first, then quoted.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .queries import QUERIES
from gpulayer.server.store.readonly_sql import HIDDEN_COLUMNS, QueryError, Session, quote_identifier, row_dicts

DEFAULT_PAGE_SIZE = 100
ROWID = "_rowid"          # the extra column a table page selects for its `_next` key
HIDDEN_TEXT = "(hidden)"  # what a table page shows in place of a hidden column
_NUMERIC_TYPES = frozenset({"INTEGER", "INT", "REAL", "NUMERIC", ""})


class BadRequest(ValueError):
    """A browse parameter that names no column or cannot be read."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    pk: int
    hidden: bool


@dataclass(frozen=True)
class Relation:
    """A table or a view of the state file, as its schema says."""

    name: str
    kind: str  # 'table' or 'view'
    columns: tuple[Column, ...]

    @property
    def keyset(self) -> bool:
        """Tables page on rowid; views (no rowid) page on an offset."""
        return self.kind == "table"

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise BadRequest(f"{self.kind} {self.name} has no column {name!r}")


@dataclass
class Browse:
    """What the query string of a table page asks for."""

    filters: list[tuple[str, Any]] = field(default_factory=list)
    sort: str | None = None
    desc: bool = False
    next: str | None = None
    size: int = DEFAULT_PAGE_SIZE


def relations(session: Session) -> dict[str, str]:
    """{name: 'table' | 'view'} of everything a page may browse."""
    return {r["name"]: r["type"] for r in row_dicts(session.query(QUERIES["page_tables"].sql))}


def describe(session: Session, name: str) -> Relation | None:
    """The table or view called `name`, or None when the schema has none."""
    kind = relations(session).get(name)
    if kind is None:
        return None
    rows = row_dicts(session.query(QUERIES["page_columns"].sql, {"table": name}))
    columns = tuple(Column(r["name"], (r["type"] or "").upper(), r["pk"], (name, r["name"]) in HIDDEN_COLUMNS)
                    for r in rows)
    return Relation(name, kind, columns)


def parse_browse(relation: Relation, params: Mapping[str, str], max_rows: int) -> Browse:
    """Read `column=value` filters and the `_` control parameters; raises BadRequest."""
    browse = Browse()
    for key, value in params.items():
        if key.startswith("_"):
            continue
        column = relation.column(key)
        if column.hidden:
            raise BadRequest(f"column {relation.name}.{key} is hidden and cannot be filtered on")
        browse.filters.append((key, _typed(column, value)))
    sort_asc, sort_desc = params.get("_sort"), params.get("_sort_desc")
    if sort_asc and sort_desc:
        raise BadRequest("give _sort or _sort_desc, not both")
    sort_by = sort_asc or sort_desc
    if sort_by:
        column = relation.column(sort_by)
        if column.hidden:
            raise BadRequest(f"column {relation.name}.{column.name} is hidden and cannot be sorted on")
        browse.sort, browse.desc = column.name, bool(sort_desc)
    browse.next = params.get("_next") or None
    try:
        browse.size = max(1, min(int(params.get("_size") or DEFAULT_PAGE_SIZE), max_rows))
    except ValueError:
        raise BadRequest("_size must be a whole number") from None
    return browse


def _typed(column: Column, value: str) -> Any:
    """A filter value as the number it spells when the column holds numbers."""
    if column.type in _NUMERIC_TYPES:
        for convert in (int, float):
            try:
                return convert(value)
            except ValueError:
                pass
    return value


def select_page(relation: Relation, browse: Browse) -> tuple[str, dict[str, Any]]:
    """The SELECT for one page of `relation` and its parameters; raises BadRequest on a bad `_next`."""
    selected = [f"'{HIDDEN_TEXT}' AS {quote_identifier(c.name)}" if c.hidden else quote_identifier(c.name)
                for c in relation.columns]
    params: dict[str, Any] = {"_limit": browse.size + 1}
    where = []
    for i, (name, value) in enumerate(browse.filters):
        where.append(f"{quote_identifier(name)} = :f{i}")
        params[f"f{i}"] = value
    sort = quote_identifier(browse.sort) if browse.sort else None
    if relation.keyset:
        selected.append(f"rowid AS {ROWID}")
        order = "rowid" if sort is None else f"{sort}{' DESC' if browse.desc else ''}, rowid"
        if browse.next:
            where.append(_after(sort, browse.next, browse.desc, params))
        tail = f"ORDER BY {order} LIMIT :_limit"
    else:
        params["_offset"] = _offset(browse.next)
        order = f"ORDER BY {sort}{' DESC' if browse.desc else ''} " if sort else ""
        tail = f"{order}LIMIT :_limit OFFSET :_offset"
    sql = f"SELECT {', '.join(selected)} FROM {quote_identifier(relation.name)}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    return f"{sql} {tail}", params


def _after(sort: str | None, token: str, desc: bool, params: dict[str, Any]) -> str:
    """The keyset condition for rows after the `_next` token (NULLs sort first)."""
    try:
        if sort is None:
            params["_r"] = int(token)
            return "rowid > :_r"
        value, params["_r"] = json.loads(token)
        int(params["_r"])
    except (ValueError, TypeError):
        raise BadRequest(f"_next {token!r} is not a key this page gave out") from None
    params["_v"] = value
    if desc:
        if value is None:
            return f"({sort} IS NULL AND rowid > :_r)"
        return f"({sort} < :_v OR {sort} IS NULL OR ({sort} = :_v AND rowid > :_r))"
    if value is None:
        return f"({sort} IS NOT NULL OR rowid > :_r)"
    return f"({sort} > :_v OR ({sort} = :_v AND rowid > :_r))"


def _offset(token: str | None) -> int:
    try:
        return max(0, int(token or 0))
    except ValueError:
        raise BadRequest(f"_next {token!r} is not an offset this page gave out") from None


def next_token(relation: Relation, browse: Browse, rows: list[dict[str, Any]]) -> str:
    """The `_next` value for the page after `rows` (fewer than `_size` when the page hit its byte limit)."""
    last_row = rows[-1]
    if not relation.keyset:
        return str(_offset(browse.next) + len(rows))
    if browse.sort is None:
        return str(last_row[ROWID])
    return json.dumps([last_row[browse.sort], last_row[ROWID]], separators=(",", ":"))


def page(session: Session, relation: Relation, browse: Browse) -> tuple[list[str], list[tuple], str | None]:
    """One page of rows: (columns, rows, next token or None)."""
    sql, params = select_page(relation, browse)
    result = session.query(sql, params, max_rows=browse.size)
    records = row_dicts(result)
    token = next_token(relation, browse, records) if result.truncated and records else None
    keep = [i for i, name in enumerate(result.columns) if name != ROWID]
    columns = [result.columns[i] for i in keep]
    rows = [tuple(row[i] for i in keep) for row in result.rows]
    return columns, rows, token


def count(session: Session, name: str, time_limit_s: float) -> int | None:
    """The rows of a table or view (a name `relations` gave), or None past `time_limit_s`."""
    try:
        result = session.query(f"SELECT count(*) FROM {quote_identifier(name)}",
                               time_limit_s=time_limit_s)
    except QueryError:
        return None
    return result.rows[0][0]
