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
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from gpulayer.cli.common import fail, home_of, parse_pairs, print_json, print_table

#: The state file's name in a home (gpulayer.server.config.HomeLayout.state, which the CLI may not import).
STATE_FILE = "state.db"


def sql(ctx: typer.Context,
        query: Annotated[str, typer.Argument(help="One SELECT (or WITH ... SELECT, or a read-only PRAGMA).")],
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
    """
    from sqlite_utils import Database  # the server extra: missing, cli/app.py names it

    if as_json and as_csv:
        raise fail("choose one of --json and --csv", 2)
    path = state or home_of(ctx, home) / STATE_FILE
    if not path.exists():
        raise fail(f"no state file at {path} (run `gpulayer server init` or `gpulayer up` first, or pass --state)", 2)
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        rows = [{k: _cell(v) for k, v in r.items()}
                for r in Database(conn).query(query, parse_pairs(param, "--param"))]
    except ValueError as e:  # sqlite-utils: the statement returns no rows
        raise fail(f"{e} (the state file is read-only here)", 2) from None
    except sqlite3.Error as e:
        raise fail(f"{e}", 1) from None
    finally:
        conn.close()
    _print(rows, "json" if as_json else "csv" if as_csv else "table")


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
