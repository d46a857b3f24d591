"""`gpulayer sql`: one SELECT on a control plane's state file, read-only, for ops (docs/sql.md).

The file is opened with the standard library's sqlite3 in read-only mode
(`file:...?mode=ro`), so no statement can change it while the control plane
runs; sqlite-utils (`Database.query`) runs the statement, refuses one that
returns no rows, and yields the rows as dicts. sqlite-utils comes with the
`server` extra; without it the command ends with the hint of cli/app.py.
"""
from __future__ import annotations

import csv
import sqlite3
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from gpulayer.cli.common import fail, home_of, parse_pairs, print_json, print_table

#: The state file's name in a home (gpulayer.server.config.HomeLayout.state, which the CLI may not import).
STATE_FILE = "state.db"


def sql(ctx: typer.Context,
        query: Annotated[str, typer.Argument(help="One SELECT (or WITH ... SELECT, or a read-only PRAGMA), or the name of one of the explorer's canned queries (gpus_held_idle: GPU-hours held under the idle threshold by user and project, the last 7 days).")],
        home: Annotated[Optional[Path], typer.Option("--home", envvar="GPULAYER_HOME", show_envvar=True, help="The control plane's home directory (default ~/.gpulayer).")] = None,
        state: Annotated[Optional[Path], typer.Option("--state", help="State file to open (default: HOME/state.db).")] = None,
        param: Annotated[Optional[list[str]], typer.Option("--param", "-p", help="K=V: a value for :K in the query; repeatable.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the rows as a JSON list of objects.")] = False,
        as_csv: Annotated[bool, typer.Option("--csv", help="Print the rows as CSV with a header line.")] = False) -> None:
    """Run a read-only query on the state file and print its rows.

    \b
    Examples:
      gpulayer sql "SELECT state, count(*) FROM jobs GROUP BY state"
      gpulayer sql --json -p id=12 "SELECT * FROM events WHERE job_id = :id"
      gpulayer sql gpus_held_idle
    """
    from sqlite_utils import Database  # the server extra: missing, cli/app.py names it

    from gpulayer.server.store.readonly_sql import HIDDEN_COLUMNS  # apsw, the server extra's: never shown

    if as_json and as_csv:
        raise fail("choose one of --json and --csv", 2)
    path = state or home_of(ctx, home) / STATE_FILE
    if not path.exists():
        raise fail(f"no state file at {path} (run `gpulayer server init` or `gpulayer up` first, or pass --state)", 2)
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        db = Database(conn)  # which sets a PRAGMA of its connection: the authorizer comes after
        conn.set_authorizer(lambda action, arg1, arg2, db_name, source:
                            _reads_only(action, arg1, arg2, db_name, source, hidden=HIDDEN_COLUMNS))
        query, params = _canned(query, parse_pairs(param, "--param"))
        rows = [{k: _cell(v) for k, v in r.items()} for r in db.query(query, params)]
    except ValueError as e:  # sqlite-utils: the statement returns no rows
        raise fail(f"{e} (the state file is read-only here)", 2) from None
    except sqlite3.Error as e:
        raise _refusal(e) from None
    finally:
        conn.close()
    _print(rows, "json" if as_json else "csv" if as_csv else "table")


def _canned(query: str, params: dict) -> tuple[str, dict]:
    """A canned query's name (explorer/queries.sql: `gpus_held_idle`, ...) as its SQL, with :now, :since and :until
    defaulting to now, seven days ago and now; any other query as it is."""
    from explorer.queries import CANNED, param_defaults

    if query not in CANNED:
        return query, params
    return CANNED[query].sql, {**param_defaults(time.time()), **params}


#: SQLite's result codes that say the statement itself is wrong (bad SQL, a write, a bad parameter):
#: SQLITE_ERROR, SQLITE_READONLY, SQLITE_AUTH, SQLITE_RANGE. The others (busy, I/O, corrupt) are the file's.
READ_ONLY = ("refused: the state file is opened read-only, and `gpulayer sql` runs reads "
             "(SELECT, WITH ... SELECT, read-only PRAGMAs): ")
BAD_STATEMENT = {1: "", 8: READ_ONLY, 23: READ_ONLY, 25: ""}
#: PRAGMAs that read although they take an argument; any other PRAGMA with one (journal_mode=delete) sets.
READING_PRAGMAS = frozenset({"table_info", "table_xinfo", "table_list", "index_info", "index_xinfo", "index_list",
                             "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check"})


def _reads_only(action: int, arg1, arg2, _db, _source, hidden: frozenset = frozenset()) -> int:
    """sqlite3 authorizer: deny a PRAGMA that sets something (mode=ro refuses the other writes); a hidden
    column (`hidden`: a token's hash, a secret's ciphertext) reads as NULL, as the explorer never shows it."""
    if action == sqlite3.SQLITE_PRAGMA and arg2 is not None and (arg1 or "").lower() not in READING_PRAGMAS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_READ and (arg1, arg2) in hidden:
        return sqlite3.SQLITE_IGNORE
    return sqlite3.SQLITE_OK


def _refusal(error: sqlite3.Error) -> typer.Exit:
    """The `Error:` line and exit status of a statement SQLite refused: 2 when the statement is at fault."""
    code = getattr(error, "sqlite_errorcode", None)
    if isinstance(error, sqlite3.ProgrammingError) or (code is not None and code & 0xFF in BAD_STATEMENT):
        return fail(f"{BAD_STATEMENT.get((code or 0) & 0xFF, '')}{error}", 2)
    return fail(str(error), 1)


def _cell(value: Any) -> Any:
    """A value as printed: BLOBs as hex, the rest as SQLite returned it."""
    return value.hex() if isinstance(value, bytes) else value


def _print(rows: list[dict], fmt: str) -> None:
    if fmt == "json":
        print_json(rows)
        return
    headers = list(rows[0]) if rows else []
    if fmt == "csv":
        writer = csv.writer(sys.stdout)
        if headers:
            writer.writerow(headers)
        writer.writerows([r[h] for h in headers] for r in rows)
    elif rows:
        print_table([[r[h] for h in headers] for r in rows], headers)
