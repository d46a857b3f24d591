"""Read-only SQL on the state file: the runner behind the explorer's pages and the alerts' queries.

Three locks, each enough alone: the file is opened `mode=ro`, the connection
sets `PRAGMA query_only`, and an authorizer refuses every action that is not
a read (writes, ATTACH, transactions, pragmas outside `SAFE_PRAGMAS`,
`load_extension`). On top: one statement per query, a time limit (progress
handler) and a row limit. Columns in `HIDDEN_COLUMNS` cannot be read at all.

It imports nothing of gpulayer (the standalone explorer imports it), and its
refusals speak of the explorer, whose users read them most; notify/alerts.py
words them for an alert. `gpulayer sql` hides the same `HIDDEN_COLUMNS`.

Each `ReadOnlyDatabase.session()` is a fresh connection holding one short
read transaction, so a page sees one snapshot and the server's writer (WAL)
is never blocked.
"""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import apsw

# Secrets' stand-ins: never shown, never readable from SQL (`gpulayer sql` reads them as NULL).
HIDDEN_COLUMNS = frozenset({
    ("tokens", "token_hash"),
    ("workers", "session_hash"),
    ("secrets", "ciphertext"),
    ("webhooks", "secret"),
})

# Pragmas that only describe the schema, whatever their argument.
SAFE_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "collation_list", "function_list", "module_list", "pragma_list",
})
# Settings that may be read (no argument), never set.
READABLE_SETTINGS = frozenset({
    "user_version", "schema_version", "data_version", "application_id", "encoding",
    "page_size", "page_count", "freelist_count", "compile_options",
    "query_only", "foreign_keys",
})
DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})

PROGRESS_STEPS = 1000  # VM steps between deadline checks: ~tens of microseconds
# One VM step can allocate a whole value (zeroblob(1e9) is one step), so the
# deadline alone cannot bound a query: every value is capped at MAX_VALUE_BYTES
# (twice the 1 MiB request body; a spec of mostly non-Latin text, stored with
# \u escapes, can pass it and then reads as a 400), a result row at
# MAX_COLUMNS columns and a result at MAX_RESULT_BYTES.
MAX_VALUE_BYTES = 2_000_000
MAX_COLUMNS = 64            # the widest table has 22
MAX_RESULT_BYTES = 8_000_000
SQLITE_INTEGERS = range(-2**63, 2**63)
# Built-ins whose one call costs about len(first argument) * len(second): one VM
# step the deadline cannot stop (trim() of two 100 kB strings runs 40 s). Past
# its budget (~0.1 s of work) a call is refused; under it SQLite's own runs.
COSTLY_FUNCTIONS = {  # (name, arguments): budget of len * len
    ("instr", 2): 2_500_000_000, ("replace", 3): 2_500_000_000,
    ("trim", 2): 25_000_000, ("ltrim", 2): 25_000_000, ("rtrim", 2): 25_000_000,
}

_ERROR_SUBJECT = re.compile(r'(?:no such (?:table|column|function): |near ")([^"\s]+)')
_LEADING_NOISE = re.compile(r"(?:\s+|;|--[^\n]*(?:\n|$)|/\*.*?(?:\*/|$))", re.DOTALL)


class QueryError(Exception):
    """A query the explorer refused or SQLite failed; `offset` points into `sql`."""

    def __init__(self, message: str, sql: str = "", offset: int | None = None):
        super().__init__(message)
        self.message = message
        self.sql = sql
        self.offset = offset

    @property
    def location(self) -> tuple[int, int] | None:
        """(line, column), both from 1, of `offset` in `sql`."""
        if self.offset is None:
            return None
        before = self.sql[: self.offset]
        return before.count("\n") + 1, self.offset - (before.rfind("\n") + 1) + 1

    def __str__(self) -> str:
        if self.location is None:
            return self.message
        line, column = self.location
        near = self.sql[self.offset:].split("\n", 1)[0][:40]
        return f"{self.message} (line {line}, column {column}: {near!r})"


class QueryTimeout(QueryError):
    """The query ran past the time limit and was interrupted."""


@dataclass
class Result:
    """What a query returned: at most `max_rows` rows, `truncated` when there were more."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool = False


def row_bytes(row: tuple[Any, ...]) -> int:
    """Roughly what a row weighs once rendered: its text and blobs' lengths, 8 a number."""
    return sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)


class _Missing(dict):
    """Bindings where a parameter nobody filled in is NULL."""

    def __missing__(self, key: str) -> None:
        return None


class _Guard:
    """The authorizer: allows reads, refuses the rest and remembers why."""

    def __init__(self) -> None:
        self.internal = False   # our own BEGIN/ROLLBACK around a session
        self.refusal: str | None = None

    def __call__(self, code: int, arg1: str | None, arg2: str | None, db: str | None, view: str | None) -> int:
        if self.internal:
            return apsw.SQLITE_OK
        reason = refusal(code, arg1, arg2)
        if reason is None:
            return apsw.SQLITE_OK
        self.refusal = self.refusal or reason
        return apsw.SQLITE_DENY

    def reset(self) -> None:
        self.refusal = None


def refusal(code: int, arg1: str | None, arg2: str | None) -> str | None:
    """Why the explorer refuses one authorizer action, or None to allow it."""
    if code in (apsw.SQLITE_SELECT, apsw.SQLITE_RECURSIVE):
        return None
    if code == apsw.SQLITE_READ:
        if (arg1, arg2) in HIDDEN_COLUMNS:
            return f"column {arg1}.{arg2} is hidden in the explorer; name the columns you need instead of *"
        return None
    if code == apsw.SQLITE_FUNCTION:
        if (arg2 or "").lower() in DENIED_FUNCTIONS:
            return f"{arg2}() is not allowed in the explorer"
        return None
    if code == apsw.SQLITE_PRAGMA:
        name = (arg1 or "").lower()
        if name in SAFE_PRAGMAS or (name in READABLE_SETTINGS and arg2 is None):
            return None
        if name in READABLE_SETTINGS:
            return f"PRAGMA {name} may be read but not set: the explorer is read-only"
        allowed = ", ".join(sorted(SAFE_PRAGMAS | READABLE_SETTINGS))
        return f"PRAGMA {name} is not allowed in the explorer; allowed: {allowed}"
    if code in (apsw.SQLITE_ATTACH, apsw.SQLITE_DETACH):
        return "ATTACH, DETACH and VACUUM INTO are not allowed: the explorer reads only the state file"
    if code in (apsw.SQLITE_TRANSACTION, apsw.SQLITE_SAVEPOINT):
        return "BEGIN, COMMIT, ROLLBACK and SAVEPOINT are not allowed: each query runs on its own"
    return "the explorer is read-only: " + _write_action(code, arg1, arg2) + " is not allowed"


def _write_action(code: int, arg1: str | None, arg2: str | None) -> str:
    """A refused write in words."""
    if code in _WRITES and arg1 in _SCHEMA_TABLES:
        # CREATE, DROP and ANALYZE show up first as writes to the schema table.
        return "changing the schema (CREATE, DROP, ALTER, ANALYZE)"
    if code in _WRITES:
        return f"{_WRITES[code]} {arg1}"
    if code == apsw.SQLITE_ALTER_TABLE:
        return f"ALTER TABLE {arg2}"
    action = str(apsw.mapping_authorizer_function.get(code, code)).removeprefix("SQLITE_").replace("_", " ")
    return f"{action} {arg1}" if arg1 else action


_WRITES = {apsw.SQLITE_INSERT: "INSERT into", apsw.SQLITE_UPDATE: "UPDATE of", apsw.SQLITE_DELETE: "DELETE from"}
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"})


def _rest_is_empty(rest: str) -> bool:
    """True when only whitespace, comments and semicolons follow a statement."""
    position = 0
    while match := _LEADING_NOISE.match(rest, position):
        position = match.end()
    return position == len(rest)


def _offset_of(message: str, sql: str, offset: int) -> int | None:
    """SQLite's error offset, or where the name its message quotes appears."""
    if offset >= 0:
        return offset
    match = _ERROR_SUBJECT.search(message)
    if match is None:
        return None
    name = match.group(1).rsplit(".", 1)[-1]
    found = re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", sql, re.IGNORECASE)
    return found.start() if found else None


class Session:
    """One read-only connection and its read transaction, for one request."""

    def __init__(self, conn: apsw.Connection, guard: _Guard, time_limit_s: float, max_rows: int):
        self.conn = conn
        self.guard = guard
        self.time_limit_s = time_limit_s
        self.max_rows = max_rows

    def query(self, sql: str, params: Mapping[str, Any] | None = None, *,
              max_rows: int | None = None, time_limit_s: float | None = None) -> Result:
        """Run one read-only statement; raises QueryError (QueryTimeout past the time limit)."""
        limit = self.max_rows if max_rows is None else max_rows
        seconds = self.time_limit_s if time_limit_s is None else time_limit_s
        if _rest_is_empty(sql):
            raise QueryError("the query is empty", sql)
        columns: list[str] = []
        cursor = self.conn.cursor()
        cursor.exec_trace = lambda cur, statement, _bindings: self._check(sql, cur, statement, columns)
        deadline = time.monotonic() + seconds
        self.conn.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
        self.guard.reset()
        rows: list[tuple[Any, ...]] = []
        size = 0
        try:
            for row in cursor.execute(sql, _Missing(params or {})):
                size += row_bytes(row)
                if size > MAX_RESULT_BYTES and not rows:
                    raise QueryError(f"one row of the result is over {MAX_RESULT_BYTES} bytes: "
                                     "select fewer or shorter columns (substr())", sql)
                rows.append(row)
                if len(rows) > limit or size > MAX_RESULT_BYTES:
                    break
        except QueryError as e:
            if not e.sql:   # raised by a guarded function, which does not know the query
                raise QueryError(e.message, sql) from None
            raise
        except apsw.InterruptError:
            raise QueryTimeout(f"query took longer than {float(seconds)} s and was stopped", sql) from None
        except apsw.TooBigError:
            raise QueryError(f"string or blob too big: the explorer allows values up to {MAX_VALUE_BYTES} bytes "
                             f"and results up to {MAX_COLUMNS} columns", sql) from None
        except OverflowError:
            raise QueryError("a number is too large for SQLite: integers run from -2**63 to 2**63-1", sql) from None
        except apsw.AuthError as e:
            raise QueryError(self.guard.refusal or str(e), sql) from None
        except apsw.ReadOnlyError as e:
            raise QueryError(f"the explorer is read-only: {e}", sql) from None
        except apsw.Error as e:
            if self.guard.refusal:
                raise QueryError(self.guard.refusal, sql) from None
            message = str(e)
            raise QueryError(message, sql, _offset_of(message, sql, getattr(e, "error_offset", -1))) from None
        finally:
            self.conn.set_progress_handler(None)
            cursor.close(force=True)
        truncated = len(rows) > limit or size > MAX_RESULT_BYTES
        return Result(columns, rows[:limit], truncated=truncated)

    def parameters(self, sql: str) -> list[str]:
        """The names of the `:named` parameters of one statement, without running it."""
        names: list[str] = []

        def stop(cur: apsw.Cursor, statement: str, _bindings: Any) -> bool:
            self._check(sql, cur, statement, [])
            names.extend(n.lstrip(":@$") for n in cur.bindings_names if n)
            return False

        cursor = self.conn.cursor()
        cursor.exec_trace = stop
        self.guard.reset()
        try:
            cursor.execute(sql, _Missing())
        except apsw.ExecTraceAbort:
            pass
        except apsw.AuthError as e:
            raise QueryError(self.guard.refusal or str(e), sql) from None
        except apsw.Error as e:
            if self.guard.refusal:
                raise QueryError(self.guard.refusal, sql) from None
            message = str(e)
            raise QueryError(message, sql, _offset_of(message, sql, getattr(e, "error_offset", -1))) from None
        return list(dict.fromkeys(names))

    @staticmethod
    def _check(sql: str, cur: apsw.Cursor, statement: str, columns: list[str]) -> bool:
        """The exec tracer: refuses a second statement or a writing one before it runs."""
        start = sql.find(statement)
        if start >= 0 and not _rest_is_empty(sql[start + len(statement):]):
            raise QueryError("only one statement per query: remove what follows the first ';'",
                             sql, start + len(statement))
        if not cur.is_readonly:
            raise QueryError("the explorer is read-only: this statement would write", sql)
        columns[:] = [name for name, _type in cur.get_description()]
        return True


class ReadOnlyDatabase:
    """The state file, opened read-only once per session."""

    def __init__(self, path: str, *, time_limit_s: float = 1.0, max_rows: int = 1000):
        self.path = str(path)
        self.time_limit_s = time_limit_s
        self.max_rows = max_rows

    def connect(self) -> tuple[apsw.Connection, _Guard]:
        """A new connection: `mode=ro`, query_only, no extensions, the authorizer on."""
        uri = "file:" + _uri_path(self.path) + "?mode=ro"
        conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
        conn.set_busy_timeout(1000)
        conn.execute("PRAGMA query_only = 1")
        conn.enable_load_extension(False)
        conn.limit(apsw.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        conn.limit(apsw.SQLITE_LIMIT_COLUMN, MAX_COLUMNS)
        for (name, arguments), budget in COSTLY_FUNCTIONS.items():
            conn.create_scalar_function(name, _guarded(name, arguments, budget), arguments, deterministic=True)
        guard = _Guard()
        conn.authorizer = guard
        return conn, guard

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One connection and one read snapshot for a request; closed on exit."""
        conn, guard = self.connect()
        try:
            with _internal(guard):
                conn.execute("BEGIN")
            yield Session(conn, guard, self.time_limit_s, self.max_rows)
        finally:
            with _internal(guard):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            conn.close()


@contextmanager
def _internal(guard: _Guard) -> Iterator[None]:
    guard.internal = True
    try:
        yield
    finally:
        guard.internal = False


_builtins = threading.local()   # per thread: an apsw connection is used by one thread at a time


def _guarded(name: str, arguments: int, budget: int) -> Callable[..., Any]:
    """`name` as SQLite has it, refused (QueryError) when the first two arguments' lengths multiply past `budget`."""
    sql = f"SELECT {name}({', '.join('?' * arguments)})"

    def call(*args: Any) -> Any:
        first, second = (len(a) if isinstance(a, (str, bytes)) else len(str(a)) for a in args[:2])
        if first * second > budget:
            raise QueryError(f"{name}() on values this long ({first} and {second}) would take too long: "
                             "shorten them first (substr())")
        if not hasattr(_builtins, "conn"):
            _builtins.conn = apsw.Connection(":memory:")
        return _builtins.conn.execute(sql, args).fetchone()[0]

    return call


def _uri_path(path: str) -> str:
    """A file path as a SQLite URI path (`?` and `#` escaped)."""
    return path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")


def quote_identifier(name: str) -> str:
    """`name` as an SQL identifier in double quotes."""
    return '"' + name.replace('"', '""') + '"'


def row_dicts(result: Result) -> list[dict[str, Any]]:
    """The rows of a result as {column: value} dicts."""
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def first(result: Result) -> dict[str, Any] | None:
    """The first row of a result as a dict, or None."""
    rows = row_dicts(result)
    return rows[0] if rows else None


__all__ = (
    "HIDDEN_COLUMNS", "QueryError", "QueryTimeout", "ReadOnlyDatabase", "Result", "Session",
    "quote_identifier", "row_dicts", "first",
)
